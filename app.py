"""Streamlit entry point: page config, navigation, and the run/step picker every page shares.

Deep links: ``/PAGE?store=STORE&run=RUN_ID&step=N`` opens that run at that step on that page;
Replay also reads ``traj`` and ``turn``, Groups ``group``, Dynamics ``spike``,
Compare ``a``, ``b`` (``RUN_ID:STEP``) and ``task`` (pages/_params.py declares them all; a name
or value a page cannot show is refused with a warning, never dropped). Every page writes
what it shows back into the URL (pages/_common.py: adopt_url, publish_url), so the address bar
always holds a link to exactly the current view.

Stores are the DuckDB files under ``sample_runs/`` and ``runs/``; set ``AGENTRL_STORE_DIRS``
(directories separated by ``os.pathsep``) to show others instead.
"""
from __future__ import annotations

import re
from collections import Counter

import pandas as pd
import streamlit as st

from pages import _common as c
from pages import _params, _runlist
from storage import db, queries

st.set_page_config(page_title="Agentic-RL inspector", layout="wide")
FOLLOW_S = 5

PAGES = [
    st.Page("pages/runs.py", title="Runs", url_path="runs", default=True),
    st.Page("pages/replay.py", title="Replay", url_path="replay"),
    st.Page("pages/groups.py", title="Groups", url_path="groups"),
    st.Page("pages/dynamics.py", title="Dynamics", url_path="dynamics"),
    st.Page("pages/failures.py", title="Failures", url_path="failures"),
    st.Page("pages/compare.py", title="Compare", url_path="compare"),
    st.Page("pages/train.py", title="Train", url_path="train"),
    st.Page("pages/glossary.py", title="Glossary", url_path="glossary"),
]
# Pages that use the sidebar's step: Replay and Groups show that step, Dynamics marks it on the
# run's curves. Runs, Failures and Train show whole runs (Failures filters steps itself), so the
# picker is hidden there rather than shown doing nothing; its value is kept for the way back.
# (Comments, not a string: Streamlit's magic would draw a string on every page.)
STEP_PAGES = ("Replay", "Groups", "Dynamics")


def _short_id(run_id: str) -> str:
    """The random tail of a trainer's run id (``YYYYMMDD-HHMMSS-xxxxxx``); other ids whole."""
    m = re.fullmatch(r"\d{8}-\d{6}-(\w+)", run_id)
    return m[1] if m else run_id[:24]


def run_labels(rows: list[dict], multi_store: bool) -> dict[tuple[str, str], str]:
    """One label per (store, run_id), no two alike: name · created (UTC) · short id · status.

    The selectbox sends the chosen option's *label* back to the server, which maps it to an
    option by label (the last one wins): two runs labelled alike (the Train page once named every
    run ``demo``) were one option, and the first click on any widget switched to the other run."""
    labels = {}
    for r in rows:
        created = None if c.missing(r.get("created_at")) else pd.Timestamp(r["created_at"])
        parts = [c.text_of(r["name"]) or r["run_id"],
                 created.strftime("%Y-%m-%d %H:%M") if created is not None else None,
                 _short_id(r["run_id"]), r["shown_status"], r["store"] if multi_store else None]
        labels[(r["store"], r["run_id"])] = " · ".join(p for p in parts if p)
    seen = Counter(labels.values())
    return {key: label if seen[label] == 1 else f"{label} · {key[1]} · {key[0]}"
            for key, label in labels.items()}


def _adopt_run_from_url(options: list[tuple[str, str]]) -> None:
    """If the URL names a run it did not name on the last rerun, pick that run."""
    run, store = st.query_params.get("run"), st.query_params.get("store")
    if run is None:
        st.session_state.pop("_url_run", None)
        return
    if st.session_state.get("_url_run") == (store, run):
        return
    st.session_state["_url_run"] = (store, run)
    match = [o for o in options if o[1] == run and (store is None or o[0] == store)]
    if match:
        st.session_state["pick_run"] = match[0]
    else:   # no other run instead: the page shows none until one is picked (pages/_params.py)
        _params.flag("run", "that run is not in any store listed here" + (
            "" if store is None else " (the store named beside it does not hold it, or is not "
            "listed)"))


def _redraw_on_new_data(store: str, run_id: str, shown: str) -> None:
    """Runs every FOLLOW_S seconds while a live run is shown: new data (a step, a trajectory an
    import or the OTLP receiver wrote, one that grew) or an end -> redraw the page."""
    try:
        row = queries.runs(store).set_index("run_id").loc[run_id]
        now = queries.run_version(store, run_id)
    except (db.StoreError, KeyError):
        return
    if now != shown or row["shown_status"] != "running":
        c.run_table.clear()
        c.run_version.clear()
        st.rerun()


def run_picker(with_step: bool) -> None:
    """Sidebar: which run (of which store) every page shows, and which step (``with_step``)."""
    table = c.run_table()
    readable = table[table["run_id"].notna()] if not table.empty else table
    st.session_state["_picked_step"] = None
    if readable.empty:
        st.session_state.pop("pick_run", None)
        st.sidebar.info("No runs yet in " + ", ".join(queries.store_dirs()) + ".")
        return
    options = list(zip(readable["store"], readable["run_id"]))
    labels = run_labels(readable.to_dict("records"), readable["store"].nunique() > 1)
    _adopt_run_from_url(options)
    follow = st.session_state.pop("_follow_run", None)   # a run the Train page launched
    if follow in options:
        st.session_state["pick_run"] = follow
        _params.forget("run")
    if st.session_state.get("pick_run") not in options:
        # no link named a run: the newest worth opening (not a cross-evaluation, not empty)
        st.session_state["pick_run"] = options[_runlist.worth_opening(
            readable.reset_index(drop=True))]
    store, run_id = st.sidebar.selectbox(
        "Run", options, key="pick_run", format_func=labels.__getitem__,
        on_change=_params.forget, args=("run",),
        help="name · created (UTC) · short run id · status (· store, when there are several)")
    if _params.flagged("run"):
        return          # the link's run is refused: pages/_params.py stops the page
    c.publish_url("store", store)
    c.publish_url("run", run_id)
    st.session_state["_url_run"] = (store, run_id)

    row = readable[(readable["store"] == store) & (readable["run_id"] == run_id)].iloc[0]
    version = c.read_or_stop(c.run_version, store, run_id)
    if row["shown_status"] == "running" and st.sidebar.toggle(
            "Follow the live run", value=True, key="follow_live",
            help=f"Re-reads the run every {FOLLOW_S} s and redraws the page when new data lands."):
        st.fragment(lambda: _redraw_on_new_data(store, run_id, version), run_every=FOLLOW_S)()
    if not with_step:
        st.sidebar.caption("Stores: " + ", ".join(queries.store_dirs()))
        return
    steps = c.read_or_stop(c.load_steps, store, run_id, version)
    if not steps:
        st.sidebar.caption("This run recorded no trajectories (metrics only).")
        return
    step = c.url_select("Step", steps, key="step", param="step", default=steps[-1], cast=int,
                        container=st.sidebar, format_func=str, persist_state="session")
    st.session_state["_picked_step"] = step
    st.sidebar.caption(f"{len(steps)} steps with trajectories · stores: "
                       + ", ".join(queries.store_dirs()))


# Streamlit runs this file as __main__. A process started with multiprocessing's "spawn" from a
# process that ran the app (e.g. torchrun workers after page tests) re-imports it as __mp_main__,
# where no Streamlit runtime exists: draw nothing there.
if __name__ == "__main__":
    nav = st.navigation(PAGES)
    run_picker(with_step=nav.title in STEP_PAGES)
    _params.check(nav.url_path or "runs")
    nav.run()
