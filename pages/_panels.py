"""Panels of the Failures page that write or run user input: tags/notes and the SQL box; and
Replay's reading order of a state diff."""
from __future__ import annotations

import streamlit as st

from pages._common import Pick
from storage import annotations, db, queries
from storage.sql_box import (MAX_BYTES, MAX_ROWS, MEMORY_LIMIT, TIME_LIMIT_S, SqlFailed,
                             SqlRefused, SqlSyntaxError, run_query)


def trajectory_panel(pick: Pick, traj_id: str) -> None:
    """One trajectory's turns (as text), its tags and notes, and a form to add one."""
    turns = queries.turns(pick.store, pick.run_id, [traj_id])
    for t in turns.to_dict("records"):
        st.markdown(f"Turn {int(t['turn'])} · action")
        st.code(t["action"] or "", language=None, wrap_lines=True)
        if t["observation"]:
            st.markdown(f"Turn {int(t['turn'])} · observation")
            st.code(t["observation"], language=None, wrap_lines=True)
    # The form's submit arrives in the next run of the page: save only if that run shows the
    # trajectory the form was drawn for, so a tag can never land on another run or trajectory.
    target = (pick.store, pick.run_id, traj_id)
    drawn_for = st.session_state.get("_tag_target")
    st.session_state["_tag_target"] = target
    tags = queries.tags(pick.store, pick.run_id, [traj_id])
    if tags.empty:
        st.caption("No tags yet.")
    else:
        st.dataframe(tags.drop(columns="traj_id"), key="fail_tags", hide_index=True)
    with st.form("fail_tag_form", clear_on_submit=True):
        tag = st.text_input("Tag", key="fail_tag", max_chars=annotations.MAX_TAG,
                            placeholder="e.g. reading-failure")
        note = st.text_area("Note", key="fail_note", max_chars=annotations.MAX_NOTE)
        if st.form_submit_button("Save tag", key="fail_tag_save"):
            if drawn_for != target:
                st.error("Not saved: the page switched to another trajectory before the tag "
                         "arrived. Check the trajectory shown and save again.")
                return
            try:
                annotations.add_tag(pick.store, pick.run_id, traj_id, tag, note)
            except (ValueError, db.StoreError) as exc:
                st.error("The tag was not saved:")
                st.code(str(exc), language=None)
            else:
                st.success("Saved.")
                st.rerun()


def changed_first(diff):
    """A state diff in reading order: each updated row as ``changed`` (field -> {before, after},
    the fields the action changed) ahead of ``unchanged`` (field -> value). Rows inserted or
    deleted (one side missing) and entries of any other shape are kept as recorded."""
    if not isinstance(diff, list):
        return diff
    out = []
    for entry in diff:
        before, after = (entry.get("before"), entry.get("after")) if isinstance(entry, dict) \
            else (None, None)
        if not (isinstance(before, dict) and isinstance(after, dict)):
            out.append(entry)
            continue
        fields = list(dict.fromkeys([*before, *after]))
        changed = {f: {"before": before.get(f), "after": after.get(f)} for f in fields
                   if f not in before or f not in after or before[f] != after[f]}
        unchanged = {f: before[f] for f in fields if f not in changed}
        head = {k: v for k, v in entry.items() if k not in ("before", "after")}
        out.append({**head, "changed": changed, "unchanged": unchanged})
    return out


def sql_box(pick: Pick) -> None:
    """A read-only SQL console over the store's tables, with a row and a time limit."""
    st.caption(f"Read-only: one SELECT at a time, at most {MAX_ROWS} rows and "
               f"{MAX_BYTES // 2 ** 20} MB of result, {MEMORY_LIMIT} of working memory, stopped "
               f"after {TIME_LIMIT_S:g} s. Tables: runs, metrics, trajectories, rewards, turns, tokens, "
               "grad_stats, test_results, tags.")
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
