"""The committed branch analyses of real failures (sample_runs/branch_failures.duckdb, made by
``bash sample_runs/make.sh branches``; sample_runs/search_sft60.duckdb, ``make.sh search_sft``),
read through storage/ like the app reads them.

For each analysed failure (the FrozenLake trajectory that fell into a hole, the apps trajectory
with collateral damage, the SmolLM2 search trajectory that answered a two-hop question after one
search), picked by the same rule make.sh used (sample_runs/pick_failure.py):

* every turn was analysed with K continuations of each kind (64 on the lake, else 8), by the
  adapter that sampled it (an RL trajectory of step s: the adapter after step s - 1; a held-out
  one: its own step's), and that adapter ships beside the store (sample_runs/checkpoints/);
* the recorded V and Q of each turn are the means of the stored continuation returns of that turn
  and kind (``branches`` rows), each return is its continuation trajectory's reward, A = Q - V;
* the intervals bracket the means; ``worst`` marks the lowest A whose interval lies below 0;
* on the slippery lake the fall was the ice's: keeping the move that slipped into the hole
  draws its slip afresh and mostly does not fall, and no turn is named; on apps the worst turn
  is the one whose write the failed ``no_collateral_damage`` test names.

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
CASES = {"frozenlake": (STORE, "frozenlake-branch", "hole", 64),
         "apps": (STORE, "apps-branch", "collateral_damage", 8),
         "search": (SEARCH, SEARCH_RUN, "one_hop_answer", 8)}
"""(store, run name, failure kind, K continuations per turn and kind) as make.sh ran them."""


def _picker():
    spec = importlib.util.spec_from_file_location("pick_failure",
                                                  ROOT / "sample_runs" / "pick_failure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    store, run_name, kind, k = CASES[request.param]
    found = _picker().pick(store, run_name, kind)
    assert found is not None, f"no {kind} failure in run {run_name}"
    run_id, traj_id = found
    traj = queries.trajectory(store, run_id, traj_id)
    est = turn_queries.branch_estimates(store, run_id, traj_id).set_index("turn")
    kids = turn_queries.branch_children(store, run_id, traj_id)
    trajs = queries.trajectories(store, run_id)
    rewards = trajs.set_index("traj_id")["reward"]
    return {"env": request.param, "k": k, "run_id": run_id, "traj": traj, "est": est, "kids": kids,
            "rewards": rewards, "turns": queries.turns(store, run_id, [traj_id])}


def test_every_turn_was_analysed_with_k_continuations_of_each_kind(case):
    traj, est, kids = case["traj"], case["est"], case["kids"]
    assert list(est.index) == list(range(int(traj["num_turns"])))
    assert (est["n"] == case["k"]).all()
    counts = kids.groupby(["turn", "kind"]).size()
    assert set(counts.index) == {(t, k) for t in est.index for k in ("keep", "resample")}
    assert (counts == case["k"]).all()
    # an RL trajectory of step s was sampled by the adapter after step s - 1 (kept every step),
    # a held-out one by the adapter of its own step (kept at every evaluation)
    own = int(traj["step"]) - (0 if traj["split"] == "eval" else 1)
    assert set(kids["checkpoint_step"]) == {own}
    if case["env"] != "search":  # the tiny model's adapters ship (SmolLM2's are 20 MB: not)
        shipped = Path(STORE).parent / "checkpoints" / case["run_id"] / "adapters"
        assert (shipped / f"step-{own}.pt").is_file()
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
    """Every interval brackets its mean; where there is none (NaN: returns that are not all 0/1
    and all equal, so a bootstrap would claim a certainty it has not got) the kind's returns are
    indeed all equal."""
    est, kids = case["est"], case["kids"]
    kind_of = {"v": ["resample"], "q": ["keep"], "a": ["keep", "resample"]}
    for name in ("v", "q", "a"):
        lo, hi = est[f"{name}_lo"], est[f"{name}_hi"]
        assert (lo.isna() == hi.isna()).all(), name
        shown = lo.notna()
        assert (lo[shown] <= est.loc[shown, name] + 1e-12).all(), name
        assert (est.loc[shown, name] <= hi[shown] + 1e-12).all(), name
        for turn in est.index[~shown]:
            mine = kids[(kids["turn"] == turn) & kids["kind"].isin(kind_of[name])]
            for _, returns in mine.groupby("kind")["return"]:
                assert returns.nunique() == 1, (name, turn)


def test_worst_marks_the_lowest_a_whose_interval_lies_below_zero(case):
    """The verdict: a turn is named only when its whole interval for A is below 0; otherwise
    the turns with A < 0 are candidates, each with the K that would tell."""
    est = case["est"]
    assert (est["a"] < 0).any(), "no turn of this failure lost value"
    lost = est[est["a_hi"] < 0]
    # what Replay names (the search job was recorded before this rule: its ``worst`` marks the
    # lowest A < 0 even where the interval reaches 0, and it has no k_needed; the page checks)
    named = list(est.index[(est["worst"] == 1.0) & (est["a_hi"] < 0)])
    if lost.empty:
        assert named == []
        maybe = est[(est["a"] < 0) & est["k_needed"].notna()]
        assert case["env"] == "search" or not maybe.empty
        assert (maybe["k_needed"] > maybe["n"]).all()
    else:
        assert named == [lost.sort_values("a", kind="stable").index[0]]
        assert list(est.index[est["worst"] == 1.0]) == named


def test_on_the_slippery_lake_the_fall_was_the_ice_and_keep_draws_the_slip_afresh():
    """The lake is slippery (slip 0.2): the recorded last move was meant Right and the ice took it
    Up into the hole. Keep continuations draw that move's slip afresh, so they do not all fall:
    they estimate Q of the move, not of the recorded transition (which returns 0 every time),
    and the fall is not named the turn that lost the reward."""
    _, run_name, kind, _ = CASES["frozenlake"]
    run_id, traj_id = _picker().pick(STORE, run_name, kind)
    turns = queries.turns(STORE, run_id, [traj_id]).sort_values("turn")
    last = turns.iloc[-1]
    assert "fell into a hole" in last["observation"]
    (moved,) = json.loads(last["info"])["executed"]
    assert moved["intended"] != moved["actual"]  # the fall was a slip
    hole = int(last["turn"])
    kids = turn_queries.branch_children(STORE, run_id, traj_id)
    kept = kids[(kids["turn"] == hole) & (kids["kind"] == "keep")]
    ends = queries.turns(STORE, run_id, list(kept["child_traj_id"])).sort_values("turn")
    ends = ends.groupby("traj_id")["observation"].last()
    fell = int(ends.str.contains("fell into a hole").sum())
    assert 0 < fell < len(kept) // 2  # the same move again falls only when the ice says so
    est = turn_queries.branch_estimates(STORE, run_id, traj_id).set_index("turn")
    assert est.loc[hole, "q"] > 0 and est.loc[hole, "worst"] == 0.0
    assert not (est["a_hi"] < 0).any()  # and no turn is named at K = 64


def test_the_apps_worst_turn_made_the_unrequested_change():
    _, run_name, kind, _ = CASES["apps"]
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
