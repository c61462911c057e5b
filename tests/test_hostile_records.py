"""Hostile records (issue #14, points 2-4): text the database refuses, numbers no double holds,
and imports aimed at a run the trainer recorded.

Text: whatever a model, a tool or a file produced is stored, never fails a step; what DuckDB
cannot take (lone UTF-16 surrogates: measured, every insert path raises) becomes U+FFFD and a NUL
becomes U+2400, both visible. Numbers: a value no double holds fails its own import line, naming
the field; non-finite numbers are exported in a form the importer reads back.
"""
import json
import math
import os

import pytest

from core.envs.base import Task, make_env
from core.run.step_rows import step_tables
from core.rollout.trajectory import Trajectory, Turn
from storage import db, ingest, io
from storage.export import export_jsonl
from storage.recorder import Recorder
from tests.reliability.helpers import q

SURROGATE, LOW = chr(0xD800), chr(0xDC80)
BAD_BYTES = b"ok \xff\xfe".decode("utf-8", "surrogateescape")  # invalid UTF-8 as Python keeps it
HUGE = 10 ** 400
RAISE = "<code>raise ValueError(chr(55296))</code>"


def _apps_trajectory(traj_id: str, actions: list[str]) -> Trajectory:
    """A trajectory whose turns are real apps env steps of ``actions``."""
    env = make_env("apps")
    task = env.tasks("train", 1, 0)[0]
    episode = env.episode(task, 0)
    episode.reset()
    traj = Trajectory(traj_id=traj_id, group_id="g", task=task, finish_reason="max_turns")
    for i, action in enumerate(actions):
        r = episode.step(action)
        traj.turns.append(Turn(i, action, r.observation, r.valid, r.action_type, r.parsed,
                               r.error, r.state_diff))
    traj.outcome = episode.outcome()
    return traj


# -- point 2: text ------------------------------------------------------------------------------
def test_a_code_action_raising_a_lone_surrogate_is_stored_and_the_run_goes_on(tmp_path):
    store = tmp_path / "s.duckdb"
    rec = Recorder(store)
    run_id = rec.start_run({"env": "apps", "model": "tiny", "algo": "grpo"})
    traj = _apps_trajectory("t0", [RAISE])
    assert SURROGATE in traj.turns[0].error  # the env hands the model's exception text on as is
    rec.record_step(0, metrics={"reward/mean": 0.0}, **step_tables([traj]))
    rec.record_step(1, metrics={"reward/mean": 0.0},
                    **step_tables([_apps_trajectory("t1", ["<answer>done</answer>"])]))
    rec.finish()
    assert q(store, "SELECT status, error FROM runs")[0] == ("finished", None)
    (error, action), = q(store, "SELECT error, action FROM turns WHERE traj_id = 't0'")
    assert error == "ValueError (line 1): \ufffd" and action == RAISE
    assert q(store, "SELECT count(*) FROM trajectories")[0][0] == 2
    parsed = json.loads(q(store, "SELECT parsed FROM turns WHERE traj_id = 't0'")[0][0])
    assert parsed["code"] == "raise ValueError(chr(55296))"
    assert run_id == q(store, "SELECT run_id FROM runs")[0][0]


def _hostile_trajectory() -> Trajectory:
    task = Task(task_id="q" + SURROGATE, prompt="P\x00rompt\n\tkept " + BAD_BYTES,
                golds=("g" + LOW, "\x00"))
    traj = Trajectory(traj_id="h", group_id="g", task=task, finish_reason="answered")
    traj.turns.append(Turn(0, "act" + SURROGATE + "\x00", "obs\x01\x1b[31m" + BAD_BYTES, True,
                           "answer", {"k" + SURROGATE: ["v\x00", math.inf, -math.inf, math.nan,
                                                        HUGE]},
                           "err" + "\ud83d\ude00", [{"table": "t", "after": "x" + LOW}]))
    traj.token_ids, traj.token_text = [1, 2, 3], ["P", "\x00" + SURROGATE, "\ud83d\ude00"]
    traj.roles, traj.trained, traj.logprobs, traj.token_turn = (
        ["prompt", "action", "action"], [False, True, True], [None, -math.inf, -0.5], [-1, 0, 0])
    traj.rewards, traj.reward = {"outcome": 1.0}, 1.0
    traj.info = {"note" + SURROGATE: "x\x00", "inf": math.inf}
    return traj


def test_every_string_the_database_refuses_is_replaced_visibly_and_the_rest_kept(tmp_path):
    store = tmp_path / "s.duckdb"
    rec = Recorder(store)
    rec.start_run({"env": "apps" + SURROGATE, "lr": math.nan}, name="n\x00" + SURROGATE)
    rec.record_step(0, metrics={"reward/mean": 1.0}, **step_tables([_hostile_trajectory()]))
    rec.set_status("failed", error="crash: " + SURROGATE)
    name, status, error, config = q(store, "SELECT name, status, error, config FROM runs")[0]
    assert (name, status, error) == ("n\u2400\ufffd", "failed", "crash: \ufffd")
    assert json.loads(config) == {"env": "apps\ufffd", "lr": "NaN"}
    task_id, prompt, golds, info = q(store, "SELECT task_id, prompt, golds, info FROM trajectories")[0]
    assert task_id == "q\ufffd"
    assert prompt == "P\u2400rompt\n\tkept ok \ufffd\ufffd"  # \n \t kept, bad bytes visible
    assert json.loads(golds) == ["g\ufffd", "\u2400"]
    assert json.loads(info) == {"note\ufffd": "x\u2400", "inf": "Infinity"}
    action, obs, err, parsed, diff = q(store, "SELECT action, observation, error, parsed, "
                                              "state_diff FROM turns")[0]
    assert action == "act\ufffd\u2400"
    assert obs == "obs\x01\x1b[31mok \ufffd\ufffd"  # control characters are stored as they are
    assert err == "err\U0001F600"  # a surrogate pair is one character, not two replacements
    assert json.loads(parsed) == {"k\ufffd": ["v\u2400", "Infinity", "-Infinity", "NaN", HUGE]}
    assert json.loads(diff) == [{"table": "t", "after": "x\ufffd"}]
    tokens = q(store, "SELECT text, logprob FROM tokens ORDER BY pos")
    assert tokens == [("P", None), ("\u2400\ufffd", -math.inf), ("\U0001F600", -0.5)]


def test_a_file_whose_name_is_not_utf8_imports_with_the_name_shown_visibly(tmp_path, capsys):
    source = tmp_path / os.fsdecode(b"runs-\xff.jsonl")  # any bytes make a Linux file name
    source.write_text(json.dumps({"traj_id": "a", "task_id": "q", "turns": [{"action": "x\x00"}],
                                  "reward": 1.0}) + "\n", encoding="utf-8")
    store = tmp_path / "s.duckdb"
    assert io.main(["import", str(source), "--db", str(store)]) == 0
    assert "runs-\ufffd.jsonl: 1 records read, 1 imported" in capsys.readouterr().out
    assert q(store, "SELECT name, status FROM runs") == [("runs-\ufffd", "finished")]
    assert q(store, "SELECT source FROM imports") == [("runs-\ufffd.jsonl",)]
    assert q(store, "SELECT action FROM turns") == [("x\u2400",)]


# -- point 3: numbers ----------------------------------------------------------------------------
def _line(traj_id, **kw):
    return {"traj_id": traj_id, "task_id": "q", "turns": [{"action": "a"}], "reward": 1.0, **kw}


def _jsonl(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines),
                    encoding="utf-8")
    return path


def test_numbers_no_double_holds_fail_their_line_naming_the_field(tmp_path, capsys):
    source = _jsonl(tmp_path / "big.jsonl", [
        _line("ok1"),
        json.dumps(_line("r")).replace('"reward": 1.0', f'"reward": {HUGE}'),
        json.dumps(_line("i", info={"a": {"b": 1}})).replace('"b": 1', '"b": 1e999'),
        json.dumps(_line("p", turns=[{"action": "a", "parsed": [0, 1]}])).replace("1]", "-1e999]"),
        json.dumps(_line("g", golds=["x", 2])).replace("2]", "1e999]"),
        json.dumps(_line("c", rewards={"outcome": 3})).replace(": 3", f": -{HUGE}"),
        json.dumps(_line("t", tokens=[{"text": "a", "role": "action", "logprob": 4}])
                   ).replace(": 4", f": {HUGE}"),
        json.dumps(_line("x", info={"n": 5})).replace(": 5", ": " + "9" * 5000),
        _line("ok2", info={"big": HUGE}),  # an integer inside JSON is JSON: kept exactly
    ])
    store = tmp_path / "s.duckdb"
    assert io.main(["import", str(source), "--db", str(store), "--run-id", "big"]) == 1
    err = capsys.readouterr().err
    for words in ("line 2: field 'reward'", "line 3: field 'info.a.b'",
                  "line 4: field 'turns[0].parsed[1]'", "line 5: field 'golds[1]'",
                  "line 6: field 'rewards.outcome'", "line 7: field 'tokens[0].logprob'",
                  "line 8: not valid JSON: Exceeds the limit (4300 digits)"):
        assert f"error: {words}" in err, (words, err)
    assert "Traceback" not in err
    assert sorted(r[0] for r in q(store, "SELECT traj_id FROM trajectories")) == ["ok1", "ok2"]
    assert json.loads(q(store, "SELECT info FROM trajectories WHERE traj_id = 'ok2'")[0][0]
                      )["big"] == HUGE
    assert q(store, "SELECT status FROM runs")[0][0] == "finished"
    assert q(store, "SELECT lines, imported, failed FROM imports")[0] == (9, 2, 7)


def test_verl_scores_and_fields_no_double_holds_fail_their_line(tmp_path, capsys):
    dump = tmp_path / "verl"
    dump.mkdir()
    base = {"input": "Q?", "output": "<answer>4</answer>", "gts": ["4"], "score": 1.0}
    _jsonl(dump / "1.jsonl", [
        base,
        json.dumps(base).replace('"score": 1.0', f'"score": {HUGE}'),
        json.dumps(dict(base, acc=1)).replace('"acc": 1', f'"acc": {HUGE}'),
        json.dumps(dict(base, gts=[5])).replace("[5]", "[1e999]"),
        json.dumps(dict(base, extra={"x": 5})).replace(": 5", ": 1e999"),
        base,
    ])
    store = tmp_path / "s.duckdb"
    assert io.main(["import", str(dump), "--db", str(store), "--format", "verl"]) == 1
    err = capsys.readouterr().err
    for words in ("1.jsonl:2: field 'score'", "1.jsonl:3: field 'acc'", "1.jsonl:4: field 'golds",
                  "1.jsonl:5: field 'info.extra.x'"):
        assert f"error: {words}" in err, (words, err)
    assert "Traceback" not in err
    assert sorted(r[0] for r in q(store, "SELECT traj_id FROM trajectories")) == ["1:1", "1:6"]
    assert q(store, "SELECT status FROM runs")[0][0] == "finished"
    assert q(store, "SELECT lines, imported, failed FROM imports")[0] == (6, 2, 4)


def test_a_dump_file_that_cannot_be_read_fails_alone_and_the_rest_import(tmp_path, capsys):
    dump = tmp_path / "verl"
    dump.mkdir()
    _jsonl(dump / "1.jsonl", [{"input": "Q?", "output": "<answer>4</answer>", "score": 1.0}] * 3)
    (dump / "2.jsonl").mkdir()  # named like a dump file, unreadable as one: it fails alone
    _jsonl(dump / "3.jsonl", [{"input": "Q?", "output": "<answer>5</answer>", "score": 0.0}])
    store = tmp_path / "s.duckdb"
    args = ["import", str(dump), "--db", str(store), "--format", "verl", "--run-id", "cut"]
    assert io.main(args) == 1
    assert "error: 2.jsonl: could not be read: IsADirectoryError" in capsys.readouterr().err
    assert q(store, "SELECT status, error FROM runs WHERE run_id = 'cut'")[0] == ("finished", None)
    assert sorted(r[0] for r in q(store, "SELECT traj_id FROM trajectories")) == [
        "1:1", "1:2", "1:3", "3:1"]
    (lines, imported, failed, errors), = q(store, "SELECT lines, imported, failed, errors "
                                                  "FROM imports")
    assert (lines, imported, failed) == (5, 4, 1) and "2.jsonl" in errors


def _run_with_non_finite_numbers(store, logprob: float = -0.25) -> str:
    """A trainer's run holding every non-finite number a store can; its one sampled token's
    ``logprob`` as given (the hostile trajectory's -inf is no log-probability: an import refuses
    it, see the test after the next)."""
    rec = Recorder(store)
    run_id = rec.start_run({"env": "search", "model": "tiny", "algo": "grpo", "clip": math.inf})
    traj = _hostile_trajectory()
    traj.logprobs = [None, logprob, -0.5]
    traj.advantage, traj.failure_class = math.nan, "unsolved"
    traj.info.update(big=HUGE, nan=math.nan)
    rec.record_step(0, **step_tables([traj]))
    rec.finish()
    with db.writing(store) as con:  # as stores written before this fix hold them
        con.execute("INSERT INTO trajectories (run_id, step, traj_id, group_id, task_id, reward, "
                    "golds, info, response_tokens, failure_class) VALUES (?, 0, 'old', 'g', 'q', "
                    "1.0, '[Infinity]', '{\"x\": -Infinity, \"y\": NaN}', 0, 'no_answer')",
                    [run_id])
        con.execute("INSERT INTO turns (run_id, step, traj_id, turn, action, observation, parsed) "
                    "VALUES (?, 0, 'old', 0, 'a', '', '{\"v\": Infinity}')", [run_id])
        con.execute("INSERT INTO rewards SELECT ?, 0, 'old', c, 0.5 FROM "
                    "unnest(['outcome', 'format', 'cost', 'process']) AS u(c)", [run_id])
    return run_id


def test_every_export_of_non_finite_and_huge_numbers_imports_again(tmp_path):
    src = tmp_path / "src.duckdb"
    run_id = _run_with_non_finite_numbers(src)
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    assert export_jsonl(src, run_id, first) == 2
    for line in first.read_text(encoding="utf-8").splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} written as a bare constant"))
    report = ingest.import_file(first, tmp_path / "copy.duckdb", run_id="copy")
    assert (report.imported, report.failed, report.errors) == (2, 0, [])
    export_jsonl(tmp_path / "copy.duckdb", "copy", second)
    assert first.read_text(encoding="utf-8") == second.read_text(encoding="utf-8")
    copy = tmp_path / "copy.duckdb"
    info = json.loads(q(copy, "SELECT info FROM trajectories WHERE traj_id = 'old'")[0][0])
    assert (info["x"], info["y"]) == ("-Infinity", "NaN")
    assert q(copy, "SELECT logprob FROM tokens WHERE traj_id = 'h' AND pos = 1")[0][0] == -0.25
    assert json.loads(q(copy, "SELECT info FROM trajectories WHERE traj_id = 'h'")[0][0]
                      )["big"] == HUGE


@pytest.mark.parametrize("logprob", [-math.inf, math.inf, 0.5])
def test_an_exported_logprob_that_is_no_log_probability_fails_its_line_by_name(tmp_path,
                                                                                logprob):
    src = tmp_path / "src.duckdb"
    run_id = _run_with_non_finite_numbers(src, logprob)
    export_jsonl(src, run_id, tmp_path / "out.jsonl")
    report = ingest.import_file(tmp_path / "out.jsonl", tmp_path / "copy.duckdb", run_id="copy")
    shown = {-math.inf: "-Infinity", math.inf: "Infinity", 0.5: "0.5"}[logprob]
    assert (report.imported, report.failed) == (1, 1)
    assert report.errors == [f"line 1: field 'tokens[1].logprob' must be a log-probability "
                             f"(finite and <= 0), got {shown}"]


# -- point 4: a trainer's run is not an import target ---------------------------------------------
def test_importing_into_a_trainer_run_is_refused_and_changes_nothing(tmp_path, capsys):
    store = tmp_path / "s.duckdb"
    rec = Recorder(store)
    trained = rec.start_run({"env": "apps", "model": "tiny", "algo": "grpo"})
    rec.record_step(0, **step_tables([_apps_trajectory("t0", ["<answer>done</answer>"])]))
    rec.finish()
    tables = ("runs", "trajectories", "turns", "tokens", "rewards", "metrics", "imports")
    before = {t: q(store, f"SELECT * FROM {t} ORDER BY ALL") for t in tables}
    source = _jsonl(tmp_path / "mine.jsonl", [_line("t0"), _line("t9")])
    for extra in (["--replace"], []):
        assert io.main(["import", str(source), "--db", str(store), "--run-id", trained,
                        *extra]) == 2
        err = capsys.readouterr().err
        assert f"run {trained!r} was recorded by the trainer" in err and "Traceback" not in err
    assert {t: q(store, f"SELECT * FROM {t} ORDER BY ALL") for t in tables} == before
