"""The committed branch analyses of real failures (sample_runs/branch_failures.duckdb, made by
``bash sample_runs/make.sh branches``; sample_runs/search_sft60.duckdb, ``make.sh search_sft``),
read through storage/ like the app reads them.

For each analysed failure (the FrozenLake trajectory that fell into a hole, the apps trajectory
with collateral damage, the SmolLM2 search trajectory that answered a two-hop question after one
search), picked by the same rule make.sh used (sample_runs/pick_failure.py):

* every turn was analysed with K = 8 continuations of each kind, by the adapter that sampled it
  (an RL trajectory of step s: the adapter after step s - 1; a held-out one: its own step's);
* the recorded V and Q of each turn are the means of the stored continuation returns of that turn
  and kind (``branches`` rows), each return is its continuation trajectory's reward, A = Q - V;
* the intervals bracket the means; ``worst`` marks the lowest negative A, and nothing else;
* on FrozenLake the hole turn is the worst turn (keeping the move that fell in returns 0); on
  apps the worst turn is the one whose write the failed ``no_collateral_damage`` test names.

The estimator itself (a hand-built world with a known bad turn) is tested in tests/test_branch.py.
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

from storage import queries, turn_queries

ROOT = Path(__file__).resolve().parent.parent
STORE = str(ROOT / "sample_runs" / "branch_failures.duckdb")
SEARCH = str(ROOT / "sample_runs" / "search_sft60.duckdb")
SEARCH_RUN = "search-smollm2: 60 SFT steps (held-out every 20), then GRPO"
CASES = {"frozenlake": (STORE, "frozenlake-branch", "hole"),
         "apps": (STORE, "apps-branch", "collateral_damage"),
         "search": (SEARCH, SEARCH_RUN, "one_hop_answer")}
K = 8


def _picker():
    spec = importlib.util.spec_from_file_location("pick_failure",
                                                  ROOT / "sample_runs" / "pick_failure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    store, run_name, kind = CASES[request.param]
    found = _picker().pick(store, run_name, kind)
    assert found is not None, f"no {kind} failure in run {run_name}"
    run_id, traj_id = found
    traj = queries.trajectory(store, run_id, traj_id)
    est = turn_queries.branch_estimates(store, run_id, traj_id).set_index("turn")
    kids = turn_queries.branch_children(store, run_id, traj_id)
    trajs = queries.trajectories(store, run_id)
    rewards = trajs.set_index("traj_id")["reward"]
    return {"env": request.param, "run_id": run_id, "traj": traj, "est": est, "kids": kids,
            "rewards": rewards, "turns": queries.turns(store, run_id, [traj_id])}


def test_every_turn_was_analysed_with_k_continuations_of_each_kind(case):
    traj, est, kids = case["traj"], case["est"], case["kids"]
    assert list(est.index) == list(range(int(traj["num_turns"])))
    assert (est["n"] == K).all()
    counts = kids.groupby(["turn", "kind"]).size()
    assert set(counts.index) == {(t, k) for t in est.index for k in ("keep", "resample")}
    assert (counts == K).all()
    # an RL trajectory of step s was sampled by the adapter after step s - 1 (kept every step),
    # a held-out one by the adapter of its own step (kept at every evaluation)
    own = int(traj["step"]) - (0 if traj["split"] == "eval" else 1)
    assert set(kids["checkpoint_step"]) == {own}
    assert kids["job_id"].nunique() == 1


def test_recorded_v_and_q_are_the_means_of_the_stored_continuation_returns(case):
    est, kids, rewards = case["est"], case["kids"], case["rewards"]
    # each stored return is its continuation's own reward, as the trainer scored it
    assert np.allclose(kids["return"], rewards.loc[kids["child_traj_id"]].to_numpy())
    for turn, row in est.iterrows():
        mine = kids[kids["turn"] == turn]
        assert row["v"] == pytest.approx(mine[mine["kind"] == "resample"]["return"].mean())
        assert row["q"] == pytest.approx(mine[mine["kind"] == "keep"]["return"].mean())
        assert row["a"] == pytest.approx(row["q"] - row["v"])


def test_the_intervals_bracket_the_means(case):
    est = case["est"]
    for name in ("v", "q", "a"):
        assert (est[f"{name}_lo"] <= est[name] + 1e-12).all(), name
        assert (est[name] <= est[f"{name}_hi"] + 1e-12).all(), name


def test_worst_marks_the_lowest_negative_a(case):
    est = case["est"]
    lost = est[est["a"] < 0]
    assert not lost.empty, "no turn of this failure lost value"
    want = lost.sort_values("a", kind="stable").index[0]  # the earliest among equals
    assert list(est.index[est["worst"] == 1.0]) == [want]
    assert (est.drop(index=want)["worst"] == 0.0).all()


def test_the_frozenlake_hole_turn_is_the_worst_turn():
    _, run_name, kind = CASES["frozenlake"]
    run_id, traj_id = _picker().pick(STORE, run_name, kind)
    turns = queries.turns(STORE, run_id, [traj_id]).sort_values("turn")
    hole = int(turns["turn"].iloc[-1])
    assert "fell into a hole" in turns["observation"].iloc[-1]
    est = turn_queries.branch_estimates(STORE, run_id, traj_id).set_index("turn")
    # keeping the move that fell in ends the episode there: every keep continuation returns 0
    assert est.loc[hole, "q"] == 0.0 and est.loc[hole, "q_hi"] == 0.0
    assert est.loc[hole, "worst"] == 1.0
    assert est.loc[hole, "a_hi"] < 0  # the drop is clear: the whole interval is below 0


def test_the_apps_worst_turn_made_the_unrequested_change():
    _, run_name, kind = CASES["apps"]
    run_id, traj_id = _picker().pick(STORE, run_name, kind)
    tests = queries.test_results(STORE, run_id, [traj_id])
    named = tests[tests["name"] == "no_collateral_damage"]
    assert not named["passed"].iloc[0]
    table, key = re.search(r"(\w+)#(\w+)", named["detail"].iloc[0]).groups()  # "emails#43"
    turns = queries.turns(STORE, run_id, [traj_id])
    diffs = {int(t.turn): json.loads(t.state_diff) for t in turns.itertuples()
             if isinstance(t.state_diff, str)}
    touched = [turn for turn, diff in sorted(diffs.items())
               if any(ch.get("table") == table and str(ch.get("key")) == key for ch in diff)]
    est = turn_queries.branch_estimates(STORE, run_id, traj_id).set_index("turn")
    assert list(est.index[est["worst"] == 1.0]) == touched
    assert est.loc[touched[0], "a_hi"] < 0
