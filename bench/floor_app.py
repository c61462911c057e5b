"""The floor of a page load (bench/pages.py --walkthrough --floor): a Streamlit app that draws
only its title, served and timed as the product's pages are. What a deep link to any page costs
before the page draws anything of its own."""
import streamlit as st

st.title("Floor")
