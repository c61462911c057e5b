"""Import (generic JSONL, verl, TRL) and export (JSONL, Parquet, partitioned Parquet)."""
import json
import math
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import db, ingest, io, queries

from storage.ingest import import_batch
from storage.export import Filters, export_jsonl, export_partitioned, export_parquet
from storage.interchange import LineError, parse_json, pieces, validate
from storage.recorder import Recorder

FIXTURES = Path(__file__).parent / "fixtures"
GENERIC = FIXTURES / "generic.jsonl"
GOOD_IDS = {"a1", "a2", "b1", "b2"}
EXPECTED_ERRORS = {  # line -> words its message must contain
    3: "not valid JSON", 4: "must be a JSON object", 6: "missing field 'reward'",
    7: "turns[0].action' must be a string", 9: "NaN is not a JSON number",
    10: "duplicate traj_id 'a1' (first at line 1)", 11: "tokens[0].role' must be one of",
    12: "field 'reward' must be a number, got bool", 13: "must be between 0 and 2^31-1",
    14: "longer than the limit of 4096 bytes", 15: "not UTF-8",
    16: "field 'tokens[0].train_logprob' must be a log-probability (finite and <= 0), got NaN",
}
TRAJ_TABLES = ("trajectories", "rewards", "turns", "tokens")


def _counts(path, run_id):
    with db.reading(path) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [run_id]).fetchone()[0]
                for t in TRAJ_TABLES}


def _rows(path, sql, params=()):
    with db.reading(path) as con:
        return con.execute(sql, list(params)).df()


def _import(tmp_path, *extra, source=GENERIC):
    store = tmp_path / "store.duckdb"
    code = io.main(["import", str(source), "--db", str(store), "--max-line-bytes", "4096", *extra])
    return store, code


# -- generic JSONL ----------------------------------------------------------------------------
def test_bad_lines_are_reported_by_number_and_good_lines_import(tmp_path, capsys):
    store, code = _import(tmp_path)
    out, err = capsys.readouterr()
    assert code == 1
    for line, words in EXPECTED_ERRORS.items():
        assert f"error: line {line}: " in err and words in err, (line, words, err)
    assert len(err.strip().splitlines()) == len(EXPECTED_ERRORS)
    assert "16 records read, 4 imported, 0 already present (skipped), 0 replaced, 12 failed" in out
    run_id = ingest.default_run_id(GENERIC)
    traj = _rows(store, "SELECT * FROM trajectories WHERE run_id = ?", [run_id])
    assert set(traj["traj_id"]) == GOOD_IDS
    with db.reading(store) as con:  # nothing of any bad line anywhere, every good one whole
        for table in TRAJ_TABLES:
            ids = {r[0] for r in con.execute(f"SELECT DISTINCT traj_id FROM {table}").fetchall()}
            assert ids == GOOD_IDS, table
        turns = dict(con.execute("SELECT traj_id, count(*) FROM turns GROUP BY ALL").fetchall())
        assert turns == dict(zip(traj["traj_id"], traj["num_turns"]))
        row = con.execute("SELECT lines, imported, failed, errors FROM imports").fetchone()
        assert row[:3] == (16, 4, 12) and "line 3" in row[3]


def test_rerunning_an_import_adds_nothing_and_replace_rewrites(tmp_path, capsys):
    store, _ = _import(tmp_path)
    run_id = ingest.default_run_id(GENERIC)
    before = _counts(store, run_id)
    _, code = _import(tmp_path)
    assert code == 1 and "0 imported, 4 already present (skipped)" in capsys.readouterr().out
    assert _counts(store, run_id) == before
    _import(tmp_path, "--replace")
    assert "0 imported, 0 already present (skipped), 4 replaced" in capsys.readouterr().out
    assert _counts(store, run_id) == before
    assert len(queries.runs(store)) == 1


def test_reward_components_and_rebuilt_tokens(tmp_path):
    store, _ = _import(tmp_path)
    rewards = _rows(store, "SELECT traj_id, component, value FROM rewards")
    comps = {t: dict(zip(g["component"], g["value"])) for t, g in rewards.groupby("traj_id")}
    assert comps["a1"] == {"outcome": 1.0, "format": 0.2, "cost": 0.0, "process": 0.0}
    assert comps["a2"] == {"outcome": 0.0, "retrieval": 0.5, "format": 0.0, "cost": 0.0,
                           "process": 0.0}
    assert comps["b1"] == {"outcome": 1.0, "format": 0.0, "cost": 0.0, "process": 0.0}
    info = {r.traj_id: json.loads(r.info) for r in _rows(store, "SELECT traj_id, info FROM "
                                                                "trajectories").itertuples()}
    assert any("format, cost, process" in n for n in info["a2"]["import_notes"])
    assert any("outcome = reward" in n for n in info["b1"]["import_notes"])
    assert info["b2"]["extra"] == {"my_field": {"x": 1}}
    toks = _rows(store, "SELECT * FROM tokens WHERE traj_id = 'a1' ORDER BY pos")
    line = json.loads(GENERIC.read_text(encoding="utf-8", errors="replace").splitlines()[0])
    context = line["prompt"] + "".join(t["action"] + t["observation"] for t in line["turns"])
    assert "".join(toks["text"]) == context
    assert (toks["trained"] == (toks["role"] == "action")).all()
    assert toks["logprob"].isna().all() and toks["token_id"].isna().all()
    assert set(toks.loc[toks["trained"], "advantage"]) == {0.7}
    with db.reading(store) as con:
        given_toks = con.execute("SELECT text, role, trained, logprob, token_id FROM tokens "
                                 "WHERE traj_id = 'b1' ORDER BY pos").fetchall()
    assert given_toks == [("2+2?", "prompt", False, None, None), ("4", "action", True, -0.05, 19)]


def test_imported_run_has_its_config_and_derived_metrics(tmp_path):
    store, _ = _import(tmp_path, "--run-name", "my agent")
    run = queries.runs(store).iloc[0]
    assert run["name"] == "my agent" and run["status"] == "finished" and run["last_step"] == 1
    assert json.loads(run["config"]) == {"env": "search", "model": "my-agent-7b", "algo": "grpo",
                                         "group_size": 2}
    m = queries.metrics(store, run["run_id"])
    got = {(r.step, r.name): r.value for r in m.itertuples()}
    assert got[(0, "reward/mean")] == pytest.approx(0.6)
    assert got[(0, "reward/group_std_mean")] == pytest.approx(math.sqrt(0.72))
    assert got[(0, "reward/frac_zero_std")] == 0.0
    assert got[(0, "success/rate")] == 0.5
    assert got[(1, "eval/success")] == 0.0  # b2 is an eval trajectory


def test_run_ids_are_checked_against_path_traversal(tmp_path, capsys):
    store, code = _import(tmp_path, "--run-id", "../../escape")
    assert code == 2 and "run id '../../escape'" in capsys.readouterr().err
    store, code = _import(tmp_path, "--run-id", "mine", "--run-name", "../../etc/passwd")
    assert queries.runs(store)["name"].tolist() == ["../../etc/passwd"]  # a name is only shown
    out = tmp_path / "parts"
    assert io.main(["export", "--db", str(store), "--out", str(out), "--partitioned"]) == 0
    created = {p.relative_to(tmp_path).parts[0] for p in tmp_path.rglob("*")}
    assert created <= {"store.duckdb", "store.duckdb.lock", "store.duckdb.turn", "parts"}
    assert io.main(["export", "--db", str(store), "--run", "../x", "--out",
                    str(tmp_path / "x.jsonl")]) == 2
    with pytest.raises(ValueError, match="run id"):
        Recorder(tmp_path / "other.duckdb").start_run({}, run_id="a/../../b")


def test_a_trajectory_that_fails_to_store_is_reported_and_leaves_nothing(tmp_path):
    store = tmp_path / "s.duckdb"
    Recorder(store)
    recs = [ingest.to_rows(validate({"traj_id": f"t{i}", "task_id": "q", "turns": [{"action": "a"}],
                                 "reward": 1.0})) for i in range(3)]
    recs[1]["tokens"].fixed["trained"] = "maybe"  # past validation: the database refuses it
    report = ingest.ImportReport("r", "f", "jsonl")
    run = {"name": "r", "config": None, "created": False}
    import_batch.write_batch(store, "r", "jsonl", run,
                             [(f"line {i + 1}", r) for i, r in enumerate(recs)], False, report)
    assert report.imported == 2 and report.failed == 1 and report.errors[0].startswith("line 2:")
    for table in TRAJ_TABLES:
        assert set(_rows(store, f"SELECT traj_id FROM {table}")["traj_id"]) == {"t0", "t2"}


# -- unit tests and state diffs (stateful envs) ---------------------------------------------------
def _apps_episodes():
    """Two real apps episodes, each as (generic record, the trainer's Trajectory of it): the
    expert's plan with one unread mail archived as well (collateral damage), and with one
    required archive left out (an unmet state test)."""
    from core.envs.apps.env import tool_text
    from core.envs.base import make_env
    from core.rollout.trajectory import Trajectory, Turn
    env = make_env("apps", templates="archive_read_newsletters")
    task = env.tasks("train", 1, 0)[0]
    p = task.meta["params"]
    search = tool_text("email.search_emails", {"sender": p["sender"], "folder": "inbox"})
    archive = [tool_text("email.archive_email", {"email_id": k}) for k in p["targets"]]
    plans = {"too-much": [search, *archive, tool_text("email.archive_email",
                                                      {"email_id": p["keep"][0]})],
             "too-little": [search, *archive[1:]]}
    out = []
    for name, actions in plans.items():
        episode = env.episode(task, 0)
        episode.reset()
        traj = Trajectory(traj_id=name, group_id="g", task=task, finish_reason="answered")
        rec = {"traj_id": name, "task_id": task.task_id, "prompt": task.prompt, "turns": []}
        for i, action in enumerate(actions + ["<answer>done</answer>"]):
            r = episode.step(action)
            traj.turns.append(Turn(i, action, r.observation, r.valid, r.action_type, r.parsed,
                                   r.error, r.state_diff))
            rec["turns"].append({"action": action, "observation": r.observation,
                                 "action_valid": r.valid, "action_type": r.action_type,
                                 "parsed": r.parsed, "error": r.error, "state_diff": r.state_diff})
        traj.outcome = outcome = episode.outcome()
        rec.update(reward=outcome.score, success=outcome.success, finish_reason="answered",
                   answer=outcome.answer, info=outcome.info,
                   tests=[{"name": n, "passed": ok, "detail": d} for n, ok, d in outcome.tests])
        out.append((rec, traj))
    return out


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_unit_tests_and_state_diffs_import_and_classify_as_the_trainer_does(tmp_path):
    from core.credit.scoring import classify_trajectory
    episodes = _apps_episodes()
    source = _write_jsonl(tmp_path / "apps.jsonl", [rec for rec, _ in episodes])
    store = tmp_path / "s.duckdb"
    assert ingest.import_file(source, store, run_id="apps").imported == 2
    classes = dict(_rows(store, "SELECT traj_id, failure_class FROM trajectories").values)
    assert classes == {traj.traj_id: classify_trajectory(traj) for _, traj in episodes}
    assert classes == {"too-much": "collateral_damage", "too-little": "unmet_state_test"}
    for rec, traj in episodes:
        tests = queries.test_results(store, "apps", [rec["traj_id"]])
        assert sorted(zip(tests["name"], tests["passed"], tests["detail"])) == \
            sorted(traj.outcome.tests)
        turns = queries.turns(store, "apps", [rec["traj_id"]])
        stored = [json.loads(d) if isinstance(d, str) else None for d in turns["state_diff"]]
        assert stored == [t.state_diff for t in traj.turns]
    failed = queries.test_results(store, "apps", ["too-much"]).set_index("name")
    assert not failed.loc["no_collateral_damage", "passed"]
    keep = episodes[0][0]["turns"][-2]["parsed"]["arguments"]["email_id"]
    assert f"update emails#{keep}" in failed.loc["no_collateral_damage", "detail"]


def test_bad_tests_are_reported_by_line_and_leave_nothing(tmp_path, capsys):
    good = {"traj_id": "ok", "task_id": "q", "turns": [{"action": "a"}], "reward": 0.5,
            "finish_reason": "answered", "answer": "done",
            "tests": [{"name": "t1", "passed": True}, {"name": "t2", "passed": False,
                                                        "detail": "why"}]}
    bad = [dict(good, traj_id="b1", tests={"t1": True}),
           dict(good, traj_id="b2", tests=[{"name": "t1", "passed": "yes"}]),
           dict(good, traj_id="b3", tests=[{"passed": True}]),
           dict(good, traj_id="b4", turns=[{"action": "a", "state_diff": float("nan")}])]
    source = tmp_path / "t.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in [good, *bad]), encoding="utf-8")
    store, code = _import(tmp_path, source=source)
    err = capsys.readouterr().err
    assert code == 1
    for line, words in {2: "field 'tests' must be a list, got dict",
                        3: "field 'tests[0].passed' must be true/false, got str",
                        4: "missing field 'tests[0].name'",
                        5: "NaN is not a JSON number"}.items():
        assert f"error: line {line}: {words}" in err, (line, err)
    with db.reading(store) as con:
        tests = con.execute("SELECT traj_id, name, passed, detail FROM test_results").fetchall()
    assert tests == [("ok", "t1", True, None), ("ok", "t2", False, "why")]
    assert _rows(store, "SELECT failure_class FROM trajectories")["failure_class"].tolist() == \
        ["unmet_state_test"]


def test_an_import_beside_a_trainer_run_leaves_it_alone_and_reruns_add_nothing(tmp_path, capsys):
    store = tmp_path / "s.duckdb"
    trained = _trainer_run(store)
    tables = (*TRAJ_TABLES, "test_results", "metrics", "runs")
    before = {t: _rows(store, f"SELECT * FROM {t} WHERE run_id = ? ORDER BY ALL", [trained])
              for t in tables}
    source = _write_jsonl(tmp_path / "apps.jsonl", [rec for rec, _ in _apps_episodes()])
    args = ["import", str(source), "--db", str(store), "--run-id", "agent"]
    assert io.main(args) == 0
    count = "SELECT count(*) n FROM test_results WHERE run_id = 'agent'"
    n_tests = _rows(store, count)["n"][0]
    assert n_tests == sum(len(rec["tests"]) for rec, _ in _apps_episodes())
    assert io.main(args) == 0 and io.main(args + ["--replace"]) == 0
    assert "2 replaced" in capsys.readouterr().out
    assert _rows(store, count)["n"][0] == n_tests
    for t in tables:
        pd.testing.assert_frame_equal(
            _rows(store, f"SELECT * FROM {t} WHERE run_id = ? ORDER BY ALL", [trained]),
            before[t], obj=t)
    assert sorted(queries.runs(store)["run_id"]) == sorted(["agent", trained])


def test_unit_tests_round_trip_through_export(tmp_path):
    records = [rec for rec, _ in _apps_episodes()]
    source = _write_jsonl(tmp_path / "apps.jsonl", records)
    ingest.import_file(source, tmp_path / "a.duckdb", run_id="a")
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    export_jsonl(tmp_path / "a.duckdb", "a", first)
    ingest.import_file(first, tmp_path / "b.duckdb", run_id="b")
    export_jsonl(tmp_path / "b.duckdb", "b", second)
    assert first.read_text() == second.read_text()
    exported = {r["traj_id"]: r for r in map(json.loads, first.read_text().splitlines())}
    for rec in records:
        assert exported[rec["traj_id"]]["tests"] == rec["tests"]  # in the env's order
        assert [t.get("state_diff") for t in exported[rec["traj_id"]]["turns"]] == \
            [t["state_diff"] for t in rec["turns"]]


# -- export ---------------------------------------------------------------------------------------
def _trainer_run(path):
    """A run as the trainer records it: real token rows with logprobs, turns, four components."""
    rec = Recorder(path)
    run_id = rec.start_run({"env": "search", "model": "tiny", "algo": "grpo"}, name="trained")
    for step in range(3):
        trajs, rewards, turns, tokens = [], [], [], []
        for i in range(4):
            tid = f"{step}-{i}"
            ok = (i + step) % 2 == 0
            trajs.append({"traj_id": tid, "group_id": f"{step}-g", "task_id": "q1", "reward": float(ok),
                          "advantage": 1.0 if ok else -1.0, "success": ok, "num_turns": 1,
                          "finish_reason": "answered", "split": "eval" if i == 3 else "train",
                          "prompt": "Q?", "answer": "A" if ok else "B", "golds": ["A"],
                          "failure_class": "success" if ok else "wrong_answer",
                          "response_tokens": 2, "info": {"seed": i}})
            rewards += [{"traj_id": tid, "component": c, "value": v} for c, v in
                        (("outcome", float(ok)), ("format", 1.0), ("cost", 0.0), ("process", 0.0))]
            turns.append({"traj_id": tid, "turn": 0, "action": "<answer>A</answer>",
                          "observation": "", "action_valid": True, "action_type": "answer",
                          "parsed": {"answer": "A"}})
            tokens += [{"traj_id": tid, "pos": 0, "token_id": 7, "text": "Q?", "role": "prompt",
                        "trained": False, "turn": -1},
                       {"traj_id": tid, "pos": 1, "token_id": 8, "text": "<answer>", "role": "action",
                        "trained": True, "logprob": -0.25, "advantage": 1.0, "turn": 0,
                        "entropy": 1.5},
                       {"traj_id": tid, "pos": 2, "token_id": 9, "text": "A</answer>",
                        "role": "action", "trained": True, "logprob": -1.0, "turn": 0}]
        rec.record_step(step, metrics={"reward/mean": 0.5}, trajectories=trajs, rewards=rewards,
                        turns=turns, tokens=tokens)
    rec.finish()
    return run_id


def test_export_then_import_round_trips(tmp_path):
    src = tmp_path / "src.duckdb"
    run_id = _trainer_run(src)
    first = tmp_path / "first.jsonl"
    assert export_jsonl(src, run_id, first) == 12
    report = ingest.import_file(first, tmp_path / "copy.duckdb", run_id="copy")
    assert (report.imported, report.failed) == (12, 0)
    second = tmp_path / "second.jsonl"
    export_jsonl(tmp_path / "copy.duckdb", "copy", second)
    assert first.read_text() == second.read_text()
    line = json.loads(first.read_text().splitlines()[0])
    assert line["run"] == {"env": "search", "model": "tiny", "algo": "grpo"}
    assert line["tokens"][1] == {"token_id": 8, "text": "<answer>", "role": "action",
                                 "trained": True, "logprob": -0.25, "advantage": 1.0, "turn": 0,
                                 "entropy": 1.5}


def test_export_filters(tmp_path):
    src = tmp_path / "src.duckdb"
    run_id = _trainer_run(src)
    out = tmp_path / "sel.jsonl"

    def ids(*flags):
        assert io.main(["export", "--db", str(src), "--run", run_id, "--out", str(out),
                        *flags]) == 0
        return [json.loads(line)["traj_id"] for line in out.read_text().splitlines()]

    assert ids("--success", "true", "--split", "train") == ["0-0", "0-2", "1-1", "2-0", "2-2"]
    assert ids("--failure-class", "wrong_answer", "--step-min", "1", "--step-max", "1") == [
        "1-0", "1-2"]
    assert ids("--split", "eval") == ["0-3", "1-3", "2-3"]


def test_flat_parquet_export(tmp_path):
    src = tmp_path / "src.duckdb"
    run_id = _trainer_run(src)
    out = tmp_path / "run.parquet"
    assert export_parquet(src, run_id, out, Filters(success=True)) == 6
    df = pd.read_parquet(out)
    assert len(df) == 6 and df["success"].all()
    assert [len(t) for t in df["tokens"]] == [3] * 6
    assert df["tokens"][0][1]["logprob"] == -0.25
    assert dict(df["rewards"][0])["format"] == 1.0
    assert df["turns"][0][0]["action"] == "<answer>A</answer>"


def test_partitioned_export_is_read_by_duckdb_pandas_and_the_store_reader(tmp_path):
    src = tmp_path / "src.duckdb"
    run_id = _trainer_run(src)
    ingest.import_file(GENERIC, src, run_id="imported", max_line_bytes=4096)
    out = tmp_path / "parts"
    for _ in range(2):  # a re-export replaces, never duplicates
        counts = export_partitioned(src, out)
    assert counts["tokens"] == _rows(src, "SELECT count(*) n FROM tokens")["n"][0]
    assert (out / "tokens" / f"run_id={run_id}" / "step=2").is_dir()
    glob = str(out / "tokens" / "**" / "*.parquet")
    n = duckdb.sql(f"SELECT count(*) FROM read_parquet('{glob}', hive_partitioning = true) "
                   f"WHERE run_id = '{run_id}' AND step = 2").fetchall()[0][0]
    assert n == 12
    assert len(pd.read_parquet(out / "trajectories")) == 12 + 4
    # the directory opens as a read-only store through the same queries the app uses
    assert sorted(queries.runs(out)["run_id"]) == sorted(["imported", run_id])
    pd.testing.assert_frame_equal(queries.metrics(out, run_id), queries.metrics(src, run_id))
    with db.reading(out) as con:
        assert con.execute("SELECT typeof(step), typeof(run_id) FROM tokens LIMIT 1").fetchone() \
            == ("INTEGER", "VARCHAR")
    with pytest.raises(db.StoreError, match="read-only"):
        Recorder(out)


def test_a_filtered_partitioned_export_keeps_only_the_picked_trajectories_rows(tmp_path):
    """Every trajectory-keyed table, pictures and turn signals included, follows the filter."""
    src = tmp_path / "src.duckdb"
    rec = Recorder(src)
    run_id = rec.start_run({"env": "guess", "model": "tiny", "algo": "grpo"}, name="pics")
    trajs = [{"traj_id": t, "group_id": "g", "task_id": "q", "reward": float(ok), "success": ok,
              "num_turns": 1, "split": "train"} for t, ok in (("won", True), ("lost", False))]
    rec.record_step(0, trajectories=trajs,
                    renders=[{"traj_id": t, "turn": k, "kind": "table", "body": "[]"}
                             for t in ("won", "lost") for k in (-1, 0)],
                    turn_signals=[{"traj_id": t, "turn": 0, "name": "q", "value": 1.0,
                                   "source": "branch"} for t in ("won", "lost")])
    rec.finish()
    counts = export_partitioned(src, tmp_path / "parts", filters=Filters(success=True))
    assert counts["trajectories"] == 1 and counts["renders"] == 2 and counts["turn_signals"] == 1
    assert set(pd.read_parquet(tmp_path / "parts" / "renders")["traj_id"]) == {"won"}


# -- verl ---------------------------------------------------------------------------------------------
def test_verl_dump_import(tmp_path, capsys):
    store, code = _import(tmp_path, "--format", "verl", source=FIXTURES / "verl")
    err = capsys.readouterr().err
    assert code == 1
    assert "2.jsonl:2: field 'score' must be a finite number" in err
    assert "2.jsonl:3: field 'output' must be a string, got null" in err
    assert "2.jsonl:4: not valid JSON" in err
    traj = _rows(store, "SELECT * FROM trajectories ORDER BY traj_id")
    assert len(traj) == 7
    one = traj[traj["step"] == 1]
    assert one["group_id"].nunique() == 2  # four samples of one prompt, one of another
    assert traj.set_index("traj_id").loc["2:1", "group_id"] != traj.set_index("traj_id").loc[
        "1:1", "group_id"]  # same prompt, another step: another group
    t = traj.set_index("traj_id")
    assert t.loc["1:1", "answer"] == "1204" and bool(t.loc["1:1", "success"])
    assert not t.loc["1:2", "success"] and pd.isna(t.loc["1:3", "finish_reason"])
    assert json.loads(t.loc["1:1", "golds"]) == {"target": ["1204"]}
    turns = _rows(store, "SELECT * FROM turns WHERE traj_id = '1:4' ORDER BY turn")
    assert turns["action_type"].tolist() == ["search", "search", "answer"]
    assert turns["observation"][0].startswith("<information>Doc 1")
    line = json.loads((FIXTURES / "verl" / "1.jsonl").read_text().splitlines()[3])
    assert "".join(turns["action"] + turns["observation"]) == line["output"]
    assert _rows(store, "SELECT action_type FROM turns WHERE traj_id = '1:3'")[
        "action_type"].tolist() == [None]  # an output without any tags: type unknown
    rewards = _rows(store, "SELECT component, value FROM rewards WHERE traj_id = '1:1'")
    assert dict(rewards.values.tolist()) == {"format": 1.0, "retrieval": 0.2, "outcome": 1.0,
                                             "cost": 0.0, "process": 0.0}


# -- TRL ----------------------------------------------------------------------------------------------
def _trl_dir(tmp_path):
    root = tmp_path / "trl_out" / "completions"
    root.mkdir(parents=True)
    for step in (10, 20):
        pd.DataFrame({
            "step": [step] * 4, "prompt": ["What is 2+2?"] * 2 + ["What is 3+3?"] * 2,
            "completion": ["<answer>4</answer>", "5", "<answer>6</answer>", "<answer>7</answer>"],
            "accuracy_reward": [1.0, 0.0, 1.0, 0.0], "format_reward": [1.0, 0.0, 1.0, float("nan")],
            "advantage": [0.7, -0.7, 0.7, -0.7]}).to_parquet(root / f"completions_{step:05d}.parquet")
    pd.DataFrame({"prompt": [[{"role": "user", "content": "Weather?"}]],
                  "completion": [[{"role": "assistant", "content": "<tool>get()</tool>"},
                                  {"role": "tool", "content": "sunny"},
                                  {"role": "assistant", "content": "It is sunny."}]],
                  "reward": [1.0], "mode": ["eval"]}).to_parquet(root / "completions_00030.parquet")
    pd.DataFrame({"prompt": ["x"]}).to_parquet(root / "completions_00040.parquet")
    (root / "completions_00050.parquet").write_bytes(b"PAR1 not really")
    return tmp_path / "trl_out"


def test_trl_completions_import(tmp_path, capsys):
    store, code = _import(tmp_path, source=_trl_dir(tmp_path))  # format guessed: trl
    err = capsys.readouterr().err
    assert code == 1
    assert "completions_00040.parquet: missing column(s) ['completion']" in err
    assert "completions_00050.parquet: not a readable Parquet file" in err
    traj = _rows(store, "SELECT * FROM trajectories ORDER BY step, traj_id").set_index("traj_id")
    assert len(traj) == 9
    assert traj.loc["completions/completions_00010:0", "reward"] == 2.0  # sum of the functions
    assert traj.loc["completions/completions_00010:3", "reward"] == 0.0  # NaN skipped
    assert traj.loc["completions/completions_00020:1", "advantage"] == -0.7
    assert traj[traj["step"] == 10]["group_id"].nunique() == 2
    assert traj.loc["completions/completions_00030:0", "split"] == "eval"
    comps = _rows(store, "SELECT component, value FROM rewards "
                         "WHERE traj_id = 'completions/completions_00010:0'")
    assert dict(comps.values.tolist()) == {"outcome": 1.0, "format": 1.0, "cost": 0.0,
                                           "process": 0.0}
    chat = _rows(store, "SELECT action, observation FROM turns "
                        "WHERE traj_id = 'completions/completions_00030:0' ORDER BY turn")
    assert chat.values.tolist() == [["<tool>get()</tool>", "tool: sunny\n"],
                                    ["It is sunny.", ""]]


def test_format_guessing_and_empty_input(tmp_path, capsys):
    assert ingest.guess_format(GENERIC) == "jsonl"
    assert ingest.guess_format(FIXTURES / "verl") == "verl"
    assert ingest.guess_format(FIXTURES / "verl" / "1.jsonl") == "verl"  # sniffed from its fields
    assert ingest.guess_format(_trl_dir(tmp_path)) == "trl"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert _import(tmp_path, source=empty)[1] == 2
    assert "no records found" in capsys.readouterr().err


# -- the parser never crashes ------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_parse_to_an_object_or_a_line_error(data):
    result = parse_json(data.replace(b"\n", b" "))
    if not isinstance(result, LineError):
        try:
            validate(result)
        except LineError:
            pass


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=20),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c,
                                                                        max_size=4), max_leaves=20)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["traj_id", "task_id", "turns", "reward", "rewards",
                                        "tokens", "step", "success", "prompt", "tests"]), JSON,
                       max_size=10))
def test_validate_accepts_or_names_the_problem(obj):
    try:
        rec = validate(obj)
    except LineError as exc:
        assert "field" in str(exc) or "line" in str(exc)
        return
    rows = ingest.to_rows(rec)
    assert {r["component"] for r in rows["rewards"]} >= {"outcome", "format", "cost", "process"}


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["input", "output", "score", "step", "gts", "acc",
                                        "format_reward"]), JSON, max_size=7))
def test_verl_lines_give_a_valid_record_or_a_line_error(obj):
    from storage.ingest.dumps import verl_record
    try:
        rec = verl_record(obj, "f:1", 0)
    except LineError:
        return
    validate(rec)  # whatever the reader builds is a valid generic record


@given(st.text(max_size=200))
def test_pieces_rebuild_the_text_exactly(text):
    assert "".join(pieces(text)) == text
