"""Failures' filters (failure class, split, outcome, steps, search text): their state across
visits and in the URL, and the export of everything they match.

A filtered view is a link: each filter that differs from its default is a URL parameter
(``classes``, ``splits`` and ``tags`` repeated, ``outcome``, ``steps`` as ``A-B``, ``q``), adopted
when it comes from outside (a pasted link) and written back when a widget changes; a value the run
cannot show is refused, never dropped (pages/_params.py). Branch continuations
(split ``branch``: the resampled and kept rollouts of a branch job, tens per analysed turn) are
left out by default, as solved trajectories are from the class filter.

Streamlit drops a widget's state when a run of another page does not draw it, so a visit to
Replay reset the filters: a copy per run is kept and restored when the widgets come back without
state (Back from Replay) or another run is picked.
"""
from __future__ import annotations

import re
from collections.abc import Callable

import streamlit as st

from pages import _params
from pages._common import Pick
from storage import queries

OUTCOMES = {"any": None, "solved": True, "failed": False}
PARAMS = {"fail_classes": "classes", "fail_splits": "splits", "fail_outcome": "outcome",
          "fail_steps": "steps", "fail_search": "q", "fail_tags": "tags"}
"""Widget key -> URL parameter."""
HIDDEN_SPLITS = ("branch",)
"""Splits left out unless picked: branch continuations are a job's samples, not the run's."""


def defaults(classes: list[str], splits: list[str], lo: int, hi: int) -> dict:
    """Each filter's value when nothing picked it: every class but ``success``, every split but
    branch continuations, any outcome, every step, no tag, no text."""
    view = {"fail_classes": [k for k in classes if k != "success"],
            "fail_splits": [s for s in splits if s not in HIDDEN_SPLITS] or list(splits),
            "fail_outcome": "any", "fail_search": "", "fail_tags": []}
    return view | ({"fail_steps": (lo, hi)} if hi > lo else {})


def _encode(key: str, value) -> list[str] | str:
    if key in ("fail_classes", "fail_splits", "fail_tags"):
        return list(value) or [""]          # an empty pick (every class) still differs
    if key == "fail_steps":
        return f"{int(value[0])}-{int(value[1])}"
    return str(value)


def _decode(key: str, raw: list[str], allowed: dict, lo: int, hi: int):
    """A URL value for widget ``key`` (pages/_params.py parses it). A value the run cannot show
    (a class or tag it never recorded, a malformed step range) flags the parameter: the page
    then shows no trajectory rather than drop the filter and show more."""
    param = PARAMS[key]
    value, why = _params.parse(_params.PAGES["failures"][param], raw, allowed.get(key))
    if why:             # the widgets keep their state: removing the parameter gives it back
        _params.flag(param, why)
        return None
    if value is None:
        return None
    if key == "fail_steps":
        a, b = value
        if b < lo or a > hi:    # no step of the run: nothing, never another range
            _params.flag(param, f"this run recorded steps {lo}-{hi} only"
                         if hi > lo else f"this run recorded step {lo} only")
            return None
        if (a, b) != (max(a, lo), min(b, hi)):
            st.session_state["_fail_steps_cut"] = ((a, b), (max(a, lo), min(b, hi)))
        return (max(a, lo), min(b, hi))
    return value[:200] if key == "fail_search" else value


def restore(pick: Pick, classes: list[str], splits: list[str], lo: int, hi: int,
            tags: list[str] = ()) -> dict:
    """Before the filter widgets are drawn: their state from a link that came from outside, else
    this session's copy for the run, else the defaults. Returns the defaults."""
    view = defaults(classes, splits, lo, hi)
    allowed = {"fail_classes": classes, "fail_splits": splits, "fail_outcome": list(OUTCOMES),
               "fail_tags": list(tags)}
    here = (pick.store, pick.run_id)
    kept = st.session_state.setdefault("_fail_kept", {}).get(here, {})
    if st.session_state.get("_fail_view_of") != here or any(k not in st.session_state
                                                            for k in view):
        st.session_state.update({k: kept.get(k, default) for k, default in view.items()})
    st.session_state["_fail_view_of"] = here
    # A filter still at its default follows the default as the run grows (a live run's new
    # class, its new steps): kept at the old one, it would leave them out without a word.
    before = st.session_state.setdefault("_fail_defaults", {}).get(here, {})
    for key, default in view.items():
        if key in before and _same(key, st.session_state.get(key)) == _same(key, before[key]):
            st.session_state[key] = default
    st.session_state["_fail_defaults"][here] = view
    seen = st.session_state.setdefault("_url_seen", {})
    for key, param in PARAMS.items():
        raw = st.query_params.get_all(param)
        if key not in view:     # a run of one step draws no step slider: the range is checked
            if raw and seen.get(param) != raw:
                seen[param] = raw
                _decode(key, raw, allowed, lo, hi)
            continue
        if not raw:
            seen.pop(param, None)
            continue
        if seen.get(param) == raw:
            continue                        # this session wrote it: the widget's state rules
        seen[param] = raw
        value = _decode(key, raw, allowed, lo, hi)
        if value is not None:
            st.session_state[key] = value
    # values kept from an earlier visit may name classes or steps this run no longer has
    st.session_state["fail_classes"] = [k for k in st.session_state["fail_classes"]
                                        if k in classes]
    st.session_state["fail_splits"] = [k for k in st.session_state["fail_splits"] if k in splits]
    st.session_state["fail_tags"] = [k for k in st.session_state["fail_tags"] if k in tags]
    if st.session_state.get("fail_outcome") not in OUTCOMES:
        st.session_state["fail_outcome"] = "any"
    if hi > lo:
        a, b = st.session_state["fail_steps"]
        st.session_state["fail_steps"] = (max(lo, min(a, hi)), min(hi, max(b, lo)))
    return view


def publish(pick: Pick, view: dict) -> dict:
    """After the widgets: every filter that differs from its default into the URL (the others
    out of it), and this session's copy for the run updated. Returns the copy."""
    here = (pick.store, pick.run_id)
    seen = st.session_state.setdefault("_url_seen", {})
    for key, param in PARAMS.items():
        if _params.flagged(param):
            continue        # refused: the address keeps what the user typed
        value = st.session_state.get(key)
        differs = key in view and _same(key, value) != _same(key, view[key])
        if not differs:
            if param in st.query_params:
                del st.query_params[param]
            seen.pop(param, None)
            continue
        raw = _encode(key, value)
        listed = raw if isinstance(raw, list) else [raw]
        if st.query_params.get_all(param) != listed:   # only a change is written
            st.query_params[param] = raw
        seen[param] = listed
    kept = st.session_state["_fail_kept"].setdefault(here, {})
    kept.update({k: st.session_state[k] for k in view})
    return kept


def _same(key: str, value):
    """A filter value in a form that compares equal when it means the same."""
    if key in ("fail_classes", "fail_splits", "fail_tags"):
        return tuple(sorted(value or ()))
    if key == "fail_steps":
        return tuple(int(v) for v in value) if value else None
    return value


def current(view: dict, lo: int, hi: int) -> dict:
    """The search's arguments for the filters as set now."""
    return {"text": str(st.session_state.get("fail_search") or "").strip(),
            "classes": tuple(st.session_state.get("fail_classes") or ()) or None,
            "step_range": tuple(int(x) for x in st.session_state["fail_steps"])
            if "fail_steps" in view else (lo, hi),
            "splits": tuple(st.session_state.get("fail_splits") or ()) or None,
            "success": OUTCOMES[st.session_state.get("fail_outcome", "any")],
            "tags": tuple(st.session_state.get("fail_tags") or ()) or None}


def notes(matching: dict, total: int, lo: int, hi: int, solved: Callable[[], int],
          classes_shown: bool = True) -> None:
    """What the list holds when a filter says less than it seems: a step range cut to the run's
    steps, an emptied class or split filter (every class or split, then), and an outcome the
    class filter can never let through (named, with the filter that excludes it). ``solved``:
    how many of the matches are solved, asked only for an emptied class filter."""
    cut = st.session_state.get("_fail_steps_cut")
    if cut and tuple(st.session_state.get("fail_steps") or ()) == cut[1]:
        st.warning(f"The address asked for steps {cut[0][0]}-{cut[0][1]}; this run recorded "
                   f"steps {lo}-{hi}, so the list holds steps {cut[1][0]}-{cut[1][1]}.")
    else:
        st.session_state.pop("_fail_steps_cut", None)
    classes = set(matching["classes"] or ())
    if not classes and classes_shown:
        n = solved()
        st.info(f"No failure class picked: the list holds every class, the {n} solved "
                "trajectories (class success) included, and so does the export. Pick classes "
                "to narrow it.")
    if not matching["splits"]:
        st.info("No split picked: the list holds every split, branch continuations included.")
    if total:
        return
    outcome = st.session_state.get("fail_outcome")
    if not classes_shown:
        return
    if outcome == "solved" and classes and "success" not in classes:
        st.warning("Outcome **solved** lists solved trajectories, whose class is success, and "
                   "the **Failure class** filter leaves success out: nothing can match. Add "
                   "success to Failure class, or set Outcome to any.")
    elif outcome == "failed" and classes == {"success"}:
        st.warning("Outcome **failed** lists failed trajectories, and the **Failure class** "
                   "filter holds only success: nothing can match. Pick failure classes, or set "
                   "Outcome to any.")


def export_buttons(pick: Pick, matching: dict, total: int) -> None:
    """JSONL and Parquet downloads of every trajectory the filters match (all ``total`` of them,
    not only the rows the table shows). The filters are bound when the buttons are drawn, so the
    file holds the matches the page showed next to the button."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", pick.run_id)
    store, run_id, frozen = pick.store, pick.run_id, dict(matching)

    def data(fmt: str):
        def build() -> bytes:
            found = queries.search_trajectories(store, run_id, limit=None, **frozen)
            return queries.export_trajectories(store, run_id, found["traj_id"].tolist(), fmt)
        return build

    d1, d2, d3 = st.columns(3)
    for box, fmt, mime in ((d1, "jsonl", "application/jsonl"),
                           (d2, "parquet", "application/vnd.apache.parquet")):
        box.download_button(f"Export matches as {fmt.upper() if fmt == 'jsonl' else 'Parquet'}",
                            key=f"fail_export_{fmt}", disabled=not total, mime=mime,
                            file_name=f"{stem}-trajectories.{fmt}", data=data(fmt),
                            help=f"All {total} trajectories the filters match, with their turns "
                                 "and reward components.")
    d3.download_button("Export messages (SFT)", key="fail_export_messages",
                       disabled=not total, mime="application/jsonl",
                       file_name=f"{stem}-sft-messages.jsonl", data=data("messages"),
                       help=f"All {total} trajectories the filters match as a chat dataset with "
                            "tool calls, one conversation per line, that TRL's SFTTrainer loads "
                            "as it is: filter to the good ones (Outcome: success, a tag), "
                            "download, train on them.")
