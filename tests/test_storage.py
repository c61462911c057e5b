"""The store: migrations, refusal of files it must not touch, and recorder round trips."""
import inspect
import json

import duckdb
import numpy as np
import pandas as pd
import pytest

from storage import db, migrations, queries
from storage.migrations import MIGRATIONS, migrate, prepare
from storage.recorder import NullRecorder, Recorder

CONFIG = {"env": "search", "model": "tiny", "algo": "grpo", "group_size": 2}

CONTRACT_COLUMNS = {
    "runs": {"run_id": "VARCHAR", "name": "VARCHAR", "created_at": "TIMESTAMP",
             "status": "VARCHAR", "config": "JSON"},
    "metrics": {"run_id": "VARCHAR", "step": "INTEGER", "name": "VARCHAR", "value": "DOUBLE"},
    "trajectories": {"run_id": "VARCHAR", "step": "INTEGER", "traj_id": "VARCHAR",
                     "group_id": "VARCHAR", "task_id": "VARCHAR", "reward": "DOUBLE",
                     "advantage": "DOUBLE", "success": "BOOLEAN", "num_turns": "INTEGER",
                     "finish_reason": "VARCHAR"},
    "rewards": {"run_id": "VARCHAR", "traj_id": "VARCHAR", "component": "VARCHAR",
                "value": "DOUBLE"},
    "turns": {"run_id": "VARCHAR", "traj_id": "VARCHAR", "turn": "INTEGER", "action": "VARCHAR",
              "observation": "VARCHAR", "action_valid": "BOOLEAN"},
    "tokens": {"run_id": "VARCHAR", "traj_id": "VARCHAR", "pos": "INTEGER", "token_id": "INTEGER",
               "text": "VARCHAR", "role": "VARCHAR", "trained": "BOOLEAN", "logprob": "DOUBLE",
               "advantage": "DOUBLE"},
}


def _columns(con, table):
    return dict(con.execute("SELECT column_name, data_type FROM information_schema.columns "
                            "WHERE table_name = ?", [table]).fetchall())


def _snapshot(path):
    return path.read_bytes(), path.stat().st_mtime_ns


# -- migrations -----------------------------------------------------------------------------------
def test_migrations_in_memory_apply_once_and_hold_the_contract_tables():
    con = db.connect(None)
    assert migrate(con) == [fn.__name__ for fn in MIGRATIONS]
    assert migrate(con) == []
    rows = con.execute("SELECT version, name FROM _migrations ORDER BY version").fetchall()
    assert rows == [(i + 1, fn.__name__) for i, fn in enumerate(MIGRATIONS)]
    for table, wanted in CONTRACT_COLUMNS.items():
        have = _columns(con, table)
        for col, typ in wanted.items():
            assert have.get(col) == typ, (table, col, have.get(col))


def test_migrations_on_a_file_apply_once(tmp_path):
    path = tmp_path / "store.duckdb"
    assert prepare(path) == [fn.__name__ for fn in MIGRATIONS]
    before = _snapshot(path)
    assert prepare(path) == []
    Recorder(path)  # opening an up-to-date store writes nothing
    assert _snapshot(path) == before
    with db.reading(path) as con:
        assert con.execute("SELECT count(*) FROM _migrations").fetchone()[0] == len(MIGRATIONS)


def test_an_older_schema_is_migrated_and_keeps_its_rows(tmp_path, monkeypatch):
    path = tmp_path / "old.duckdb"
    monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS[:1])
    monkeypatch.setattr(migrations, "SCHEMA_VERSION", 1)
    rec = Recorder(path)
    run_id = rec.start_run(CONFIG)
    rec.record_step(0, metrics={"reward/mean": 0.5})
    with db.reading(path) as con:
        assert migrations.current_version(con) == 1
        assert "imports" not in {r[0] for r in con.execute("SHOW TABLES").fetchall()}
    monkeypatch.undo()

    assert prepare(path) == [fn.__name__ for fn in MIGRATIONS[1:]]
    with db.reading(path) as con:
        assert migrations.current_version(con) == len(MIGRATIONS)
        assert "imports" in {r[0] for r in con.execute("SHOW TABLES").fetchall()}
    assert queries.metrics(path, run_id).to_dict("records") == [
        {"step": 0, "name": "reward/mean", "value": 0.5}]


def test_a_newer_schema_is_refused_and_not_modified(tmp_path):
    path = tmp_path / "future.duckdb"
    prepare(path)
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO _migrations VALUES (99, 'm099_future', now()::TIMESTAMP)")
    con.close()
    before = _snapshot(path)
    with pytest.raises(db.StoreError, match="newer than this code"):
        Recorder(path)
    with pytest.raises(db.StoreError, match="schema version 99"):
        queries.runs(path)
    assert _snapshot(path) == before


def test_a_foreign_duckdb_file_is_refused_and_not_modified(tmp_path):
    path = tmp_path / "foreign.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE customers (id INTEGER, name VARCHAR)")
    con.execute("INSERT INTO customers VALUES (1, 'a')")
    con.close()
    before = _snapshot(path)
    with pytest.raises(db.StoreError, match="not a store of this project"):
        Recorder(path)
    assert _snapshot(path) == before


@pytest.mark.parametrize("content", [b"", b"not a database at all\n" * 100,
                                     bytes(range(256)) * 64])
def test_an_unreadable_file_gives_a_clear_store_error(tmp_path, content):
    path = tmp_path / "garbage.duckdb"
    path.write_bytes(content)
    before = _snapshot(path)
    with pytest.raises(db.StoreError, match="not a readable DuckDB database"):
        Recorder(path)
    with pytest.raises(db.StoreError, match="garbage.duckdb"):
        queries.runs(path)
    assert _snapshot(path) == before


def test_missing_file_and_directory_are_store_errors(tmp_path):
    with pytest.raises(db.StoreError, match="no database"):
        queries.runs(tmp_path / "absent.duckdb")
    with pytest.raises(db.StoreError, match="directory"):
        Recorder(tmp_path)


# -- recorder ------------------------------------------------------------------------------------
def _step_rows(step, n_traj=3, n_tok=5):
    ids = [f"s{step}-t{i}" for i in range(n_traj)]
    trajectories = [{"traj_id": t, "group_id": f"g{step}", "task_id": "task-1", "reward": i / 2,
                     "advantage": i - 1.0, "success": i == 2, "num_turns": 1,
                     "finish_reason": "answered", "golds": ["Paris", "paris"],
                     "info": {"retrieved": [1, 2], "note": "ok"}}
                    for i, t in enumerate(ids)]
    rewards = [{"traj_id": t, "component": c, "value": v}
               for t in ids for c, v in (("outcome", 1.0), ("format", 0.5), ("cost", 0.0),
                                         ("process", -0.25))]
    turns = [{"traj_id": t, "turn": 0, "action": "<search>x</search>", "observation": "docs",
              "action_valid": True, "action_type": "search", "parsed": {"query": "x"},
              "state_diff": [{"table": "a", "row": 1}]} for t in ids]
    tokens = pd.DataFrame({
        "traj_id": np.repeat(ids, n_tok), "pos": np.tile(np.arange(n_tok), n_traj),
        "token_id": np.arange(n_traj * n_tok), "text": [f"w{i} " for i in range(n_traj * n_tok)],
        "role": np.tile(["prompt", "action", "action", "observation", "action"], n_traj),
        "trained": np.tile([False, True, True, False, True], n_traj),
        "logprob": np.tile([np.nan, -0.5, -1.5, np.nan, -0.1], n_traj)})
    return dict(metrics={"reward/mean": 0.5, "grad/norm": 1.25}, trajectories=trajectories,
                rewards=rewards, turns=turns, tokens=tokens,
                grad_stats=[{"module": "layers.0.q_proj", "norm": 0.1}],
                test_results=[{"traj_id": ids[0], "name": "t1", "passed": True, "detail": ""}])


@pytest.mark.parametrize("where", ["file", "memory"])
def test_record_step_round_trips_every_table(tmp_path, where):
    path = tmp_path / "s.duckdb" if where == "file" else ":memory:"
    rec = Recorder(path)
    run_id = rec.start_run(CONFIG, name="round trip")
    rows = _step_rows(3)
    rec.record_step(3, **rows)

    def read(sql):
        if where == "memory":
            return rec.connection().execute(sql, [run_id]).df()
        with db.reading(path) as con:
            return con.execute(sql, [run_id]).df()

    got = read("SELECT * FROM trajectories WHERE run_id = ? ORDER BY traj_id")
    assert (got["step"] == 3).all()
    assert got["traj_id"].tolist() == [t["traj_id"] for t in rows["trajectories"]]
    assert got["reward"].tolist() == [t["reward"] for t in rows["trajectories"]]
    assert got["success"].tolist() == [False, False, True]
    assert [json.loads(g) for g in got["golds"]] == [["Paris", "paris"]] * 3
    assert json.loads(got["info"][0]) == {"retrieved": [1, 2], "note": "ok"}
    got = read("SELECT traj_id, component, value FROM rewards WHERE run_id = ? "
               "ORDER BY traj_id, component")
    assert sorted(map(tuple, got.values.tolist())) == sorted(
        (r["traj_id"], r["component"], r["value"]) for r in rows["rewards"])
    got = read("SELECT * FROM turns WHERE run_id = ? ORDER BY traj_id")
    assert json.loads(got["parsed"][0]) == {"query": "x"}
    assert json.loads(got["state_diff"][0]) == [{"table": "a", "row": 1}]
    got = read("SELECT traj_id, pos, token_id, text, role, trained, logprob FROM tokens "
               "WHERE run_id = ? ORDER BY traj_id, pos")
    want = rows["tokens"]
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    got = read("SELECT name, value FROM metrics WHERE run_id = ? ORDER BY name")
    assert dict(got.values.tolist()) == {"grad/norm": 1.25, "reward/mean": 0.5}
    assert read("SELECT count(*) n FROM grad_stats WHERE run_id = ?")["n"][0] == 1
    assert read("SELECT passed FROM test_results WHERE run_id = ?")["passed"].tolist() == [True]
    run = read("SELECT * FROM runs WHERE run_id = ?")
    assert run["last_step"][0] == 3 and run["status"][0] == "running"
    assert json.loads(run["config"][0]) == CONFIG
    if where == "file":
        assert queries.runs(path)["name"].tolist() == ["round trip"]
    rec.close()


@pytest.mark.parametrize("bad", [{"pos": "not-a-number"}, {"no_such_column": 1}])
def test_a_failing_insert_leaves_nothing_of_its_step(tmp_path, bad):
    path = tmp_path / "s.duckdb"
    rec = Recorder(path)
    run_id = rec.start_run(CONFIG)
    rec.record_step(0, **_step_rows(0))
    rows = _step_rows(1)
    rows["tokens"] = rows["tokens"].assign(**bad)  # metrics/trajectories/... go in before tokens
    with pytest.raises(duckdb.Error):
        rec.record_step(1, **rows)
    with db.reading(path) as con:
        for table in ("metrics", "trajectories", "rewards", "turns", "tokens", "grad_stats"):
            counts = dict(con.execute(f"SELECT step, count(*) FROM {table} WHERE run_id = ? "
                                      "GROUP BY step", [run_id]).fetchall())
            assert set(counts) == {0}, table
        assert con.execute("SELECT last_step FROM runs").fetchone()[0] == 0
    rec.record_step(1, **_step_rows(1))  # the store is usable afterwards
    assert queries.metrics(path, run_id)["step"].tolist() == [0, 0, 1, 1]


def test_resume_delete_steps_after_and_status(tmp_path):
    path = tmp_path / "s.duckdb"
    rec = Recorder(path)
    run_id = rec.start_run(CONFIG)
    for step in range(4):
        rec.record_step(step, **_step_rows(step))
    rec.set_status("failed", error="killed")
    rec2 = Recorder(path)
    assert rec2.resume_run(run_id) == 3
    rec2.delete_steps_after(1)
    with db.reading(path) as con:
        for table in ("metrics", "trajectories", "rewards", "turns", "tokens", "test_results"):
            assert con.execute(f"SELECT max(step) FROM {table}").fetchone()[0] == 1, table
        assert con.execute("SELECT status, error, last_step FROM runs").fetchone() == (
            "running", None, 1)
    with pytest.raises(ValueError, match="status"):
        rec2.set_status("exploded")
    rec2.finish()
    assert queries.runs(path)["status"].tolist() == ["finished"]
    with pytest.raises(db.StoreError, match="no run"):
        Recorder(path).resume_run("nope")
    with pytest.raises(ValueError, match="unknown tables"):
        rec2.record_step(5, trajectory=[])


def test_resuming_with_a_new_configuration_stores_it_and_what_changed(tmp_path):
    """--resume RUN --steps 20 trains on with 20 steps: the app must show 20, and keep 10."""
    path = tmp_path / "s.duckdb"
    rec = Recorder(path)
    run_id = rec.start_run({**CONFIG, "steps": 10, "sft_steps": 100})
    for step in range(3):
        rec.record_step(step, **_step_rows(step))
    Recorder(path).resume_run(run_id, config={**CONFIG, "steps": 20, "sft_steps": 100})
    Recorder(path).resume_run(run_id, config={**CONFIG, "steps": 20, "sft_steps": 60})
    cfg = queries.run_config(queries.runs(path)["config"].iloc[0])
    assert cfg["steps"] == 20 and cfg["sft_steps"] == 60
    assert cfg["resumed"] == [{"after_step": 2, "changed": {"steps": [10, 20]}},
                              {"after_step": 2, "changed": {"sft_steps": [100, 60]}}]
    Recorder(path).resume_run(run_id)  # no configuration given: the stored one stays
    assert queries.run_config(queries.runs(path)["config"].iloc[0]) == cfg


def test_null_recorder_has_the_recorder_signatures():
    public = [n for n, f in inspect.getmembers(Recorder, inspect.isfunction)
              if not n.startswith("_") and n != "connection"]
    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    for name in public:
        assert params(getattr(NullRecorder, name)) == params(getattr(Recorder, name)), name
    null = NullRecorder()
    assert null.start_run(CONFIG) == "null"
    null.record_step(0, **_step_rows(0))
    null.finish()
