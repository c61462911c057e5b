"""The SQL box's memory and result-size bounds (the app's server must not grow with a user's
query), and the box on a partitioned-Parquet store (its views read files)."""
from __future__ import annotations

import threading

import psutil
import pytest

from storage import sql_box
from storage.export import export_partitioned
from storage.recorder import Recorder

SERVER_GROWTH_LIMIT = 200 * 2 ** 20
"""What the calling process (the app's server) may grow by while the box runs a query."""


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """(DuckDB store, partitioned-Parquet export of it, run id)."""
    base = tmp_path_factory.mktemp("sqlbox")
    src = base / "store.duckdb"
    rec = Recorder(src)
    run_id = rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo"}, name="r")
    rec.record_step(1, metrics={"reward/mean": 0.5}, trajectories=[
        dict(traj_id=f"t{i}", group_id="g", task_id="q", reward=float(i), success=i > 0,
             num_turns=1, finish_reason="answered", prompt="p") for i in range(3)])
    rec.finish("finished")
    export_partitioned(src, base / "parts")
    return str(src), str(base / "parts"), run_id


def _peak_growth(fn):
    """(fn's result or exception, peak RSS growth of this process while fn ran)."""
    me = psutil.Process()
    before, peak, done = me.memory_info().rss, [0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], me.memory_info().rss)
            done.wait(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        try:
            outcome = fn()
        except Exception as exc:  # noqa: BLE001 -- returned for the test to check
            outcome = exc
    finally:
        done.set()
        watcher.join()
    return outcome, max(peak[0], me.memory_info().rss) - before


def test_a_thousand_rows_of_a_megabyte_are_refused_and_the_server_stays_small(stores):
    # 30 s, as below: on a loaded machine the default 5 s fired before the size cap it tests
    outcome, growth = _peak_growth(lambda: sql_box.run_query(
        stores[0], "SELECT repeat('x', 1000000) AS big FROM range(1000)", timeout_s=30))
    assert isinstance(outcome, sql_box.SqlRefused), outcome
    assert "memory" in str(outcome) or "larger than" in str(outcome)
    assert growth < SERVER_GROWTH_LIMIT, growth


def test_a_result_over_the_byte_cap_is_refused_with_the_limit_named(stores):
    with pytest.raises(sql_box.SqlRefused, match="larger than 16 MB"):
        sql_box.run_query(stores[0], "SELECT repeat('x', 100000) AS s FROM range(1000)")
    # under the cap, a wide result still comes back whole
    rows, truncated = sql_box.run_query(stores[0], "SELECT repeat('x', 1000) AS s FROM range(500)")
    assert len(rows) == 500 and not truncated and rows["s"].str.len().eq(1000).all()


def test_a_string_agg_past_the_memory_limit_is_refused_not_run_out_of_memory(stores):
    sql = "SELECT length(string_agg(repeat('x', 100), ',')) AS n FROM range(10000000)"
    outcome, growth = _peak_growth(lambda: sql_box.run_query(stores[0], sql, timeout_s=30))
    assert isinstance(outcome, sql_box.SqlRefused), outcome
    assert "more memory than the SQL box allows" in str(outcome)
    assert growth < SERVER_GROWTH_LIMIT, growth


def test_the_box_works_on_a_partitioned_parquet_store(stores, tmp_path, monkeypatch):
    _, parts, run_id = stores
    rows, truncated = sql_box.run_query(
        parts, f"SELECT count(*) AS n, sum(reward) AS r FROM trajectories WHERE run_id = '{run_id}'")
    assert (int(rows["n"].iloc[0]), float(rows["r"].iloc[0]), truncated) == (3, 3.0, False)
    rows, _ = sql_box.run_query(parts, "SELECT name FROM runs")
    assert rows["name"].tolist() == ["r"]
    # its own directory is readable; no other file is
    monkeypatch.chdir(tmp_path)
    (tmp_path / "private.csv").write_text("secret\n42\n")
    with pytest.raises(sql_box.SqlRefused):
        sql_box.run_query(parts, f"SELECT * FROM read_csv('{tmp_path / 'private.csv'}')")
