"""Users' environments cannot hang or flood the trainer (issue #34, point 9; core/envs/guard.py):
a call past ``--env-step-timeout`` ends its trajectory as env_error naming the deadline, a 40 MB
observation is cut by bytes before it is tokenised (the cut recorded), and an outcome that
raises or a NaN / wrong-typed score or step reward ends that trajectory only, recorded with the
error and the env named, while the run goes on."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import pytest

from core.envs import guard as guard_mod
from core.envs.base import Outcome, StepResult, Task
from core.envs.guard import (CUT_KEY, EnvError, EnvStuck, Guard, checked_outcome, checked_step,
                             cut_utf8, stuck_calls)
from core.run.step_rows import step_tables
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling
from core.credit.scoring import score_all
from core.config import TrainConfig
from storage.recorder import Recorder

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- the checks, by hand ---------------------------------------------------------------------------
def test_cut_utf8_keeps_whole_characters_and_counts_the_bytes_cut():
    assert cut_utf8("abc", 3) == ("abc", 0)
    assert cut_utf8("x" * 100, 10) == ("x" * 10, 90)
    assert cut_utf8("€" * 5, 7) == ("€€", 9)              # 3 bytes each: a third would split
    assert cut_utf8("a" + "é" * 4, 4) == ("aé", 6)       # 9 bytes, 1 + 2 kept: é is 2
    assert cut_utf8("é" * 3, 6) == ("é" * 3, 0)          # exactly at the cap: nothing cut
    kept, cut = cut_utf8("ok" + chr(0xD800) * 10, 5)    # a lone surrogate is measured, kept
    assert kept == "ok" + chr(0xD800) and cut == 27


@pytest.mark.parametrize("reward", [math.nan, math.inf, "1", None, 10 ** 400])
def test_a_step_reward_that_is_not_a_finite_number_is_refused(reward):
    why = checked_step(StepResult("o", done=False, valid=True, reward=reward), 100)
    assert isinstance(why, str) and "reward=" in why and "not a finite real number" in why


def test_a_good_step_is_copied_with_a_float_reward_and_the_cut_recorded():
    raw = StepResult("é" * 10, done=False, valid=True, reward=np.float32(0.5), info={"k": 1})
    ok = checked_step(raw, 7)
    assert ok.observation == "ééé" and ok.info == {"k": 1, CUT_KEY: 14}
    assert ok.reward == 0.5 and type(ok.reward) is float and raw.info == {"k": 1}
    assert checked_step(StepResult(b"bytes", False, True), 10).startswith("step returned an obs")
    assert checked_step({"observation": "x"}, 10) == "step returned dict, not a StepResult"
    assert "not valid text" in checked_step(StepResult("a" + chr(0xDC80), False, True), 10)


@pytest.mark.parametrize("changes, field", [
    ({"score": math.nan}, "score"), ({"score": "1.0"}, "score"), ({"score": None}, "score"),
    ({"process": -math.inf}, "process"), ({"success": "yes"}, "success"),
    ({"success": 1}, "success"), ({"answer": 42}, "answer"), ({"info": None}, "info")])
def test_a_bad_outcome_is_refused_naming_the_field(changes, field):
    why = checked_outcome(Outcome(**{"score": 1.0, "success": True, **changes}))
    assert isinstance(why, str) and f"outcome returned {field}" in why
    assert checked_outcome({"score": 1.0}) == "outcome returned dict, not an Outcome"


def test_numpy_numbers_and_ints_are_accepted_as_scores():
    out = checked_outcome(Outcome(score=np.float64(0.25), success=np.bool_(True), process=1))
    assert (out.score, out.success, out.process) == (0.25, True, 1.0)
    assert type(out.success) is bool and type(out.process) is float


# -- environments for the guard and the rollout ----------------------------------------------------
class Episode:
    """Guess-like episode whose misbehaviour is chosen per seed by ``Env.modes``."""

    def __init__(self, env, task, mode):
        self.env, self.task, self.mode = env, task, mode
        # a connection refuses every thread but its maker's: the episode must stay on one
        import sqlite3
        self.db = sqlite3.connect(":memory:")
        self.db.execute("CREATE TABLE s (n INTEGER)")

    def reset(self):
        return self.env.big if self.mode == "flood_prompt" else "Say anything."

    def state_key(self):
        return str(self.db.execute("SELECT count(*) FROM s").fetchone()[0])

    def step(self, action_text):
        self.db.execute("INSERT INTO s VALUES (1)")
        if self.mode == "hang":
            self.env.release.wait()          # never, until the test ends
        if self.mode == "flood":
            return StepResult(self.env.big + "tail", done=False, valid=True, reward=0.5)
        if self.mode == "nan_reward":
            return StepResult("ok", done=False, valid=True, reward=math.nan)
        return StepResult("ok", done=False, valid=True, reward=0.25)

    def outcome(self):
        if self.mode == "outcome_raises":
            raise RuntimeError("grader database is gone")
        if self.mode == "nan_score":
            return Outcome(score=math.nan, success=False)
        if self.mode == "str_score":
            return Outcome(score="1.0", success=True)
        return Outcome(score=1.0, success=True, info={"mode": self.mode})


class Env:
    name, stop_tags, system_prompt = "moody", ("</a>",), ""

    def __init__(self, modes, big: str = ""):
        self.modes, self.big, self.release = modes, big, threading.Event()

    def tasks(self, split, n, seed):
        return [Task(task_id=f"t{i}", prompt="Say anything.") for i in range(n)]

    def episode(self, task, seed):
        return Episode(self, task, self.modes[seed % len(self.modes)])


@pytest.fixture
def released():
    """Envs whose hanging steps are let go when the test ends, so no thread outlives it."""
    envs = []
    yield envs.append
    for env in envs:
        env.release.set()


@pytest.fixture(scope="module")
def pol():
    from core.model.policy import load_policy
    return load_policy("tiny", seed=0)


def _roll(pol, env, group_size=4, timeout=120.0, max_turns=2):
    return rollout(pol, env, env.tasks("train", 1, 0), group_size=group_size, seed=0,
                   sampling=Sampling(max_turns=max_turns, max_new_tokens=3, max_context=512,
                                     max_obs_tokens=16, env_step_timeout=timeout))


def _seeds_of(trajs):
    return {t.traj_id: t.info["episode_seed"] for t in trajs}


# -- the deadline ----------------------------------------------------------------------------------
def test_a_step_past_its_deadline_is_abandoned_and_the_episode_takes_no_more_calls(released):
    env = Env(["hang"])
    released(env)
    before = len(stuck_calls())
    with Guard(env, timeout_s=0.5) as guard:
        ep = guard.open(env.tasks("train", 1, 0)[0], 0)
        assert ep.reset() == "Say anything." and ep.state_key() == "0"  # sqlite on its worker
        started = time.perf_counter()
        with pytest.raises(EnvError, match=r"^environment moody: step: TimeoutError: step did "
                                           r"not return within the 0.5 s deadline"):
            ep.step("<a>x</a>")
        assert 0.5 <= time.perf_counter() - started < 3
        assert len(stuck_calls()) == before + 1 and ("moody", "step") in stuck_calls()
        started = time.perf_counter()
        with pytest.raises(EnvError, match="not called: step did not return within 0.5 s"):
            ep.outcome()                      # at once: the worker is still in step
        assert time.perf_counter() - started < 0.2
    env.release.set()                         # the step returns: its worker ends, not reused
    deadline = time.monotonic() + 5
    while len(stuck_calls()) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(stuck_calls()) == before


def test_too_many_stuck_calls_stop_the_run_naming_the_env(released, monkeypatch):
    env = Env(["hang"])
    released(env)
    monkeypatch.setattr(guard_mod, "MAX_STUCK", len(stuck_calls()) + 2)
    with Guard(env, timeout_s=0.2) as guard:
        first = guard.open(env.tasks("train", 1, 0)[0], 0)
        with pytest.raises(EnvError):
            first.step("x")
        second = guard.open(env.tasks("train", 1, 0)[0], 0)
        with pytest.raises(EnvStuck, match=r"^environment moody: \d+ calls into it are still "
                                           r"running past their 0.2 s deadline"):
            second.step("x")


def test_a_hanging_step_ends_its_trajectory_and_the_rollout_goes_on(pol, released):
    env = Env(["ok", "hang"])                 # odd episode seeds hang
    released(env)
    started = time.perf_counter()
    trajs = _roll(pol, env, timeout=1.0)
    assert time.perf_counter() - started < 30
    seeds = _seeds_of(trajs)
    hung = [t for t in trajs if seeds[t.traj_id] % 2]
    assert hung and len(hung) < len(trajs)
    for t in hung:
        assert t.finish_reason == "env_error" and t.num_turns == 1
        assert "did not return within the 1 s deadline (--env-step-timeout)" in t.turns[0].error
        assert t.info["env_error"]["env"] == "moody" and t.info["env_error"]["call"] == "step"
        assert t.outcome.score == 0.0 and "not called" in t.outcome.info["error"]
    for t in trajs:
        if t not in hung:
            assert t.finish_reason == "max_turns" and t.num_turns == 2 and t.outcome.success


# -- the flood -------------------------------------------------------------------------------------
def test_a_40_mb_observation_is_cut_by_bytes_before_it_is_tokenised(pol):
    big = "flood " * (40_000_000 // 6)
    trajs = _roll(pol, Env(["flood"], big=big), group_size=2, max_turns=1)
    cap = guard_mod.obs_byte_cap(16)                                  # max_obs_tokens=16
    for t in trajs:
        turn = t.turns[0]
        assert turn.info[CUT_KEY] == len(big) + len("tail") - cap    # recorded on the turn
        assert turn.obs_truncated and len(turn.observation) < cap
        assert sum(r == "observation" for r in t.roles) <= 16


def test_a_40_mb_first_message_is_cut_too_and_ends_as_context_full(pol):
    big = "flood " * (40_000_000 // 6)
    [t] = _roll(pol, Env(["flood_prompt"], big=big), group_size=1, max_turns=1)
    assert t.info["prompt_cut_bytes"] == len(big) - guard_mod.obs_byte_cap(512)  # max_context
    assert t.finish_reason == "context_full" and t.num_turns == 0


# -- bad outcomes and rewards ----------------------------------------------------------------------
def test_bad_outcomes_and_a_nan_step_reward_end_only_their_trajectories(pol, tmp_path):
    modes = ["ok", "outcome_raises", "nan_score", "str_score", "nan_reward"]
    env = Env(modes)
    trajs = _roll(pol, env, group_size=5)
    score_all(trajs, TrainConfig())           # a NaN here would fail the whole step
    by_mode = {modes[t.info["episode_seed"] % 5]: t for t in trajs}
    assert set(by_mode) == set(modes)
    assert by_mode["ok"].finish_reason == "max_turns" and by_mode["ok"].reward == 1.0
    expected = {"outcome_raises": "RuntimeError: grader database is gone",
                "nan_score": "outcome returned score=nan: not a finite real number",
                "str_score": "outcome returned score='1.0': not a finite real number"}
    for mode, error in expected.items():
        t = by_mode[mode]
        assert t.finish_reason == "env_error" and t.reward == 0.0, mode
        assert t.info["env_error"] == {"env": "moody", "call": "outcome", "error": error,
                                       "finish_reason": "max_turns"}
        assert t.outcome.info == {"error": error, "env": "moody"}
    nan = by_mode["nan_reward"]
    assert nan.finish_reason == "env_error" and nan.num_turns == 1
    assert nan.turns[0].error == "step returned reward=nan: not a finite real number"
    assert nan.info["env_error"]["turn"] == 0 and nan.outcome.success   # graded all the same
    # recorded: the error on its turn and the reward NULL, not NaN; the ok turns keep theirs
    rec = Recorder(tmp_path / "s.duckdb")
    rec.start_run({"env": "moody", "model": "tiny", "algo": "grpo"})
    rec.record_step(1, metrics={"reward/mean": 0.0}, **step_tables(trajs))
    rec.finish()
    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    rows = con.execute("SELECT traj_id, turn, step_reward, error FROM turns ORDER BY 1, 2").fetchall()
    info = dict(con.execute("SELECT traj_id, info->>'$.env_error.error' FROM trajectories").fetchall())
    con.close()
    assert [(r[2], r[3]) for r in rows if r[0] == nan.traj_id] == [
        (None, "step returned reward=nan: not a finite real number")]
    assert [r[2] for r in rows if r[0] == by_mode["ok"].traj_id] == [0.25, 0.25]
    assert info[by_mode["outcome_raises"].traj_id] == "RuntimeError: grader database is gone"


# -- through the command line ----------------------------------------------------------------------
HANGS = """
import threading
from examples.guess import Factory, GuessEpisode

class HangEpisode(GuessEpisode):
    def step(self, action_text):
        threading.Event().wait()             # never returns

class Env(Factory):
    def episode(self, task, seed):
        return HangEpisode(self, task)
"""


def test_a_run_whose_env_never_returns_finishes_with_env_errors_naming_the_deadline(tmp_path):
    (tmp_path / "hang_plugin.py").write_text(HANGS)
    db = tmp_path / "store.duckdb"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "core.train", "--env", "hang_plugin:Env", "--env-options",
         "high=8", "--env-step-timeout", "2", "--model", "tiny", "--steps", "1",
         "--group-size", "2", "--tasks-per-step", "1", "--max-turns", "2", "--max-new-tokens",
         "4", "--eval-every", "0", "--threads", "1", "--quiet", "--lora-targets",
         "q_proj,v_proj", "--db", str(db)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    took = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    con = duckdb.connect(str(db), read_only=True)
    status = con.execute("SELECT status FROM runs").fetchall()
    rows = con.execute("SELECT t.finish_reason, u.error, u.step_reward, "
                       "t.info->>'$.env_error.env' FROM trajectories t JOIN turns u "
                       "USING (run_id, traj_id)").fetchall()
    con.close()
    assert status == [("finished",)]
    assert len(rows) == 2 and all(r[0] == "env_error" and r[2] is None and r[3] == "guess"
                                  for r in rows)
    assert all("did not return within the 2 s deadline (--env-step-timeout)" in r[1]
               for r in rows)
    assert took < 240


def test_the_step_deadline_is_validated_before_any_work():
    from core.config import ConfigError, TrainConfig, validate
    for bad in (0.0, -1.0, 1e9):
        with pytest.raises(ConfigError, match="env_step_timeout"):
            validate(TrainConfig(env_step_timeout=bad))
    validate(TrainConfig(env_step_timeout=0.5))


def test_sft_demonstrations_run_through_the_guard_and_leave_a_hung_one_out(pol, released, capsys):
    """The expert's episodes meet the same deadline: one whose step hangs is left out, named,
    and the others are demonstrations (their sqlite episode stays on its one thread)."""
    from core.rollout.sft import demonstrations

    class Expert(Env):
        def episode(self, task, seed):
            ep = Episode(self, task, "hang" if task.task_id == "t1" else "fine")
            ep.expert_action = lambda: "<a>x</a>"
            return ep

    env = Expert(["fine"])
    released(env)
    tasks = [Task(task_id=f"t{i}", prompt="Say anything.", split="train") for i in range(3)]
    sampling = Sampling(max_turns=1, max_new_tokens=3, max_context=512, max_obs_tokens=16,
                        env_step_timeout=0.5)
    demos = demonstrations(env, tasks, pol.tokenizer, sampling, seed=0, id_prefix="sft")
    assert [d.task.task_id for d in demos] == ["t0", "t2"]
    assert "sft-d1 (t1) left out" in capsys.readouterr().err
    assert all(d.outcome.success for d in demos)
