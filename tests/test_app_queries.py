"""The storage side of the app: reads (storage/queries.py), the SQL box (storage/sql_box.py) and
tags (storage/annotations.py), on the demo store of tests/app_fixtures.py."""
from __future__ import annotations

import hashlib
import io
import json
import os
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from storage import annotations, db, queries, sql_box
from tests.app_fixtures import RUN_NAMES, SCRIPT_TRAJ, SPIKE_STEP, SPIKE_TRAJ, make_demo_store


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    path = tmp_path_factory.mktemp("q") / "demo.duckdb"
    return str(path), dict(zip(RUN_NAMES, make_demo_store(path)))


@pytest.fixture
def store_copy(demo, tmp_path):
    """A private copy of the demo store for tests that write."""
    path = tmp_path / "copy.duckdb"
    path.write_bytes(Path(demo[0]).read_bytes())
    return str(path), demo[1]


def fingerprint(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# -- discovery and status --------------------------------------------------------------------------
def test_store_dirs_env_override(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.duckdb").write_bytes(b"")
    (tmp_path / "a" / "notes.txt").write_text("no")
    monkeypatch.setenv(queries.STORE_DIRS_ENV,
                       os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "missing")]))
    assert queries.store_dirs() == (str(tmp_path / "a"), str(tmp_path / "missing"))
    assert queries.discover_stores() == [str(tmp_path / "a" / "x.duckdb")]
    monkeypatch.delenv(queries.STORE_DIRS_ENV)
    assert queries.store_dirs() == queries.STORE_DIRS


def test_unreadable_store_is_reported_not_raised(tmp_path, demo):
    bad = tmp_path / "bad.duckdb"
    bad.write_text("not a database")
    table = queries.all_runs([demo[0], str(bad)])
    assert table[table["store"] == str(bad)]["status"].tolist() == ["unreadable"]
    assert len(table[table["store"] == demo[0]]) == 4
    assert bad.read_text() == "not a database"                  # never overwritten


def test_shown_status_marks_silent_running_runs_interrupted():
    now = datetime(2026, 1, 1, 12, 0, 0)
    assert queries.shown_status("running", now - timedelta(seconds=30), now) == "running"
    assert queries.shown_status("running", now - timedelta(minutes=3), now) == "interrupted"
    assert queries.shown_status("finished", now - timedelta(days=3), now) == "finished"


# -- reads -----------------------------------------------------------------------------------------
def test_trajectory_reads(demo):
    store, ids = demo
    run = ids["demo-search-starpo"]
    assert queries.steps(store, run)["step"].tolist() == list(range(2, 12))
    groups = queries.groups(store, run, 4)
    assert groups["size"].tolist() == [4, 4] and groups["filtered"].sum() == 1
    tokens = queries.tokens(store, run, SCRIPT_TRAJ)
    assert tokens["pos"].tolist() == list(range(len(tokens)))
    turns = queries.turns(store, run, [SCRIPT_TRAJ])
    # the context is the prompt followed by each turn's action and observation, token for token
    prompt = queries.trajectory(store, run, SCRIPT_TRAJ)["prompt"]
    context = prompt + "".join(a + (o or "") for a, o in zip(turns["action"], turns["observation"]))
    assert "".join(tokens["text"]) == context
    ranked = queries.top_gradient_trajectories(store, run, SPIKE_STEP)
    assert ranked["traj_id"].iloc[0] == SPIKE_TRAJ and ranked["grad_norm"].is_monotonic_decreasing
    assert queries.trajectory(store, run, "no-such-traj") is None


def test_search_is_a_literal_substring(demo):
    store, ids = demo
    run = ids["demo-search-starpo"]
    assert queries.search_trajectories(store, run, "<script>")["traj_id"].tolist() == [SCRIPT_TRAJ]
    assert queries.search_trajectories(store, run, "%").empty      # no wildcard semantics
    assert queries.search_trajectories(store, run, "'; DROP TABLE runs; --").empty
    solved = queries.search_trajectories(store, run, classes=["success"])
    assert solved["failure_class"].eq("success").all() and len(solved) > 0
    both = queries.search_trajectories(store, run, step_range=(4, 5), success=False)
    assert set(both["step"]) <= {4, 5}


def test_failure_counts_fill_missing_classes(demo):
    store, ids = demo
    counts = queries.failure_counts(store, ids["demo-apps-rloo"])
    assert set(counts["failure_class"]) <= {"success", "collateral_damage"}
    assert counts["n"].sum() == 12


def test_export_jsonl_and_parquet(demo):
    store, ids = demo
    run = ids["demo-apps-rloo"]
    traj_ids = ["a0-r0", "a1-r2"]
    lines = queries.export_trajectories(store, run, traj_ids, "jsonl").decode().splitlines()
    records = [json.loads(x) for x in lines]
    assert [r["traj_id"] for r in records] == traj_ids
    assert len(records[0]["turns"]) == 2
    assert set(records[0]["rewards"]) == {"outcome", "format", "cost", "process"}
    parquet = queries.export_trajectories(store, run, traj_ids, "parquet")
    frame = pd.read_parquet(io.BytesIO(parquet))
    assert frame["traj_id"].tolist() == traj_ids
    with pytest.raises(ValueError):
        queries.export_trajectories(store, run, traj_ids, "csv")


# -- the SQL box -----------------------------------------------------------------------------------
@pytest.mark.parametrize("sql", ["", "DELETE FROM runs", "SELECT 1; SELECT 2",
                                 "PRAGMA enable_profiling", "PRAGMA threads = 2", "CHECKPOINT",
                                 "COPY runs TO 'x.csv'", "ATTACH 'y.duckdb'", "SET threads = 1"])
def test_sql_statement_check_refuses(sql):
    with pytest.raises(sql_box.SqlRefused):
        sql_box.check_statement(sql)


def test_a_pragma_duckdb_reads_as_a_select_passes_the_check():
    """DuckDB 1.5 parses a reading PRAGMA (``PRAGMA version``) as the SELECT it stands for
    (``SELECT * FROM pragma_version()``), which a user may type anyway: allowed, as that
    SELECT is; the store is read-only and file access is off either way."""
    sql_box.check_statement("PRAGMA version")


@pytest.mark.parametrize("sql", ["DELETE FROM runs", "DROP TABLE tokens",
                                 "CREATE TABLE t AS SELECT 1",
                                 "COPY runs TO 'leak.csv'", "SELECT * FROM read_csv('private.csv')",
                                 "SET enable_external_access = true"])
def test_sql_box_is_read_only_even_without_the_statement_check(demo, monkeypatch, sql, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "private.csv").write_text("secret\n42\n")
    monkeypatch.setattr(sql_box, "check_statement", lambda sql: None)   # the first layer gone
    before = fingerprint(demo[0])
    with pytest.raises(sql_box.SqlRefused):
        sql_box.run_query(demo[0], sql)
    assert fingerprint(demo[0]) == before
    assert not (tmp_path / "leak.csv").exists()


def test_sql_box_row_and_time_limits(demo):
    rows, truncated = sql_box.run_query(demo[0], "SELECT * FROM range(5000)", max_rows=100)
    assert len(rows) == 100 and truncated
    rows, truncated = sql_box.run_query(demo[0], "SELECT count(*) AS n FROM trajectories")
    assert not truncated and int(rows["n"].iloc[0]) == 80 + 12 + 8
    with pytest.raises(sql_box.SqlRefused, match="longer than"):
        sql_box.run_query(demo[0], "SELECT count(*) FROM range(100000000000) a", timeout_s=0.3)
    # the interrupted query released the file: a writer gets it at once
    with db.writing(demo[0]) as con:
        con.execute("SELECT 1")


# -- tags ------------------------------------------------------------------------------------------
def test_add_and_remove_tag(store_copy):
    store, ids = store_copy
    run = ids["demo-search-starpo"]
    annotations.add_tag(store, run, SCRIPT_TRAJ, "xss", "model wrote a script tag")
    annotations.add_tag(store, run, SCRIPT_TRAJ, "xss", "note replaced")
    tags = queries.tags(store, run, [SCRIPT_TRAJ])
    assert tags[["tag", "note"]].values.tolist() == [["xss", "note replaced"]]
    assert annotations.remove_tag(store, run, SCRIPT_TRAJ, "xss") == 1
    assert queries.tags(store, run).empty


@pytest.mark.parametrize("tag,note,traj", [
    ("", "", SCRIPT_TRAJ), ("x" * 65, "", SCRIPT_TRAJ), ("bell\x07", "", SCRIPT_TRAJ),
    ("ok", "n" * 2001, SCRIPT_TRAJ), ("ok", "", "no-such-trajectory")])
def test_bad_tags_are_refused_and_nothing_written(store_copy, tag, note, traj):
    store, ids = store_copy
    with pytest.raises(ValueError):
        annotations.add_tag(store, ids["demo-search-starpo"], traj, tag, note)
    assert queries.tags(store, ids["demo-search-starpo"]).empty


def test_tag_never_creates_a_store(tmp_path):
    missing = tmp_path / "nope.duckdb"
    with pytest.raises(db.StoreError):
        annotations.add_tag(missing, "run", "traj", "tag")
    assert not missing.exists()
