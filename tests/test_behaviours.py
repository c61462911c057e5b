"""Behaviours (storage/behaviours/): the pure functions on hand-built trajectories, the
covariance and the shallow-strategy alarm on a constructed store whose answer is known, and the
``agentrl behaviours`` job end to end on a copy of a committed sample store."""
from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest

from storage.behaviours import (BEHAVIOURS, StepBehaviours, behaviour_values, query_pattern,
                                register_behaviour, run_job)
from storage.behaviours import measures as m
from storage.behaviours.payoff import alarm_steps, covariance, reinforced_p
from storage.recorder import Recorder

ROOT = Path(__file__).resolve().parent.parent
SEARCH = ROOT / "sample_runs" / "search_smollm2.duckdb"
SEARCH_RUN = "20261129-233052-4ded2d"


def turn(i, action, observation="", kind="search", valid=True, error=None):
    return {"turn": i, "action": action, "observation": observation, "action_valid": valid,
            "action_type": kind, "error": error}


def search(i, query, observation):
    return turn(i, f"<think>x</think><search>{query}</search>", observation)


def answer(i, text):
    return turn(i, f"<answer>{text}</answer>", kind="answer")


def traj(turns, answer_text, golds=("Paris",), tools=True, gains=None, task="t1", tid="a"):
    return {"traj_id": tid, "task_id": task, "answer": answer_text, "golds": list(golds),
            "tools_offered": tools, "turns": turns, "num_turns": len(turns),
            "response_tokens": 42, "info_gain": gains}


# ---- the pure functions ------------------------------------------------------------------------
def test_evidence_behaviours_by_hand():
    guessed = traj([answer(0, "Paris")], "Paris")
    assert m.no_successful_tool_call(guessed) == 1.0
    assert m.answer_not_in_observations(guessed) == 1.0
    read = traj([search(0, "capital of France", "<information>The capital is Paris.</information>"),
                 answer(1, "The Paris!")], "The Paris!")
    assert m.no_successful_tool_call(read) == 0.0
    assert m.answer_not_in_observations(read) == 0.0  # normalised: articles and punctuation
    failed = traj([turn(0, "<search></search>", valid=False), answer(1, "Rome")], "Rome")
    assert m.no_successful_tool_call(failed) == 1.0  # a refused call is no successful call
    # never answered: 0, not absent (the shortcut "answer at once" is measured against it)
    looped = traj([turn(0, "<think>", valid=False), turn(1, "<think>", valid=False)], None)
    assert m.no_successful_tool_call(looped) == 0.0 and m.answer_not_in_observations(looped) == 0.0
    # conflicting evidence: the gold was seen, a wrong answer given straight after -> 1;
    # searched again after it -> 0; answered the gold -> no conflict, absent
    seen = search(0, "capital of France", "<information>Paris is the capital.</information>")
    assert m.conflict_not_followed(traj([seen, answer(1, "Lyon")], "Lyon")) == 1.0
    assert m.conflict_not_followed(traj([seen, search(1, "France capital", "Lyon?"),
                                         answer(2, "Lyon")], "Lyon")) == 0.0
    assert m.conflict_not_followed(traj([seen, answer(1, "Paris")], "Paris")) is None
    # no tool in the environment (a bandit's pull): absent, never 0
    pull = traj([turn(0, "<answer>Dragon</answer>", kind="pull")], "Dragon", tools=False)
    for fn in (m.no_successful_tool_call, m.answer_not_in_observations, m.tool_calls,
               m.conflict_not_followed):
        assert fn(pull) is None
    assert m.repeated_action(pull) is None and m.turns(pull) == 1.0


def test_evidence_ignored_needs_recorded_gain():
    held = search(0, "q", "<information>Paris</information>")
    other = search(1, "q2", "<information>Lyon</information>")
    t = traj([held, other, search(2, "q3", "Paris again"), answer(3, "Paris")], "Paris",
             gains={0: 0.2, 1: -0.1, 2: 0.0})
    assert m.evidence_ignored(t) == 0.5  # turns 0 and 2 held the gold; turn 2 moved nothing
    assert m.evidence_ignored({**t, "info_gain": None}) is None


def test_repetition_format_and_counts():
    t = traj([search(0, "a  b", "x"), search(1, "a b", "x"), search(2, "c", "y"),
              turn(3, "<answer>Paris</answer> and more <answer>Rome</answer>", kind="answer")],
             "Paris")
    assert m.repeated_action(t) == 1.0          # whitespace collapsed: 'a  b' == 'a b'
    assert m.tool_calls(t) == 3.0 and m.turns(t) == 4.0 and m.tokens(t) == 42.0
    assert m.format_forgiven(t) == 0.25         # one of four tagged actions forgiven
    assert m.format_forgiven(traj([turn(0, "move left", kind="move")], None)) is None


def test_query_patterns_reuse_and_entropy():
    assert query_pattern("founder of Trathuth Labs born") == "founder of <e> born"
    assert query_pattern("Who founded Rurer in 1834?") == "who founded <e> in <e>"
    a = traj([search(0, "capital of Osk", "-"), search(1, "mayor of Osk", "-")], None, tid="a")
    b = traj([search(0, "capital of Varnia", "-")], None, tid="b")
    c = traj([search(0, "capital of Telith", "-")], None, task="t2", tid="c")
    d = traj([answer(0, "x")], "x", task="t2", tid="d")
    # reuse is across tasks: a's "capital of <e>" counts for c's (task t2), not for b's (t1)
    assert m.query_template_reuse([a, b, c, d]) == [0.5, 1.0, 1.0, None]
    assert m.query_template_reuse([a, b]) == [0.0, 0.0]
    h = m.query_entropy([a, b, c, d])
    assert h[0] == h[1] == pytest.approx(-(2 / 3) * math.log2(2 / 3) - (1 / 3) * math.log2(1 / 3))
    assert h[2] == h[3] == 0.0


def test_a_user_behaviour_is_registered_and_computed():
    @register_behaviour("test_long_answer")
    def long_answer(t):
        return None if t.get("answer") is None else float(len(t["answer"]) > 3)
    try:
        values = behaviour_values([traj([], "Paris"), traj([], None)])
        assert values["test_long_answer"] == [1.0, None]
        with pytest.raises(ValueError, match="registered twice"):
            register_behaviour("test_long_answer")(lambda t: 0.0)
    finally:
        BEHAVIOURS.pop("test_long_answer")


# ---- covariance, its test and the alarm ----------------------------------------------------------
def test_covariance_and_test_by_hand():
    a, b = np.array([1.5, -0.5, -0.5, -0.5]), np.array([1.0, 0.0, 0.0, 0.0])
    assert covariance(a, b) == pytest.approx(sum((a - 0) * (b - 0.25)) / 3)  # = 0.5
    assert reinforced_p(a, np.ones(4)) == 1.0           # a behaviour all share cannot move
    assert reinforced_p(np.zeros(4), b) == 1.0          # zero-variance groups pay nothing
    assert alarm_steps([1, 2, 3, 4], [0.1, 0.2, 0.3, 0.1], [0.01] * 4, [1.0] * 4, k=3) == [3]
    assert alarm_steps([1, 2, 3], [0.1, 0.2, 0.3], [0.01, 0.2, 0.01], [1.0] * 3, k=3) == []


def grpo(rewards: np.ndarray, groups: np.ndarray) -> np.ndarray:
    adv = np.zeros_like(rewards)
    for g in np.unique(groups):
        r = rewards[groups == g]
        adv[groups == g] = 0.0 if r.std() == 0 else (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    return adv


def constructed_run(rec: Recorder, run_id: str, shallow_counts: list[int], paid: bool) -> None:
    """8 groups x 4 rollouts per step; at step s, shallow_counts[s-1] trajectories (spread over
    the groups) answer without searching. paid: those get reward 1, the searchers 0 (the
    shortcut pays); else the reverse."""
    rec.start_run({"env": "search", "model": "tiny", "algo": "grpo"}, run_id=run_id)
    for step, count in enumerate(shallow_counts, start=1):
        ids = [f"s{step}-g{g}-r{r}" for r in range(4) for g in range(8)]  # interleaved groups
        shallow = np.arange(32) < count
        groups = np.array([int(i.split("-g")[1].split("-")[0]) for i in ids])
        reward = np.where(shallow == paid, 1.0, 0.0)
        adv = grpo(reward, groups)
        trajs = {"traj_id": ids, "group_id": [f"s{step}-g{g}" for g in groups],
                 "task_id": [f"task{g}" for g in groups], "reward": reward.tolist(),
                 "advantage": adv.tolist(), "success": (reward > 0).tolist(),
                 "num_turns": [1 if s else 2 for s in shallow], "finish_reason": "answered",
                 "split": "train", "answer": "Paris", "golds": [["Paris"]] * 32}
        turns = {"traj_id": [], "turn": [], "action": [], "observation": [],
                 "action_valid": [], "action_type": []}
        for tid, s in zip(ids, shallow):
            steps = [("<answer>Paris</answer>", "", "answer")] if s else [
                ("<search>capital of France</search>", "Paris is the capital.", "search"),
                ("<answer>Paris</answer>", "", "answer")]
            for k, (action, obs, kind) in enumerate(steps):
                for col, v in zip(turns, (tid, k, action, obs, True, kind)):
                    turns[col].append(v)
        rec.record_step(step, trajectories=trajs, turns=turns)


def test_the_alarm_on_a_constructed_store(tmp_path):
    path = tmp_path / "constructed.duckdb"
    rec = Recorder(path)
    rising = [8, 10, 12, 14, 16, 18]
    constructed_run(rec, "paid", rising, paid=True)        # shortcut paid, spreading: alarm
    constructed_run(rec, "punished", rising, paid=False)   # spreading but punished: none
    constructed_run(rec, "flat", [12] * 6, paid=True)      # paid but not spreading: none
    got = {run: run_job(path, run)["alarms"] for run in ("paid", "punished", "flat")}
    shortcut = "no_successful_tool_call"
    assert [s for n, s in got["paid"] if n == shortcut] == [3, 4, 5, 6]
    assert [s for n, s in got["punished"] if n == shortcut] == []
    assert [s for n, s in got["flat"] if n == shortcut] == []
    con = duckdb.connect(str(path), read_only=True)
    rate = dict(con.execute(
        "SELECT step, value FROM metrics WHERE run_id = 'paid' AND name = ?",
        [f"behaviour/{shortcut}/rate"]).fetchall())
    assert rate == {s: c / 32 for s, c in enumerate(rising, start=1)}
    cov = con.execute("SELECT value FROM metrics WHERE run_id = 'punished' AND step = 2 AND "
                      "name = ?", [f"behaviour/{shortcut}/adv_cov"]).fetchone()[0]
    assert cov < 0
    con.close()
    from storage import queries
    top = queries.behaviour_contributors(path, "paid", 4, shortcut, 3)
    assert (top["value"] == 1.0).all() and (top["contribution"] > 0).all()
    # idempotent: a rerun replaces the rows, never adds to them
    first = run_job(path, "paid")
    assert run_job(path, "paid") == first


def test_the_trainer_side_matches_the_job(tmp_path):
    """StepBehaviours (the trainer's per-step call) gives the job's rows and alarms."""
    path = tmp_path / "same.duckdb"
    rec = Recorder(path)
    constructed_run(rec, "paid", [8, 10, 12, 14], paid=True)
    con = duckdb.connect(str(path), read_only=True)
    tracker, alarms = StepBehaviours(), []
    for step in range(1, 5):
        trajs = con.execute("SELECT * EXCLUDE (run_id, step) FROM trajectories WHERE step = ?",
                            [step]).df().to_dict("list")
        turns = con.execute("SELECT * EXCLUDE (run_id, step) FROM turns WHERE step = ?",
                            [step]).df().to_dict("list")
        rows, metrics = tracker(step, {"trajectories": trajs, "turns": turns})
        alarms += [(n.split("/", 2)[2], step) for n in metrics if n.startswith("alarm/")]
    con.close()
    job = run_job(path, "paid")
    # the shortcut answers from no observation too: both behaviours of it are alarmed
    assert sorted(alarms) == job["alarms"] == [
        (name, step) for name in ("answer_not_in_observations", "no_successful_tool_call")
        for step in (3, 4)]


# ---- the job on a real store ---------------------------------------------------------------------
def test_the_job_on_a_sample_store(tmp_path):
    store = tmp_path / "search.duckdb"
    shutil.copy(SEARCH, store)
    cmd = [sys.executable, "-m", "core.cli", "behaviours", "--db", str(store), "--run", SEARCH_RUN]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "780 trajectories" in done.stdout
    con = duckdb.connect(str(store), read_only=True)
    # the turns rate is the mean of num_turns over each step's training trajectories
    ours = dict(con.execute("SELECT step, value FROM metrics WHERE run_id = ? AND "
                            "name = 'behaviour/turns/rate'", [SEARCH_RUN]).fetchall())
    direct = dict(con.execute("SELECT step, avg(num_turns) FROM trajectories WHERE run_id = ? "
                              "AND split = 'train' GROUP BY step", [SEARCH_RUN]).fetchall())
    assert ours.keys() == direct.keys() and len(ours) == 10
    assert all(ours[s] == pytest.approx(direct[s]) for s in ours)
    names = {n for (n,) in con.execute("SELECT DISTINCT name FROM behaviours").fetchall()}
    assert {"no_successful_tool_call", "answer_not_in_observations", "query_template_reuse",
            "repeated_action", "tool_calls", "turns", "tokens"} <= names
    assert "evidence_ignored" not in names   # this run recorded no information gain
    rows = con.execute("SELECT count(*) FROM behaviours").fetchone()[0]
    con.close()
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT count(*) FROM behaviours").fetchone()[0] == rows
    con.close()
    bad = subprocess.run([*cmd[:-1], "nope"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "no run 'nope'" in bad.stderr and str(store) in bad.stderr


# ---- the Dynamics panel, through AppTest (tests/test_browser_behaviours.py: in Chromium) ----------
from tests.test_pages import app, demo  # noqa: E402,F401  (fixtures)


def test_dynamics_lists_the_alarm_and_its_trajectories(app, tmp_path):
    store = tmp_path / "stores" / "shortcut.duckdb"
    store.parent.mkdir()
    constructed_run(Recorder(store), "paid", [8, 10, 12, 14], paid=True)
    run_job(store, "paid")
    at = app("dynamics", store_dir=str(store.parent), store=str(store), run="paid")
    assert not at.exception, at.exception
    warnings = [w.value for w in at.warning]
    assert any("Shallow-strategy alarm at step 3: **no\\_successful\\_tool\\_call**" in w
               for w in warnings), warnings
    ranked = next(f.value for f in at.dataframe if "contribution" in f.value.columns)
    assert ranked["replay"].iloc[0].startswith("replay?") and "step=3" in ranked["replay"].iloc[0]
    assert (ranked["value"].head(3) == 1.0).all()    # the no-search trajectories pushed it up


def test_a_failing_behaviour_is_named_and_never_stops_training(tmp_path, capsys):
    path = tmp_path / "store.duckdb"
    constructed_run(Recorder(path), "paid", [8, 10], paid=True)

    @register_behaviour("test_broken")
    def broken(t):
        raise KeyError("cart")
    try:
        done = subprocess.run([sys.executable, "-c", (
            "import sys; from storage.behaviours import register_behaviour, main\n"
            "register_behaviour('test_broken')(lambda t: {}['cart'])\n"
            f"sys.exit(main(['--db', {str(path)!r}, '--run', 'paid']))")],
            cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 2
        assert "behaviour 'test_broken' failed on trajectory 's1-g0-r0'" in done.stderr
        rows, metrics = StepBehaviours()(1, {"trajectories": {"traj_id": ["a"], "split": ["train"],
                                                              "answer": [None]},
                                             "turns": {}})
        assert (rows, metrics) == ({}, {})
        assert "behaviours, step 1: behaviour 'test_broken' failed" in capsys.readouterr().err
    finally:
        BEHAVIOURS.pop("test_broken")


def test_a_reimport_keeps_the_behaviours_the_job_wrote(tmp_path):
    """An import re-derives its run's metrics after each file (import DIR again, follow): the
    behaviour metrics and alarms the job wrote are the job's record, not derived, and stay."""
    from storage.behaviours.job import PREFIXES
    from storage.ingest.step_metrics import JOB_METRIC_PREFIXES
    from storage.io import main as io_main
    from tests.test_follow import verl_line
    assert PREFIXES == JOB_METRIC_PREFIXES  # the two modules name the job's metrics alike
    dumps, store = tmp_path / "rollouts", tmp_path / "s.duckdb"
    dumps.mkdir()
    (dumps / "1.jsonl").write_text("".join(verl_line(1, k) for k in range(4)))
    assert io_main(["import", str(dumps), "--db", str(store), "--format", "verl"]) == 0

    def job_metrics():
        con = duckdb.connect(str(store), read_only=True)
        try:
            return con.execute("SELECT run_id, step, name, value FROM metrics WHERE "
                               "starts_with(name, 'behaviour/') ORDER BY ALL").fetchall()
        finally:
            con.close()
    con = duckdb.connect(str(store), read_only=True)
    (run_id,) = con.execute("SELECT run_id FROM runs").fetchone()
    con.close()
    run_job(store, run_id)
    written = job_metrics()
    assert any(name == "behaviour/turns/rate" for _, _, name, _ in written)
    (dumps / "2.jsonl").write_text("".join(verl_line(2, k) for k in range(4)))
    assert io_main(["import", str(dumps), "--db", str(store), "--format", "verl"]) == 0
    con = duckdb.connect(str(store), read_only=True)
    steps = {s for (s,) in con.execute("SELECT DISTINCT step FROM metrics WHERE run_id = ? AND "
                                       "name = 'reward/mean'", [run_id]).fetchall()}
    con.close()
    assert steps == {1, 2}        # the derived metrics were re-derived with the new file ...
    assert job_metrics() == written  # ... and the job's are as it wrote them
