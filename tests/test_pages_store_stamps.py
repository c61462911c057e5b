"""The app's run list and run versions are read again only from stores written since (a stat of
the file and its write-ahead log), not from every store every few seconds: a click after a few
seconds of reading re-read all 12 sample stores (~1 s at load 12, bench: ``uptime`` in the
report). Real DuckDB stores written by the Recorder."""
from __future__ import annotations

import streamlit as st

from pages import _common
from storage import queries, run_queries
from storage.recorder import Recorder


def test_only_stores_written_since_are_read_again(tmp_path, monkeypatch):
    recs = {}
    for name in ("a", "b"):
        rec = Recorder(tmp_path / f"{name}.duckdb")
        rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo"}, name=name)
        rec.record_step(1, metrics={"reward/mean": 0.1})
        recs[name] = rec
    monkeypatch.setenv(queries.STORE_DIRS_ENV, str(tmp_path))
    read = []
    real = run_queries.runs                  # all_runs reads each store through it
    monkeypatch.setattr(run_queries, "runs", lambda path: read.append(path) or real(path))
    st.cache_data.clear()

    table = _common.run_table()
    assert sorted(read) == sorted(str(tmp_path / f"{n}.duckdb") for n in "ab")
    versions = {n: _common.run_version(str(tmp_path / f"{n}.duckdb"), recs[n].run_id)
                for n in "ab"}
    read.clear()
    _common.run_table.clear()          # what RUN_TTL_S seconds do
    _common.run_version.clear()
    assert _common.run_table().equals(table) and read == []
    recs["a"].record_step(2, metrics={"reward/mean": 0.2})
    _common.run_table.clear()
    _common.run_version.clear()
    table = _common.run_table()
    assert read == [str(tmp_path / "a.duckdb")]
    assert table.set_index("name").loc["a", "last_step"] == 2
    assert _common.run_version(str(tmp_path / "a.duckdb"), recs["a"].run_id) != versions["a"]
    assert _common.run_version(str(tmp_path / "b.duckdb"), recs["b"].run_id) == versions["b"]
