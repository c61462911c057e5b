"""Panels of the Failures page: the selected trajectory, tags/notes (also Replay's) and the SQL
box."""
from __future__ import annotations

import streamlit as st

from pages import _common as c
from pages._common import Pick
from storage import annotations, db, queries
from storage.sql_box import (MAX_BYTES, MAX_ROWS, MEMORY_LIMIT, TIME_LIMIT_S, SqlFailed,
                             SqlRefused, SqlSyntaxError, run_query)


def trajectory_panel(pick: Pick, sel: dict) -> None:
    """The trajectory selected in Failures' table, in a bordered panel under it: its outcome in
    one line, its last action, a link into Replay and the tag form side by side; every turn in a
    folded expander (drawn inline they pushed the form ~2,000 px below the table)."""
    traj_id, step = sel["traj_id"], int(sel["step"])
    turns = c.load_turns(pick.store, pick.run_id, (traj_id,))
    with st.container(border=True, key="fail_panel"):
        left, right = st.columns([3, 2])
        with left:
            st.subheader(f"Trajectory {c.safe_label(traj_id)}")
            reward = "-" if c.missing(sel["reward"]) else f"{sel['reward']:.3f}"
            outcome = "still running" if sel["failure_class"] == queries.OPEN_CLASS else \
                "solved" if c.flag(sel["success"]) else "failed"
            st.caption(f"{c.safe_label(sel['failure_class'])} · reward {reward} · {outcome} · "
                       f"{len(turns)} turns · step {step} · task {c.safe_label(sel['task_id'])}")
            if not turns.empty:
                last = turns.iloc[-1]
                st.markdown(f"Last action (turn {int(last['turn'])})")
                st.code(c.readable(last["action"]) or "", language=None, wrap_lines=True)
            c.replay_link(pick, step, traj_id, label=f"Open {traj_id} in Replay")
            with st.expander(f"All {len(turns)} turns"):
                for t in turns.to_dict("records"):
                    st.markdown(f"Turn {int(t['turn'])} · action")
                    st.code(c.readable(t["action"]) or "", language=None, wrap_lines=True)
                    if c.readable(t["observation"]):
                        st.markdown(f"Turn {int(t['turn'])} · observation")
                        st.code(c.readable(t["observation"]), language=None, wrap_lines=True)
                if any(c.readable(t[k]) != c.text_of(t[k]) for t in turns.to_dict("records")
                       for k in ("action", "observation")):
                    st.caption("Chat-template markers (`<|im_end|>`, ...) are hidden here; "
                               "Replay's token view shows every token.")
        with right:
            tag_form(pick, traj_id, "fail")


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def load_tags(store: str, run_id: str, traj_id: str):
    """One trajectory's tags; cleared by every save (the app is the only writer of tags)."""
    return queries.tags(store, run_id, [traj_id])


def tag_form(pick: Pick, traj_id: str, prefix: str) -> None:
    """A form to tag one trajectory (with a note), then its tags. ``prefix`` names the widgets
    (``fail_tag``, ``replay_tag``, ...): one form per page."""
    # The form's submit arrives in the next run of the page: save only if that run shows the
    # trajectory the form was drawn for, so a tag can never land on another run or trajectory.
    target = (pick.store, pick.run_id, traj_id)
    drawn_for = st.session_state.get(f"_{prefix}_tag_target")
    st.session_state[f"_{prefix}_tag_target"] = target
    with st.form(f"{prefix}_tag_form", clear_on_submit=True):
        tag = st.text_input("Tag", key=f"{prefix}_tag", max_chars=annotations.MAX_TAG,
                            placeholder="e.g. reading-failure")
        note = st.text_area("Note", key=f"{prefix}_note", max_chars=annotations.MAX_NOTE,
                            height=68)
        if st.form_submit_button("Save tag", key=f"{prefix}_tag_save"):
            _save_tag(pick, traj_id, tag, note, drawn_for == target)
    tags = load_tags(pick.store, pick.run_id, traj_id)      # read after a save: it shows
    if tags.empty:
        st.caption("No tags yet.")
    else:
        st.dataframe(tags.drop(columns="traj_id"), key=f"{prefix}_tags", hide_index=True)


def _save_tag(pick: Pick, traj_id: str, tag: str, note: str, drawn_here: bool) -> None:
    if not drawn_here:
        st.error("Not saved: the page switched to another trajectory before the tag "
                 "arrived. Check the trajectory shown and save again.")
        return
    try:
        annotations.add_tag(pick.store, pick.run_id, traj_id, tag, note)
    except (ValueError, db.StoreError) as exc:
        st.error("The tag was not saved:")
        st.code(str(exc), language=None)
    else:
        load_tags.clear()
        st.success("Saved.")


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def load_columns(store: str):
    """The store's tables and columns (a store's schema changes only with its version)."""
    return queries.table_columns(store)


def sql_box(pick: Pick) -> None:
    """A read-only SQL console over the store's tables, with a row and a time limit."""
    st.caption(f"Read-only: one SELECT at a time, at most {MAX_ROWS} rows and "
               f"{MAX_BYTES // 2 ** 20} MB of result, {MEMORY_LIMIT} of working memory, stopped "
               f"after {TIME_LIMIT_S:g} s.")
    try:
        schema = load_columns(pick.store)
    except db.StoreError:
        schema = None
    if schema is not None and not schema.empty:
        # as text (escaped, wrapped, copyable): a column list too long for a table cell
        with st.expander(f"Tables and their columns ({len(schema)} tables)", expanded=True):
            st.code("\n".join(f"{t}: {cols}" for t, cols in schema.itertuples(index=False)),
                    language=None, wrap_lines=True)
    run_literal = pick.run_id.replace("'", "''")
    default = (f"SELECT failure_class, count(*) AS n\nFROM trajectories\n"
               f"WHERE run_id = '{run_literal}'\nGROUP BY ALL ORDER BY n DESC")
    sql = st.text_area("SQL", value=default, key="fail_sql", height=140)
    if not st.button("Run query", key="fail_sql_run"):
        return
    try:
        result, truncated = run_query(pick.store, sql)
    except SqlSyntaxError as exc:
        st.error("Syntax error in the query:")
        st.code(str(exc), language=None)
        return
    except SqlFailed as exc:
        st.error("The query failed:")
        st.code(str(exc), language=None)
        return
    except SqlRefused as exc:
        st.error("Query refused:")
        st.code(str(exc), language=None)
        return
    except db.StoreError as exc:
        st.error("The store could not be read:")
        st.code(str(exc), language=None)
        return
    if truncated:
        st.warning(f"Showing the first {MAX_ROWS} rows only.")
    st.dataframe(result, key="fail_sql_result")
