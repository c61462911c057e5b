"""Alarms that mean something: no repeat alarm where repeating is the solution, no gradient
spike at a norm of about 0, alarm lines labelled by kind, and on the committed sample runs the
alarms the README talks about (and no other).

The repeat share is recorded by the trainer (core/rollout/diagnostics.py); the Dynamics page turns it
into alarms (pages/_signals.py) with the run's config (single-turn runs never raise it).
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import streamlit as st
import streamlit.testing.v1.app_test as app_test
from streamlit.runtime.pages_manager import PagesManager
from streamlit.testing.v1 import AppTest

from core.rollout.diagnostics import repeat_frac, rollout_metrics
from core.envs.base import Outcome, Task
from core.rollout.trajectory import Trajectory, Turn
from pages import _signals
from storage import queries

ROOT = Path(__file__).resolve().parent.parent
COLLAPSE = ROOT / "sample_runs" / "collapse_bandit.duckdb"
SPIKE = ROOT / "sample_runs" / "spike_frozenlake.duckdb"


def _wide(store: Path, name: str) -> tuple[str, dict, pd.DataFrame]:
    """(run_id, config, metrics one row per step) of the run called ``name`` in ``store``."""
    run = queries.runs(store).set_index("name").loc[name]
    long = queries.metrics(store, run["run_id"])
    wide = long.pivot_table(index="step", columns="name", values="value", aggfunc="last")
    return run["run_id"], queries.run_config(run["config"]), wide.sort_index()


# -- repeats -------------------------------------------------------------------------------------
def _traj(traj_id: str, group: str, actions: list[str], success: bool) -> Trajectory:
    t = Trajectory(traj_id=traj_id, group_id=group, task=Task("t", "q"))
    t.turns = [Turn(turn=k, action=a, observation="", valid=True) for k, a in enumerate(actions)]
    t.reward = float(success)
    t.outcome = Outcome(score=float(success), success=success)
    return t


def test_repeats_of_a_solution_are_not_failed_repeats():
    # group g: three rollouts give the same solved answer, one another; group h: two loop on a
    # failed search, one differs
    trajs = [_traj("a", "g", ["<answer>Dragon</answer>"], True),
             _traj("b", "g", ["<answer>Dragon</answer>"], True),
             _traj("c", "g", ["<answer>Dragon</answer>"], True),
             _traj("d", "g", ["<answer>Phoenix</answer>"], False),
             _traj("e", "h", ["<search>x</search>", "<search>x</search>"], False),
             _traj("f", "h", ["<search>x</search>", "<search>x</search>"], False),
             _traj("g", "h", ["<search>y</search>", "<answer>z</answer>"], False)]
    assert repeat_frac(trajs) == 5 / 7                         # every verbatim repeat
    assert repeat_frac(trajs, failed_only=True) == 2 / 7       # only e and f: a failed loop
    assert rollout_metrics(trajs)["collapse/repeat_fail_frac"] == 2 / 7


def test_no_repeat_alarm_on_a_single_turn_run():
    wide = pd.DataFrame({"collapse/repeat_frac": [0.2, 0.9, 0.9],
                         "success/rate": [0.1, 0.1, 0.1]}, index=[1, 2, 3])
    assert [a["step"] for a in _signals.collapse_alarms(wide)] == [2]    # multi-turn: a loop
    assert _signals.collapse_alarms(wide, single_turn=True) == []
    assert _signals.single_turn({"max_turns": 1}) and not _signals.single_turn({"max_turns": 4})
    assert not _signals.single_turn({})                                   # imported: unknown


def test_repeat_alarm_counts_failed_repeats_only():
    # recorded by the trainer: the failed share itself
    wide = pd.DataFrame({"collapse/repeat_frac": [0.9, 0.9, 0.9],
                         "collapse/repeat_fail_frac": [0.0, 0.6, 0.7]}, index=[1, 2, 3])
    assert [(a["step"], a["kind"]) for a in _signals.collapse_alarms(wide)] == [(2, "repeats")]
    # recorded before it: repeats beyond the successes (a lower bound of the failed ones)
    wide = pd.DataFrame({"collapse/repeat_frac": [0.7, 0.7, 0.9],
                         "success/rate": [0.7, 0.6, 0.1]}, index=[1, 2, 3])
    assert [a["step"] for a in _signals.collapse_alarms(wide)] == [3]


# -- spikes --------------------------------------------------------------------------------------
def test_no_spike_at_a_norm_of_about_zero():
    quiet = [0.0013, 0.0012, 0.0009, 0.0014, 0.0015, 0.0019]
    sp = _signals.spike_threshold(pd.Series(quiet + [0.0071], index=range(7)))
    assert not sp["spike"].any() and sp["threshold"].iloc[-1] == _signals.SPIKE_FLOOR
    sp = _signals.spike_threshold(pd.Series(quiet + [1.39], index=range(7)))
    assert sp["spike"].tolist() == [False] * 6 + [True]       # a blow-up still is one


def test_spike_run_flags_its_blow_up_not_the_quiet_steps_after_it():
    _, _, wide = _wide(SPIKE, "frozenlake-grpo-spike")
    sp = _signals.spike_threshold(wide["grad/norm"])
    assert sp.index[sp["spike"]].tolist() == [27, 28]          # 1.39 and 1.53; not 0.007, 0.005


# -- the sample runs, as the Dynamics page shows them ---------------------------------------------
class _NavigationPagesManager(PagesManager):
    """The served app's navigation mode for AppTest (as in tests/test_pages.py)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        PagesManager.uses_pages_directory = False


def _dynamics(monkeypatch, store: Path, run_id: str) -> AppTest:
    monkeypatch.setattr(app_test, "PagesManager", _NavigationPagesManager)
    monkeypatch.setenv(queries.STORE_DIRS_ENV, str(store.parent))
    monkeypatch.chdir(ROOT)
    st.cache_data.clear()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    at.query_params.update({"store": str(store), "run": run_id})
    at = at.switch_page("pages/dynamics.py").run()
    assert not at.exception, at.exception
    return at


def _alarm_lines(at: AppTest) -> set[str]:
    specs = [json.loads(e.proto.spec) for e in at.get("plotly_chart")]
    return {t.get("name") for f in specs for t in f["data"] if str(t.get("name")).endswith("alarm")}


@pytest.mark.parametrize("name", ["bandit-dr_grpo"])
def test_the_run_that_learns_raises_no_alarm(monkeypatch, name):
    """The workshop-demo preset with Dr.GRPO learns the better arm: nothing to alarm about
    (the repeat alarm fired at its first RL step: two answers, eight rollouts a group)."""
    run_id, config, wide = _wide(COLLAPSE, name)
    assert _signals.single_turn(config)
    assert _signals.collapse_alarms(wide, single_turn=True) == []
    at = _dynamics(monkeypatch, COLLAPSE, run_id)
    assert not [w.value for w in at.warning if w.value.startswith("Collapse alarm")]
    assert _alarm_lines(at) == set()


def test_grpo_collapse_run_lists_the_readme_alarm_first(monkeypatch):
    """README step 5: the alarm is drawn where std and entropy are both under half their best
    (step 71)."""
    run_id, _, _ = _wide(COLLAPSE, "bandit-grpo")
    at = _dynamics(monkeypatch, COLLAPSE, run_id)
    shown = [w.value for w in at.warning if w.value.startswith("Collapse alarm")]
    assert shown[0].startswith("Collapse alarm at step 71 (std+entropy):"), shown
    assert not any("(repeats)" in w for w in shown)
    assert _alarm_lines(at) == {"std+entropy alarm"}             # labelled by kind
