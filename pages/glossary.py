"""Glossary: every term the pages use, with its formula, one entry per term at ``#<anchor>``
(pages/_terms.py holds the words; a page's terms link here and its hover help quotes them)."""
from __future__ import annotations

import streamlit as st

from pages import _common as c
from pages import _terms

c.ensure_app()
st.title("Glossary")
st.caption("What each word on these pages means, with the formula the code computes. Every "
           "other page links its terms here.")
for anchor, (term, definition) in _terms.TERMS.items():
    st.subheader(term, anchor=anchor)
    st.markdown(definition)
