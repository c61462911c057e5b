"""Branch-from-turn rollouts (core/jobs/branch.py).

* On a hand-built deterministic world with a known policy the estimator finds the known bad turn
  (and its V/Q agree with the values computed by hand).
* On a real run (tiny model, FrozenLake, real DuckDB file): the CLI records K resample + K keep
  continuations per turn as split-'branch' trajectories, the recorded V/Q are the means of the
  stored continuation returns, the same seed gives the same numbers, a job killed midway leaves
  nothing, and bad input exits 2 with a message and nothing written.
"""
from __future__ import annotations

import json
import math
import random
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pytest

from core.commands import branch as branch_cli
from core.jobs import branch, branch_estimates, branch_export

from core.model import checkpoint
from tests.subprocesses import kill_at_first_progress
from core.envs.base import Outcome, StepResult, Task

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- a hand-built world: four doors, one wrong choice anywhere fails the episode ------------------
class Doors:
    """Four turns; each action is ``good`` or ``bad``; success iff no ``bad`` was taken.
    Deterministic from (task, seed)."""
    name, stop_tags, system_prompt = "doors", ("\n",), "Choose good or bad."

    def tasks(self, split, n, seed):
        return [Task(task_id=f"doors-{i}", prompt="four doors") for i in range(n)]

    def episode(self, task, seed):
        return DoorsEpisode(task)


@dataclass
class DoorsEpisode:
    task: Task
    turn: int = 0
    bad: int = 0

    def reset(self):
        return "door 0"

    def state_key(self):
        return f"{self.turn}:{self.bad}"

    def step(self, action):
        self.bad += action.strip() != "good"
        self.turn += 1
        done = self.turn == 4
        return StepResult("" if done else f"door {self.turn}", done=done, valid=True,
                          action_type="move", state_key=self.state_key())

    def outcome(self):
        ok = self.bad == 0 and self.turn == 4
        return Outcome(score=float(ok), success=ok)


P_GOOD = 0.8


def scripted_return(episode, seed: int) -> float:
    """The known policy: ``good`` with probability P_GOOD, to the end of the episode."""
    rng = random.Random(seed)
    while episode.turn < 4:
        episode.step("good" if rng.random() < P_GOOD else "bad")
    return episode.outcome().score


def test_the_estimator_finds_the_known_bad_turn():
    env = Doors()
    task = env.tasks("train", 1, 0)[0]
    recorded, ep = [], env.episode(task, 0)
    ep.reset()
    for turn, action in enumerate(["good", "good", "bad", "good"]):
        key = ep.state_key()
        res = ep.step(action)
        recorded.append({"turn": turn, "action": action, "observation": res.observation,
                         "state_key": key, "obs_truncated": False})
    k, returns = 400, {}
    for t in range(4):
        for kind in branch.KINDS:
            out = returns.setdefault(t, {}).setdefault(kind, [])
            for i in range(k):
                upto = t if kind == "resample" else t + 1
                episode, _, _, _, _ = branch.replay(env, task, 0, recorded, upto)
                out.append(scripted_return(episode, branch.child_seed(0, t, kind, i)))
    rows = branch.estimate(returns, seed=0)
    assert branch_estimates.worst_turn(rows) == 2
    # by hand: before turn t (no bad yet for t <= 2) V = P^(4-t); keeping a good action: P^(3-t)
    want_v = [P_GOOD ** 4, P_GOOD ** 3, P_GOOD ** 2, 0.0]
    want_q = [P_GOOD ** 3, P_GOOD ** 2, 0.0, 0.0]
    for r, v, q in zip(rows, want_v, want_q):
        assert r["v_lo"] - 0.02 <= v <= r["v_hi"] + 0.02
        assert r["q_lo"] - 0.02 <= q <= r["q_hi"] + 0.02
        assert r["a"] == pytest.approx(r["q"] - r["v"])
    assert rows[2]["a_hi"] < 0 < rows[0]["a_lo"]          # the bad door lost value, good ones won
    # after the bad door every return is 0: A = 0, and Newcombe's interval still has a width
    assert rows[3]["a"] == 0.0 and rows[3]["a_lo"] < 0 < rows[3]["a_hi"] < 0.02


def test_replay_refuses_at_the_first_differing_turn():
    env = Doors()
    task = env.tasks("train", 1, 0)[0]
    recorded = [{"turn": 0, "action": "good", "observation": "door 1", "state_key": "0:0"},
                {"turn": 1, "action": "good", "observation": "door 7", "state_key": "1:0"},
                {"turn": 2, "action": "good", "observation": "door 3", "state_key": "2:0"}]
    branch.replay(env, task, 0, recorded, 1)
    with pytest.raises(branch.ReplayMismatch, match="at turn 1") as err:
        branch.replay(env, task, 0, recorded, 3)
    assert err.value.turn == 1


def test_bootstrap_interval_brackets_the_mean_and_is_seeded():
    x = [0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    lo, hi = branch_estimates.bootstrap_ci(x, seed=3)
    assert lo < np.mean(x) < hi and (lo, hi) == branch_estimates.bootstrap_ci(x, seed=3)
    assert branch_estimates.bootstrap_ci([1.0] * 5, seed=0) == (1.0, 1.0)


def test_intervals_stay_honest_for_one_continuation_or_constant_returns():
    from core.jobs.branch_estimates import newcombe, wilson
    # K = 1: one success says little; the bootstrap said [1, 1]
    (row,) = branch.estimate({0: {"keep": [1.0], "resample": [0.0]}})
    assert (row["q_lo"], row["q_hi"]) == pytest.approx(wilson(1, 1)) and row["q_lo"] < 0.25
    assert (row["a_lo"], row["a_hi"]) == pytest.approx(newcombe(1, 1, 0, 1))
    assert row["a_lo"] < 0 < row["a"] == 1.0
    # Wilson by hand, 8 of 8: centre (1 + z^2/16) / (1 + z^2/8), half z sqrt(z^2/256) / (1 + z^2/8)
    z2 = 1.959964 ** 2
    lo = ((1 + z2 / 16) - 1.959964 * math.sqrt(z2 / 256)) / (1 + z2 / 8)
    assert wilson(8, 8) == pytest.approx((lo, 1.0)) and lo == pytest.approx(0.6756, abs=1e-4)
    # returns that are not 0/1 and all equal: no interval rather than a zero-width one
    (row,) = branch.estimate({0: {"keep": [0.2, 0.2, 0.2], "resample": [0.5]}})
    assert math.isnan(row["q_lo"]) and math.isnan(row["a_hi"]) and row["a"] == pytest.approx(-0.3)


def test_the_turn_that_lost_the_reward_is_named_only_when_its_interval_excludes_zero():
    # 3 of 8 keeps solved against 5 of 8 resamples: A = -0.25, but the interval reaches 0
    rows = branch.estimate({0: {"keep": [1.0] * 3 + [0.0] * 5, "resample": [1.0] * 5 + [0.0] * 3},
                            1: {"keep": [1.0] * 8, "resample": [1.0] * 8}})
    assert rows[0]["a"] == pytest.approx(-0.25) and rows[0]["a_lo"] < -0.25 < 0 < rows[0]["a_hi"]
    assert branch_estimates.worst_turn(rows) is None
    (cand,) = branch_estimates.candidates(rows)
    # K (h / |A|)^2 with h the half-width towards 0: more continuations than the 8 run
    h = rows[0]["a_hi"] - rows[0]["a"]
    assert cand["turn"] == 0 and cand["k_needed"] == math.ceil(8 * (h / 0.25) ** 2) > 8
    # with the same shares at K = 64 the interval lies below 0: now it is named
    rows = branch.estimate({0: {"keep": [1.0] * 24 + [0.0] * 40,
                                "resample": [1.0] * 40 + [0.0] * 24}})
    assert rows[0]["a_hi"] < 0 and branch_estimates.worst_turn(rows) == 0 and branch_estimates.candidates(rows) == []


# -- a real run -------------------------------------------------------------------------------------
def _counts(db: Path) -> dict:
    with duckdb.connect(str(db), read_only=True) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("trajectories", "turns", "tokens", "rewards", "branches",
                          "turn_signals")}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One RL step of the tiny model on FrozenLake, recorded with adapter snapshots."""
    from core.commands import train
    db = tmp_path_factory.mktemp("branch") / "store.duckdb"
    rc = train.main(["--env", "frozenlake", "--model", "tiny", "--algo", "grpo", "--steps", "1",
                     "--group-size", "2", "--tasks-per-step", "1", "--max-turns", "2",
                     "--max-new-tokens", "6", "--eval-every", "0", "--seed", "0",
                     "--lora-targets", "q_proj,v_proj", "--db", str(db), "--quiet"])
    assert rc == 0
    with duckdb.connect(str(db), read_only=True) as con:
        run_id = con.execute("SELECT run_id FROM runs").fetchone()[0]
        traj = con.execute("SELECT traj_id FROM trajectories WHERE num_turns = 2 "
                           "ORDER BY traj_id").fetchone()[0]
    return db, run_id, traj


def test_adapters_are_kept_before_training_and_after_the_last_step(run):
    db, run_id, _ = run
    folder = db.parent / "checkpoints" / run_id
    assert checkpoint.adapter_steps(folder) == [0, 1]
    assert checkpoint.nearest_adapter(folder, 0) == 0 and checkpoint.nearest_adapter(folder, 5) == 1


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "core.branch", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, **kw)


def test_cli_records_continuations_whose_means_are_the_recorded_values(run, tmp_path):
    db, run_id, traj = run
    before = _counts(db)
    out = tmp_path / "labels.jsonl"
    res = _cli("--db", str(db), "--run", run_id, "--traj", traj, "--k", "2", "--seed", "5",
               "--export", str(out))
    assert res.returncode == 0, res.stderr
    assert "adapter of step 0" in res.stdout  # step 1's rollouts were sampled before any update
    after = _counts(db)
    assert after["branches"] - before["branches"] == 2 * 2 * 2
    assert after["trajectories"] - before["trajectories"] == 8
    with duckdb.connect(str(db), read_only=True) as con:
        b = con.execute("SELECT b.turn, b.kind, b.return, t.reward, t.split, t.info, "
                        "b.checkpoint_step FROM branches b JOIN trajectories t "
                        "ON t.run_id = b.run_id AND t.traj_id = b.child_traj_id "
                        "WHERE b.traj_id = ?", [traj]).df()
        sig = con.execute("SELECT turn, name, value FROM turn_signals WHERE traj_id = ? AND "
                          "source = 'branch'", [traj]).df()
        trained = con.execute("SELECT count(*) FILTER (WHERE trained) FROM tokens WHERE "
                              "traj_id IN (SELECT child_traj_id FROM branches)").fetchone()[0]
    assert (b["return"] == b["reward"]).all() and set(b["split"]) == {"branch"}
    assert set(b["checkpoint_step"]) == {0} and trained == 0
    info = json.loads(b["info"].iloc[0])
    assert info["branch"]["parent"] == traj
    got = {(r.turn, r.name): r.value for r in sig.itertuples()}
    for turn in (0, 1):
        mine = b[b["turn"] == turn]
        assert got[(turn, "v")] == pytest.approx(mine[mine["kind"] == "resample"]["return"].mean())
        assert got[(turn, "q")] == pytest.approx(mine[mine["kind"] == "keep"]["return"].mean())
        assert got[(turn, "a")] == pytest.approx(got[(turn, "q")] - got[(turn, "v")])
        assert got[(turn, "q_lo")] <= got[(turn, "q")] <= got[(turn, "q_hi")]
    labels = [json.loads(line) for line in out.read_text().splitlines()]
    assert [d["turn"] for d in labels] == [0, 1] and labels[1]["state"].startswith(labels[0]["state"])
    assert labels[0]["q"] == pytest.approx(got[(0, "q")])

    # the same seed again: the same numbers, and the earlier analysis replaced, not duplicated
    assert branch_cli.main(["--db", str(db), "--run", run_id, "--traj", traj, "--k", "2",
                        "--seed", "5"]) == 0
    assert _counts(db) == after
    with duckdb.connect(str(db), read_only=True) as con:
        again = con.execute("SELECT turn, name, value FROM turn_signals WHERE traj_id = ? AND "
                            "source = 'branch'", [traj]).df()
    # the same values (NaN where a value is undefined, e.g. k_needed at A = 0)
    assert {(r.turn, r.name): r.value for r in again.itertuples()} == pytest.approx(got, nan_ok=True)


def test_a_job_killed_midway_writes_nothing(run):
    db, run_id, traj = run
    before = _counts(db)
    code = kill_at_first_progress("core.branch", "--db", str(db), "--run", run_id, "--traj", traj,
                                  "--k", "3", "--turns", "0", "--seed", "9")
    assert code == -signal.SIGKILL
    assert _counts(db) == before


def test_export_writes_one_parquet_row_per_turn(run, tmp_path):
    import pandas as pd
    db, run_id, traj = run
    job = branch.prepare_job(str(db), run_id, traj, "all", 2, seed=0)   # no model needed
    rows = branch.estimate({0: {"resample": [0.0, 1.0], "keep": [1.0, 1.0]},
                            1: {"resample": [1.0, 1.0], "keep": [0.0, 0.0]}})
    out = branch_export.export(job, rows, str(tmp_path / "labels.parquet"))
    got = pd.read_parquet(out)
    assert got[["turn", "q", "v", "a"]].to_dict("list") == {
        "turn": [0, 1], "q": [1.0, 0.0], "v": [0.5, 1.0], "a": [0.5, -1.0]}
    assert got["action"].tolist() == [r["action"] for r in job.recorded]
    assert got["state"][0] and got["state"][1].startswith(got["state"][0])


@pytest.mark.parametrize("args, message", [
    (["--k", "0"], "--k must be between 1 and"),
    (["--k", "65"], "--k must be between 1 and"),
    (["--turns", "2"], "turn 2 is out of range: the trajectory has turns 0..1"),
    (["--turns", "x"], "--turns must be 'all' or"),
    (["--traj", "nope"], "no trajectory 'nope'"),
    (["--run", "nope"], "no run 'nope'"),
])
def test_bad_input_exits_2_and_writes_nothing(run, capsys, args, message):
    db, run_id, traj = run
    before = _counts(db)
    base = {"--db": str(db), "--run": run_id, "--traj": traj, "--k": "2"}
    base.update(dict(zip(args[::2], args[1::2])))
    assert branch_cli.main([x for kv in base.items() for x in kv]) == 2
    assert message in capsys.readouterr().err
    assert _counts(db) == before


def test_no_adapters_imported_runs_and_broken_replays_are_refused(run, tmp_path, capsys):
    db, run_id, traj = run
    copy = tmp_path / "copy.duckdb"       # the store without its checkpoints folder
    shutil.copy(db, copy)
    res = _cli("--db", str(copy), "--run", run_id, "--traj", traj, "--k", "2")
    assert res.returncode == 2 and "has no saved adapter at or before step 0" in res.stderr
    shutil.copytree(db.parent / "checkpoints", tmp_path / "checkpoints")
    with duckdb.connect(str(copy)) as con:
        con.execute("UPDATE turns SET observation = 'something else' WHERE traj_id = ? AND turn = 1",
                    [traj])
    before = _counts(copy)
    assert branch_cli.main(["--db", str(copy), "--run", run_id, "--traj", traj, "--k", "2"]) == 2
    assert "replay differs from the record at turn 1" in capsys.readouterr().err
    with duckdb.connect(str(copy)) as con:
        con.execute("UPDATE runs SET source = 'import:jsonl'")
    res = _cli("--db", str(copy), "--run", run_id, "--traj", traj, "--k", "2")
    assert res.returncode == 2 and "was imported" in res.stderr
    assert _counts(copy) == before


def test_a_store_shipped_with_its_adapters_beside_it_branches_although_its_checkpoint_dir_is_gone(
        run, tmp_path):
    """A run trained into a checkpoint_dir that did not travel with the store (the sample stores'
    runs trained into an ignored folder) is continued from checkpoints/RUN/adapters/ next to the
    store, where a copy ships the snapshots; the page and the job read the same folder."""
    from storage import evalsets
    db, run_id, traj = run
    copy = tmp_path / "shipped.duckdb"
    shutil.copy(db, copy)
    gone = tmp_path / "trained-elsewhere"
    with duckdb.connect(str(copy)) as con:
        con.execute("UPDATE runs SET config = json_merge_patch(config, ?)",
                    [json.dumps({"checkpoint_dir": str(gone)})])
        config = json.loads(con.execute("SELECT config FROM runs").fetchone()[0])
    assert evalsets.adapter_steps(copy, run_id, config) == []
    with pytest.raises(branch.BranchError, match="trained-elsewhere"):
        branch.prepare_job(str(copy), run_id, traj, "all", 2)
    shipped = tmp_path / "checkpoints" / run_id / checkpoint.ADAPTERS
    shipped.mkdir(parents=True)
    shutil.copy(checkpoint.snapshot_path(db.parent / "checkpoints" / run_id, 0), shipped)
    assert evalsets.adapter_steps(copy, run_id, config) == [0]
    job = branch.prepare_job(str(copy), run_id, traj, "all", 2)
    assert job.ckpt_dir == tmp_path / "checkpoints" / run_id and job.snapshot_step == 0
    # a configured folder that holds snapshots is the one used
    (gone / run_id / checkpoint.ADAPTERS).mkdir(parents=True)
    shutil.copy(shipped / "step-0.pt", gone / run_id / checkpoint.ADAPTERS)
    assert branch.prepare_job(str(copy), run_id, traj, "all", 2).ckpt_dir == gone / run_id


# -- keep must estimate Q(s_t, a_t) on a stochastic world -------------------------------------------
def _lake_returns(env, task, recorded, turn: int, keep: str, k: int = 64):
    """Returns of k resample and k keep continuations from ``turn`` with the lake's own planner as
    the policy (one move per turn: optimal play), and the cells the keep continuations start in."""
    from core.jobs.branch_replay import branch_point
    out, cells = {}, set()
    for kind in branch.KINDS:
        out[kind] = []
        for i in range(k):
            point = branch_point(env, task, 0, recorded, turn, kind,
                                 branch.child_seed(0, turn, kind, i), keep=keep)
            cells |= {point.key} if kind == "keep" else set()
            ep = point.episode
            while not ep.done:
                ep.step(ep.expert_action())
            out[kind].append(ep.outcome().score)
    return out, cells


def test_keep_estimates_q_on_a_slippery_lake_against_value_iteration():
    """The planner's first move is optimal, so the exact A is 0 and V = Q (value iteration). A
    keep continuation that replayed the recorded transition measured r + V(the recorded next
    cell) instead: on these lakes A = -0.19 and -0.38 with intervals below 0, a false verdict."""
    from core.envs.base import make_env
    env = make_env("frozenlake", seed=0, slip=0.5, actions_per_turn=1, max_actions=10)
    tasks = env.tasks("train", 6, 0)
    for task in (tasks[3], tasks[5]):
        lake, start = tuple(task.meta["lake"]), tuple(task.meta["start"])
        ep, recorded = env.episode(task, 0), []
        ep.reset()
        while not ep.done:
            key, action = ep.state_key(), ep.expert_action()
            res = ep.step(action)
            recorded.append({"turn": len(recorded), "action": action, "observation": res.observation,
                             "state_key": key, "action_valid": True})
        move = recorded[0]["action"].removeprefix("<answer>").removesuffix("</answer>")
        planner = env.planner(lake)
        exact_v, exact_q = planner.value(start, 10), planner.q(start, move, 10)
        assert exact_q == pytest.approx(exact_v) and 0.3 < exact_v < 0.5
        returns, cells = _lake_returns(env, task, recorded, 0, "fresh")
        (row,) = branch.estimate({0: returns})
        assert row["v_lo"] <= exact_v <= row["v_hi"] and row["q_lo"] <= exact_q <= row["q_hi"]
        assert row["a_lo"] <= 0 <= row["a_hi"] and branch_estimates.worst_turn([row]) is None
        assert len(cells) >= 2   # the kept move's own slips: the continuations start apart
        # the labelled debugging mode replays the recorded transition: one cell, a biased A
        returns, cells = _lake_returns(env, task, recorded, 0, "recorded")
        (old,) = branch.estimate({0: returns})
        assert len(cells) == 1 and old["a_hi"] < 0 and branch_estimates.worst_turn([old]) == 0
