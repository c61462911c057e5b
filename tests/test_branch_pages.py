"""Replay's Branches panel and Groups' "where values fell" through Streamlit's AppTest, on a copy
of the demo store holding a branch analysis written by storage/branches.py (the job's real write
path); and a branch job launched from the page as its own process, whose refusal the page shows."""
from __future__ import annotations

import shutil
from pathlib import Path
import time

import pandas as pd
import pytest

from pages import _branches
from storage import branches, queries
from tests.app_fixtures import SCRIPT_TRAJ
from tests.test_pages import ROOT, app, demo, texts  # noqa: F401  (AppTest fixtures)

STEP = 4
GROUP = SCRIPT_TRAJ.rsplit("-", 1)[0]


def _analyse(store: str, run_id: str, traj_id: str, returns: dict) -> list[str]:
    """Record an analysis of ``traj_id``: {turn: {kind: [returns]}}; returns the child ids."""
    kids, brows = [], []
    for turn, kinds in returns.items():
        for kind, values in kinds.items():
            for i, r in enumerate(values):
                kid = f"{traj_id}~b{turn}{kind[0]}{i}"
                kids.append(kid)
                brows.append({"traj_id": traj_id, "turn": turn, "kind": kind,
                              "child_traj_id": kid, "return": r, "checkpoint_step": 3,
                              "job_id": "j1", "seed": 0})
    trajs = {"traj_id": kids, "group_id": [k[:-1] for k in kids], "task_id": ["t"] * len(kids),
             "split": ["branch"] * len(kids), "reward": [b["return"] for b in brows],
             "num_turns": [1] * len(kids), "success": [b["return"] > 0 for b in brows],
             "finish_reason": ["done"] * len(kids)}
    turns = {"traj_id": kids, "turn": [0] * len(kids), "action": ["<search>x</search>"] * len(kids),
             "observation": ["obs"] * len(kids), "action_valid": [True] * len(kids)}
    from core.jobs.branch import estimate, worst_turn  # pure functions (numpy only)
    rows = estimate(returns, seed=0)
    worst = worst_turn(rows)
    sig = [{"traj_id": traj_id, "turn": r["turn"], "name": n, "value": float(r[n]),
            "source": "branch"} for r in rows for n in ("v", "q", "a", "v_lo", "v_hi", "q_lo",
                                                        "q_hi", "a_lo", "a_hi", "n",
                                                        "k_needed")]
    sig += [{"traj_id": traj_id, "turn": r["turn"], "name": "worst",
             "value": float(r["turn"] == worst), "source": "branch"} for r in rows]
    branches.write_job(store, run_id, STEP, traj_id, sorted(returns),
                       {"trajectories": trajs, "turns": turns}, pd.DataFrame(brows),
                       pd.DataFrame(sig))
    return kids


@pytest.fixture
def analysed(demo, tmp_path):
    """A copy of the demo store where SCRIPT_TRAJ has branch values: turn 1 lost the reward."""
    base = tmp_path / "stores"
    base.mkdir()
    store = str(base / "demo.duckdb")
    shutil.copy(demo[1], store)
    run = demo[2]["demo-search-starpo"]
    kids = _analyse(store, run, SCRIPT_TRAJ, {0: {"resample": [1.0, 0.0, 1.0, 1.0],
                                                  "keep": [1.0, 1.0, 0.0, 1.0]},
                                              1: {"resample": [1.0, 1.0, 0.0, 1.0],
                                                  "keep": [0.0, 0.0, 0.0, 0.0]}})
    return str(base), store, run, kids


def _snapshot(demo) -> None:
    """An adapter snapshot file where the demo search run's would be (not a loadable one): the
    page then offers the job, which fails when it loads it."""
    folder = Path(demo[1]).parent / "checkpoints" / demo[2]["demo-search-starpo"] / "adapters"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "step-0.pt").write_bytes(b"not an adapter")


def test_replay_says_why_no_branch_job_can_run_before_any_form(app, demo):
    """Imported runs have no adapter to continue with, and a trainer run that kept no snapshot
    neither: the page says so instead of offering a form whose job would only fail."""
    at = app("replay", store=demo[1], run=demo[2]["imported-verl"])
    assert not at.exception
    # one line where the panel can never fill (issue 51, item 6), not a panel with a box
    assert any("recorded by import" in m and "No branch job here" in m
               for m in texts(at, "caption"))
    assert not [n for n in at.number_input if n.key == "branch_k"]
    at = app("replay", store=demo[1], run=demo[2]["demo-apps-rloo"])
    assert not at.exception
    assert any("kept no adapter snapshots" in m for m in texts(at, "caption"))


def test_replay_without_an_analysis_says_not_computed_and_offers_the_job(app, demo):
    _snapshot(demo)
    at = app("replay", store=demo[1], run=demo[2]["demo-search-starpo"], step=STEP,
             traj=SCRIPT_TRAJ)
    assert not at.exception
    assert "Branch values not computed yet for this trajectory." in texts(at, "info")
    assert at.number_input(key="branch_k").value == 8


def test_replay_shows_values_worst_turn_and_opens_a_continuation(app, analysed):
    base, store, run, kids = analysed
    at = app("replay", store_dir=base, store=store, run=run, step=STEP, traj=SCRIPT_TRAJ)
    assert not at.exception
    assert any("The turn that lost the reward: 1" in m for m in texts(at, "markdown"))
    table = next(f.value for f in at.dataframe if "q_lo" in f.value.columns)
    assert table["v"].tolist() == [0.75, 0.75] and table["q"].tolist() == [0.75, 0.0]
    assert any("16 continuations, sampled with the adapter of step 3" in c
               for c in texts(at, "caption"))
    at = app("replay", store_dir=base, store=store, run=run, step=STEP, traj=kids[-1])
    assert not at.exception
    assert any(f"A continuation of {SCRIPT_TRAJ[:2]}" in c for c in texts(at, "caption"))


def test_replay_names_no_turn_when_every_interval_reaches_zero(app, demo, tmp_path):
    """One keep of four solved against two of four resamples: A = -0.25 with an interval that
    reaches 0. Replay once said "The turn that lost the reward" in bold for such a turn; now it
    says no turn is shown to have lost it and lists the candidate with the K it would take."""
    base = tmp_path / "stores"
    base.mkdir()
    store = str(base / "demo.duckdb")
    shutil.copy(demo[1], store)
    run = demo[2]["demo-search-starpo"]
    _analyse(store, run, SCRIPT_TRAJ, {0: {"resample": [1.0, 1.0, 0.0, 0.0],
                                           "keep": [1.0, 0.0, 0.0, 0.0]}})
    at = app("replay", store_dir=str(base), store=store, run=run, step=STEP, traj=SCRIPT_TRAJ)
    assert not at.exception
    shown = texts(at, "markdown")
    assert not any("The turn that lost the reward" in m for m in shown)
    assert any("the interval for A of turn 0 ([" in m and "still reaches 0" in m for m in shown)
    cand = next(f.value for f in at.dataframe if "K to tell (per kind, about)" in f.value.columns)
    assert cand["turn"].tolist() == [0] and cand["a"].tolist() == [-0.25]
    needed = int(cand["K to tell (per kind, about)"].iloc[0])
    assert needed > 4
    # with a snapshot to continue from, the form is set to run what would tell: one click away
    folder = base / "checkpoints" / run / "adapters"
    folder.mkdir(parents=True)
    (folder / "step-0.pt").write_bytes(b"not an adapter")
    at = app("replay", store_dir=str(base), store=store, run=run, step=STEP, traj=SCRIPT_TRAJ)
    assert not at.exception
    assert at.number_input(key="branch_k").value == min(needed, _branches.MAX_K)
    assert at.text_input(key="branch_turns").value == "0"


def test_the_sentence_under_the_values_is_computed_from_their_intervals(app):
    """README step 11: the FrozenLake fall, turn 2's interval for A [0.028, 0.257] lies above 0,
    and the page said "every interval for A still reaches 0"; a "No branch job here" box stood
    above the values that an earlier job computed (the store keeps no adapter snapshots)."""
    store = str(ROOT / "sample_runs" / "branch_failures.duckdb")
    at = app("replay", store_dir=str(ROOT / "sample_runs"), store=store,
             run="20261203-233011-02a957", step=53, traj="s53-g1-r1", turn=3)
    assert not at.exception, at.exception
    est = queries.branch_estimates(store, "20261203-233011-02a957", "s53-g1-r1")
    above = est[est["a_lo"] > 0]
    assert above["turn"].tolist() == [2]
    said = [m for m in texts(at, "markdown") if "No turn is shown" in m]
    assert len(said) == 1 and "every interval" not in said[0], said
    assert "turn 1 ([-0.142, 0.041])" in said[0] and "still reaches 0" in said[0]
    assert "The interval of turn 2 ([0.028, 0.257]) lies above 0" in said[0]


def test_values_an_earlier_job_computed_come_first_then_why_no_job_runs(app, analysed):
    """A run whose adapter snapshots are not next to its store: its branch values were shown
    under a "No branch job here" box, which read as if there were none."""
    base, store, run, _ = analysed
    at = app("replay", store_dir=base, store=store, run=run, step=STEP, traj=SCRIPT_TRAJ)
    assert not at.exception
    assert _branches.cannot_branch  # the demo run kept no snapshot: no job can run
    assert not any("No branch job here" in i for i in texts(at, "info"))
    captions = texts(at, "caption")
    kids = [c for c in captions if c.startswith("16 continuations, sampled with")]
    why = [c for c in captions if "computed by an earlier branch job" in c]
    assert kids and why and "kept no adapter snapshots" in why[0]
    assert captions.index(why[0]) > captions.index(kids[0])       # under the values


def test_groups_counts_where_values_fell(app, analysed):
    base, store, run, _ = analysed
    at = app("groups", store_dir=base, store=store, run=run, step=STEP, group=GROUP)
    assert not at.exception
    table = next(f.value for f in at.dataframe
                 if "rollouts whose value fell most here" in f.value.columns)
    assert table.to_dict("list") == {"turn": [1], "rollouts whose value fell most here": [1]}


def test_a_job_launched_from_the_page_runs_apart_and_its_refusal_is_shown(app, demo):
    _snapshot(demo)
    at = app("replay", store=demo[1], run=demo[2]["demo-search-starpo"], step=STEP,
             traj=SCRIPT_TRAJ)
    at.number_input(key="branch_k").set_value(2)
    at.button[[b.label for b in at.button].index("Start the branch job")].click().run()
    job = _branches.current()
    assert job is not None and job["traj_id"] == SCRIPT_TRAJ
    deadline = time.time() + 120
    while _branches.current()["alive"] and time.time() < deadline:
        time.sleep(0.5)
    assert _branches.current()["exit"] != 0   # the snapshot is not a loadable adapter
    at.run()
    assert "The last branch job on this trajectory did not record anything:" in texts(at, "error")
    # the job's error text wraps inside the page instead of running off it
    (log,) = [c for c in at.code if c.value.startswith("error: ")]
    assert log.proto.wrap_lines
    assert queries.branch_children(demo[1], demo[2]["demo-search-starpo"], SCRIPT_TRAJ).empty


def test_bad_turns_or_k_are_refused_before_a_process_starts():
    with pytest.raises(Exception, match="turns"):
        _branches.launch("s.duckdb", "r", "t", "1;rm", 2, 0)
    with pytest.raises(Exception, match="K must be"):
        _branches.launch("s.duckdb", "r", "t", "all", 0, 0)
