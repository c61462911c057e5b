"""The corridor's credit grid (sample_runs/credit_corridor.duckdb, sample_runs/credit.md section
14) holds what the text says: every method from one SFT start (PPO from its own, with the value
head), differing only by the method's flags and the seed, at the recorded budget; a start that
arrives sometimes; the table's figures are the store's (bench/credit_grid.py reads them); the
corridor-credit preset is the grid's GiGPO setting; walkthrough step 18's walk is the store's."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from storage import queries
from tests.test_credit_grid import METHOD_FIELDS, PER_RUN, grid, preset_is_recorded

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "sample_runs" / "credit_corridor.duckdb"
OPTIONS = "size=6,slack=4,expert=uniform"


@pytest.fixture(scope="module")
def runs():
    if not STORE.exists():
        pytest.skip("credit_corridor.duckdb is not recorded: bash sample_runs/make.sh "
                    "credit_corridor")
    return queries.runs(str(STORE))


def test_every_run_starts_from_its_sft_start_and_differs_only_by_its_method(runs):
    starts = runs[runs["name"].str.startswith("corridor credit start")]
    start_of = {}
    for _, row in starts.iterrows():
        cfg = queries.run_config(row["config"])
        assert (cfg["sft_steps"], cfg["steps"], cfg["env_options"]) == (30, 0, OPTIONS)
        start_of["ppo" if "ppo" in row["name"] else "other"] = row["run_id"]
    assert set(start_of) == {"ppo", "other"}
    others = runs.drop(starts.index)
    named = [grid().NAME.match(str(n)) for n in others["name"]]
    assert all(named) and len(others) == 27
    assert {(m["method"], m["seed"]) for m in named} == {
        (method, str(seed)) for method in grid().ORDER for seed in range(3)}
    base = None
    for _, row in others.iterrows():
        cfg = queries.run_config(row["config"])
        assert start_of["ppo" if cfg["algo"] == "ppo" else "other"] in cfg["init_from"]
        assert (cfg["steps"], cfg["lr"], cfg["env_options"], cfg["eval_temperature"]) == (
            30, 5e-4, OPTIONS, 1.0), row["name"]
        same = {k: v for k, v in cfg.items() if k not in METHOD_FIELDS | PER_RUN | {"init_from"}}
        base = base or same
        assert same == base, row["name"]


def test_the_start_arrives_sometimes_but_far_from_always(runs):
    """pass@1 well below 1 and pass@G above 0: the start's sampled held-out success, and every
    run's first RL step (before any update)."""
    for _, row in runs.iterrows():
        m = queries.metrics(str(STORE), row["run_id"], ["success/rate", "success/pass@G",
                                                        "eval/success"])
        wide = m.pivot_table(index="step", columns="name", values="value")
        if row["name"].startswith("corridor credit start"):
            assert 0.1 <= wide.loc[30, "eval/success"] <= 0.6, row["name"]
            continue
        first = wide.loc[31]
        assert first["success/pass@G"] > 0 and first["success/rate"] < 0.6, row["name"]


def test_the_readme_table_is_the_stores(runs):
    by_method, start = grid().curves(str(STORE))
    text = (ROOT / "sample_runs" / "credit.md").read_text(encoding="utf-8")
    section = text[text.index("## 14. "):]
    assert f"{start[30]:.2f}" in section[:section.index("| method")]
    for method, seeds in by_method.items():
        finals = [pts[max(pts)] for pts in seeds.values()]
        row = re.search(rf"^\| {re.escape(method)} \|.*$", section, re.M)
        assert row, f"credit.md section 14 has no row for {method}"
        assert f"{sum(finals) / len(finals):.2f}" in row.group(0), (method, row.group(0))
        assert f"| {len(finals)} |" in row.group(0), (method, row.group(0))
        steps = sorted({s for pts in seeds.values() for s in pts})
        bands = [grid().band([pts[s] for pts in seeds.values()]) for s in steps]
        curve = " | ".join(f"{mean:.2f} +- {half:.2f}" for mean, half in bands)
        assert f"| {method} | {curve} |" in section, (method, curve)


def test_the_corridor_credit_preset_is_the_grids_gigpo_setting(runs):
    preset_is_recorded(str(STORE), "corridor-credit", "corridor", 30)


def test_walkthrough_step_18_is_the_stores_walk(runs):
    """README step 18: in GiGPO seed 0's group s34-g0, walk r1 went Left from cell 1 and then Right
    three times; its turns' advantages (GiGPO: the walk's + its step group's), the walk's own
    and GRPO's over the group's rewards (what Groups' GRPO column computes) are the README's."""
    import json
    run_id = runs.set_index("name").loc["corridor credit gigpo seed 0", "run_id"]
    turns = queries.turns(str(STORE), run_id, ["s34-g0-r1"]).sort_values("turn")
    moves = [json.loads(p)["actions"] for p in turns["parsed"]]
    assert moves == [["Left"], ["Right"], ["Right"], ["Right"]]
    assert list(turns["state_key"]) == ["1", "0", "1", "2"]
    adv = [round(a, 2) for a in turns["advantage"]]
    traj = queries.trajectories(str(STORE), run_id, step=34).set_index("traj_id")
    walk = round(float(traj.loc["s34-g0-r1", "advantage"]), 2)
    assert (adv[0], adv[1], walk) == (1.03, 2.14, 0.65) and traj.loc["s34-g0-r1", "reward"] == 1
    group = traj[traj["group_id"] == "s34-g0"]["reward"]
    grpo = (1 - group.mean()) / (group.std() + 1e-6)   # GRPO's (r - mean) / (std + eps), Groups'
    assert round(grpo, 2) == 0.54
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert ("GiGPO paid the Left +1.03 and the Right from cell 0 +2.14 (the walk's episode term "
            "+0.65 plus each move's step term), where GRPO pays all four moves the same +0.54"
            ) in text
    assert "run=20261207-131828-dc46d3&step=34&group=s34-g0" in text and run_id == \
        "20261207-131828-dc46d3"
