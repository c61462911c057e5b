"""Replay's views of an agent's turn and of an evaluation sample, for runs imported from agent
frameworks and evaluation logs (storage/ingest/messages.py, storage/ingest/inspect_log.py):

* a turn that called tools shows the model's words, then each call as a call -- its function's
  name and its arguments, one per row (a multi-line value, such as code, as a block of its own)
  -- from the calls the importer kept as data in ``turns.parsed``;
* an Inspect sample's own record (``trajectories.info.inspect``): each scorer's value, answer and
  explanation, the model usage, the tools offered, the limit or error that ended it.

Every text here comes from the imported file: names go through ``safe_label`` before markdown,
everything else is shown by ``st.code``, ``st.dataframe`` or ``st.json``, which render text as
text.
"""
from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from pages import _common as c
from storage.protocol import render_call


def calls_of(parsed) -> list[dict]:
    """The tool calls a turn recorded as data (``{"tool_calls": [...]}``); [] when none."""
    text = c.text_of(parsed)
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return []
    calls = data.get("tool_calls") if isinstance(data, dict) else None
    return [k for k in calls if isinstance(k, dict)] if isinstance(calls, list) else []


def words_of(action: str, calls: list[dict]) -> str | None:
    """The action's words before its calls (the importer writes the words, then each call on its
    own line); None when the action does not end with the calls as rendered (shown whole)."""
    shown = "\n".join(render_call(str(k.get("function")), k.get("arguments")) for k in calls)
    if not action.endswith(shown):
        return None
    return action[:len(action) - len(shown)].rstrip("\n")


def _value(v) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def _cell(v) -> str:
    return "" if v is None else _value(v)


def show_call(call: dict, i: int, n: int) -> None:
    """One call: its function's name, then its arguments (a table; long text as code)."""
    name = c.safe_label(call.get("function") or "?", 80)
    st.markdown(f"**Tool call{f' {i + 1} of {n}' if n > 1 else ''}** · {name}")
    args = call.get("arguments")
    if not isinstance(args, dict):  # not an object (arguments that were not valid JSON)
        st.code("(no arguments)" if args is None else _value(args), language=None,
                wrap_lines=True)
        return
    short = {k: v for k, v in args.items() if not (isinstance(v, str) and "\n" in v)}
    if short:
        st.dataframe(pd.DataFrame({"argument": [str(k) for k in short],
                                   "value": [_value(v) for v in short.values()]}),
                     hide_index=True, key=f"replay_call_{i}")
    for k, v in args.items():
        if k not in short:
            st.caption(f"{c.safe_label(k)} (text)")
            st.code(v, language=None, wrap_lines=True)
    if not args:
        st.caption("no arguments")


def show_action(t: dict) -> bool:
    """The action as words and calls; False when the turn recorded no calls as data."""
    calls = calls_of(t.get("parsed"))
    if not calls:
        return False
    action = c.readable(t["action"]) or ""
    words = words_of(action, calls)
    if words is None or words:
        st.code(action if words is None else words, language=None, wrap_lines=True)
    for i, call in enumerate(calls):
        show_call(call, i, len(calls))
    return True


def _scores(record: dict) -> pd.DataFrame:
    scores = record.get("scores") if isinstance(record.get("scores"), dict) else {}
    primary = record.get("primary_scorer")
    rows = [s if isinstance(s, dict) else {"value": s} for s in scores.values()]
    return pd.DataFrame([{"scorer": str(name) + (" (primary)" if name == primary else ""),
                          "value": _cell(s.get("value")), "answer": _cell(s.get("answer")),
                          "explanation": _cell(s.get("explanation"))}
                         for name, s in zip(scores, rows)])


def sample_panel(info) -> None:
    """An Inspect sample's record, from the trajectory's ``info.inspect``; nothing otherwise."""
    try:
        record = json.loads(c.text_of(info) or "{}").get("inspect")
    except (ValueError, AttributeError):
        return
    if not isinstance(record, dict):
        return
    with st.expander("Evaluation sample (as the Inspect log recorded it)", expanded=True):
        st.caption(" · ".join(f"{label} {c.safe_label(record.get(k), 100)}" for k, label in
                              (("sample_id", "sample"), ("epoch", "epoch"), ("log", "log"))))
        scores = _scores(record)
        if not scores.empty:
            st.dataframe(scores, hide_index=True, key="replay_scores")
        _ended(record)
        rest = {k: record.get(k) for k in ("usage", "tools", "total_time", "working_time",
                                            "metadata") if record.get(k) not in (None, {}, [])}
        if rest:
            st.caption("Usage, tools offered, times and metadata")
            st.json(rest, expanded=False)


def _ended(record: dict) -> None:
    """The limit or the error that ended the sample, if one did."""
    limit, error = record.get("limit"), record.get("error")
    if isinstance(limit, dict):
        st.warning("A limit of the evaluation cut the sample:")
        st.code(_value(limit.get("reason") or limit), language=None, wrap_lines=True)
    if error:
        st.error("The sample errored:")
        message = error.get("message") if isinstance(error, dict) else error
        st.code(_value(message), language=None, wrap_lines=True)
        if isinstance(error, dict) and c.text_of(error.get("traceback")):
            st.caption("Traceback (its last 4,000 characters)")
            st.code(error["traceback"], language=None, height=240)
