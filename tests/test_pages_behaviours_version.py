"""Dynamics' behaviours panel reads a rerun of ``agentrl behaviours`` at once: the run's version
(storage/queries.py ``run_version``, the key of every cached read) changes when the metric rows'
values do, not only their number. Before, a rerun that wrote as many rows with new values (here:
the trajectories' advantages corrected, so every covariance flips its sign) kept the cached rows
for an hour (``LIVE_TTL_S``). A real store written by the Recorder, the real job, the page's own
cached reads (pages/_common.py).
"""
from __future__ import annotations

import duckdb
import streamlit as st

from pages import _common
from storage import db, queries
from storage.behaviours.job import run_job
from storage.recorder import Recorder
from tests.test_behaviours import constructed_run

RUN = "flat"
COV = "behaviour/no_successful_tool_call/adv_cov"


def behaviour_rows(path) -> int:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM metrics WHERE run_id = ?", [RUN]).fetchone()[0]
    finally:
        con.close()


def panel_reads(path) -> tuple[str, float]:
    """(the run's version, step 2's covariance) as Dynamics reads them, after the few seconds
    (RUN_TTL_S) the version is cached for."""
    _common.run_version.clear()
    version = _common.run_version(str(path), RUN)
    wide = _common.load_metrics(str(path), RUN, version)
    return version, float(wide.loc[2, COV])


def test_a_rerun_with_as_many_rows_and_new_values_is_shown_at_once(tmp_path):
    path = tmp_path / "rerun.duckdb"
    constructed_run(Recorder(path), RUN, [12] * 6, paid=True)  # the shortcut paid, not spreading
    st.cache_data.clear()
    assert run_job(path, RUN)["alarms"] == []
    rows = behaviour_rows(path)
    before, cov = panel_reads(path)
    assert cov > 0 and panel_reads(path)[0] == before  # an unwritten store keeps its key

    # the advantages are corrected (the column is not in the trajectories' fingerprint) and the
    # job is run again: as many metric rows, every covariance of the opposite sign
    with db.writing(path) as con:
        con.execute("UPDATE trajectories SET advantage = -advantage WHERE run_id = ?", [RUN])
    assert run_job(path, RUN)["alarms"] == []
    assert behaviour_rows(path) == rows

    after, new_cov = panel_reads(path)
    assert after != before
    assert new_cov == -cov



def test_two_trajectories_reclassified_alike_in_one_write_change_the_version(tmp_path):
    """DuckDB's ``hash(a, b, ...)`` XORs its last column's hash into the rest, so folded over
    rows two trajectories whose failure class changed alike (a re-import rescoring them, same
    reward) cancelled out, and every page kept the old classes for an hour."""
    path = tmp_path / "rescored.duckdb"
    constructed_run(Recorder(path), RUN, [12], paid=True)
    before = queries.run_version(path, RUN)
    with db.writing(path) as con:
        pair = [t for (t,) in con.execute(
            "SELECT traj_id FROM trajectories WHERE run_id = ? AND failure_class IS NULL "
            "ORDER BY traj_id LIMIT 2", [RUN]).fetchall()]
        con.execute("UPDATE trajectories SET failure_class = 'wrong_answer' WHERE run_id = ? "
                    "AND traj_id IN (SELECT unnest(?))", [RUN, pair])
    assert len(pair) == 2
    assert queries.run_version(path, RUN) != before
