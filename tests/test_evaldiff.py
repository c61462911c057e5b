"""Checkpoint A vs B (storage/evaldiff.py and the Compare page): the sample search run's
"13 gained, 0 lost" reproduced from the store, pairing by task and seed, differing task sets,
first divergence, aggregates, and the page through AppTest with its deep link."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from storage import evaldiff, queries
from tests.test_pages import app, demo  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parent.parent
SEARCH = str(ROOT / "sample_runs" / "search_smollm2.duckdb")
RUN = "20261129-233052-4ded2d"           # SFT then 10 GRPO steps; evaluated at 20, 25, 30


def test_sample_search_run_gains_13_and_loses_0():
    d = queries.eval_diff(SEARCH, (RUN, 20), (RUN, 30))
    assert d["counts"] == {"gained": 13, "lost": 0, "kept": 10, "unsolved": 77}
    assert d["solved"] == {"A": 10, "B": 23}
    assert d["coverage"]["same"] and d["coverage"]["shared"] == 100
    assert d["p_value"] == pytest.approx(2 * 0.5 ** 13)
    gained = d["paired"][d["paired"]["change"] == "gained"]
    assert "capital>mayor:Giakrohae" in set(gained["task_id"])
    assert (gained["class_b"] == "success").all() and (gained["class_a"] != "success").all()
    # The transition table's success column holds the gained tasks plus the kept ones.
    assert d["transitions"]["success"].sum() == 23
    assert d["transitions"].loc["success"].drop("success", errors="ignore").sum() == 0
    agg = d["aggregates"].set_index("measure")
    # sample_runs/README: 15 looping episodes after SFT, none after RL.
    assert agg.loc["repeated actions per task", "B"] < agg.loc["repeated actions per task", "A"]
    assert agg.loc["solved (fraction)", "shift (B - A)"] == pytest.approx(0.13)


def _traj(side, task, seed, success, cls="wrong", traj=None):
    return {"side": side, "run_id": "r", "step": 1 if side == "A" else 2,
            "traj_id": traj or f"{side}-{task}-{seed}", "task_id": task, "seed": seed,
            "success": success, "failure_class": "success" if success else cls,
            "num_turns": 2, "answer": "x", "finish_reason": "answered"}


def test_pairing_uses_task_and_seed_and_reports_what_differs():
    traj = pd.DataFrame([
        _traj("A", "t1", "1", False), _traj("B", "t1", "1", True),     # gained
        _traj("A", "t2", "2", True), _traj("B", "t2", "2", False, "loop"),  # lost
        _traj("A", "t3", "3", False), _traj("B", "t3", "9", True),     # same task, other seed
        _traj("A", "t4", "4", True),                                   # only in A
    ])
    paired = evaldiff.pair(traj)
    assert dict(zip(paired["task_id"], paired["change"])) == {"t1": "gained", "t2": "lost"}
    cov = evaldiff.coverage(traj)
    assert not cov["same"] and cov["shared"] == 2 and cov["seeds_differ"] == 1
    assert cov["only_a"] == 2 and cov["only_b"] == 1
    moved = evaldiff.transitions(paired)
    assert moved.loc["success", "loop"] == 1 and moved.loc["wrong", "success"] == 1


def test_several_rollouts_count_as_solved_at_half_or_more():
    traj = pd.DataFrame([_traj("A", "t", "1", s, traj=f"a{i}") for i, s in
                         enumerate([True, False, False])]
                        + [_traj("B", "t", "1", s, traj=f"b{i}") for i, s in
                           enumerate([True, True, False])])
    assert evaldiff.pair(traj)["change"].tolist() == ["gained"]


def test_first_divergence_and_repeated_actions():
    a = pd.DataFrame({"turn": [0, 1, 2], "action": ["s q", "s q2", "ans"],
                      "observation": ["o", "o2", ""]})
    same = a.copy()
    other = a.assign(action=["s q", "s other", "ans"])
    shorter = a.iloc[:2]
    assert evaldiff.first_divergence(a, same) is None
    assert evaldiff.first_divergence(a, other) == 1
    assert evaldiff.first_divergence(a, shorter) == 2
    assert evaldiff.repeated_actions(["a", "b", "a", " a ", "c"]) == 2
    assert evaldiff.sign_test(0, 0) == 1.0 and evaldiff.sign_test(3, 3) == 1.0


def test_missing_evaluation_is_a_clear_error():
    with pytest.raises(ValueError, match="no evaluation at"):
        queries.eval_diff(SEARCH, (RUN, 20), (RUN, 21))


# -- the page --------------------------------------------------------------------------------------
def test_compare_page_reproduces_the_sample_and_keeps_its_deep_link(app):
    at = app("compare", store_dir=str(ROOT / "sample_runs"), store=SEARCH, run=RUN,
             a=f"{RUN}:20", b=f"{RUN}:30", task="capital>mayor:Giakrohae")
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["gained"] == "13" and metrics["lost"] == "0"
    assert metrics["solved in A"] == "10 / 100" and metrics["solved in B"] == "23 / 100"
    assert not at.warning                                    # same tasks and seeds
    assert any(cap.value.startswith("One run at two steps: B (step 30) is 10 steps after A")
               for cap in at.caption)
    tasks = next(f.value for f in at.dataframe if "change" in f.value.columns)
    assert sorted(tasks["change"].unique()) == ["gained"] and len(tasks) == 13
    assert at.query_params["a"] == f"{RUN}:20" and at.query_params["b"] == f"{RUN}:30"
    assert at.query_params["task"] == "capital>mayor:Giakrohae"
    # The side-by-side shows both trajectories' divergent turn as code (escaped text).
    links = [e.proto.label for e in at.get("page_link")]
    assert any("e20-g12-r0" in label for label in links)
    assert any("e30-g12-r0" in label for label in links)
    assert any("<answer>" in block.value for block in at.code)


def test_compare_page_warns_when_task_sets_differ(app):
    other = "20261129-215645-4187b5"
    at = app("compare", store_dir=str(ROOT / "sample_runs"), store=SEARCH, run=RUN,
             a=f"{other}:20", b=f"{RUN}:30")
    assert not at.exception, at.exception
    # Both runs were evaluated on the same 100 tasks and seeds: no warning, 6 gained 1 lost.
    metrics = {m.label: m.value for m in at.metric}
    assert not at.warning and metrics["gained"] == "6" and metrics["lost"] == "1"


@pytest.mark.parametrize("store", sorted(str(p) for p in (ROOT / "sample_runs").glob("*.duckdb")))
def test_compare_page_renders_on_every_sample_store(app, store):
    runs = queries.runs(store)
    at = app("compare", store_dir=str(ROOT / "sample_runs"), store=store,
             run=runs["run_id"].iloc[-1])
    assert not at.exception, at.exception
    evals = queries.evaluations(store)
    if evals.empty:
        assert any("No held-out evaluation" in i.value for i in at.info)
    else:
        assert {m.label for m in at.metric} >= {"gained", "lost"}
