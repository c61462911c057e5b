"""The credit grid sample stores (sample_runs/credit_grid*.duckdb, sample_runs/credit.md section 13)
hold what the text says: every method from one SFT start, differing only in the method's own flags and the
seed, at the budget the README gives; the tables' final held-out figures are the stores' (bench/
credit_grid.py reads them); and no run's last evaluation did more than repeat one move."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from storage import queries

ROOT = Path(__file__).resolve().parent.parent
GRIDS = {
    # store: (RL steps, lr, at least this many method runs, the README's sub-heading for its table)
    "credit_grid.duckdb": (16, 3e-3, 18, "## 13. "),
    "credit_grid_long.duckdb": (60, 1e-3, 12, "### 13b. "),
}
METHOD_FIELDS = {"algo", "gigpo_episode_stats", "w_prm", "w_spa", "clip_eps_high"}
"""What a method may change (StarPO-S's clip-higher is its algorithm's own default)."""
PER_RUN = {"seed", "name", "db", "checkpoint_dir", "run_id"}


def store(name: str) -> str:
    path = ROOT / "sample_runs" / name
    if not path.exists():
        pytest.skip(f"{name} is not recorded: bash sample_runs/make.sh credit_grid")
    return str(path)


def grid():
    spec = importlib.util.spec_from_file_location("credit_grid", ROOT / "bench" / "credit_grid.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", GRIDS)
def test_every_run_starts_from_its_sft_start_and_differs_only_by_its_method(name):
    """One SFT start for every method (in the first grid PPO has its own: its optimizer also holds
    its value head, which an older trainer could not restore from a start without one)."""
    path = store(name)
    steps, lr, least, _ = GRIDS[name]
    runs = queries.runs(path)
    starts = runs[runs["name"].str.startswith("lake credit start")]
    assert len(starts) >= 1
    start_of = {}
    for _, row in starts.iterrows():
        cfg = queries.run_config(row["config"])
        assert (cfg["sft_steps"], cfg["steps"]) == (80, 0)
        assert row["name"].endswith(": SFT 80")
        start_of["ppo" if "ppo" in row["name"] else "other"] = row["run_id"]
    others = runs.drop(starts.index)
    assert len(others) >= least
    base = None
    for _, row in others.iterrows():
        cfg = queries.run_config(row["config"])
        kind = "ppo" if cfg["algo"] == "ppo" and "ppo" in start_of else "other"
        assert start_of[kind] in cfg["init_from"], row["name"]
        assert (cfg["steps"], cfg["lr"]) == (steps, lr), row["name"]
        same = {k: v for k, v in cfg.items() if k not in METHOD_FIELDS | PER_RUN | {"init_from"}}
        base = base or same
        assert same == base, row["name"]
        assert cfg["env_options"] == "size=3,slip=0,actions_per_turn=1,max_actions=6"


@pytest.mark.parametrize("name", GRIDS)
def test_the_start_succeeds_sometimes_when_sampled_and_never_greedily(name):
    """pass@G > 0 and pass@1 well below 1 at every run's first RL step; greedy held-out 0."""
    path = store(name)
    runs = queries.runs(path)
    for _, row in runs.iterrows():
        m = queries.metrics(path, row["run_id"], ["success/rate", "success/pass@G",
                                                  "eval/success"])
        wide = m.pivot_table(index="step", columns="name", values="value")
        if row["name"].startswith("lake credit start"):
            assert wide.loc[80, "eval/success"] == 0.0
            continue
        first = wide.loc[81]
        assert first["success/pass@G"] > 0 and first["success/rate"] < 0.5, row["name"]


@pytest.mark.parametrize("name", GRIDS)
def test_the_readme_table_is_the_stores(name):
    path = store(name)
    heading = GRIDS[name][3]
    by_method, _ = grid().curves(path)
    text = (ROOT / "sample_runs" / "credit.md").read_text(encoding="utf-8")
    section = text[text.index(heading):]
    if heading == "## 13. ":  # the first grid's table ends where the second's sub-section begins
        section = section[:section.index("### 13b. ")]
    for method, seeds in by_method.items():
        finals = [pts[max(pts)] for pts in seeds.values() if pts]
        mean = sum(finals) / len(finals)
        row = re.search(rf"^\| {re.escape(method)} \|.*$", section, re.M)
        assert row, f"README section {heading.strip()} has no row for {method}"
        assert f"{mean:.2f}" in row.group(0), (method, mean, row.group(0))
        assert f"| {len(finals)} |" in row.group(0), (method, len(finals), row.group(0))


@pytest.mark.parametrize("name", GRIDS)
def test_no_run_ends_on_more_than_one_move(name):
    """The README's finding in both grids: every held-out walk of every run's last evaluation
    (valid answers) repeats one move, the same on all 32 lakes; the store's turns say so."""
    path = store(name)
    mod = grid()
    runs = queries.runs(path)
    checked = 0
    for _, row in runs.iterrows():
        if not mod.NAME.match(str(row["name"])):
            continue
        m = queries.metrics(path, row["run_id"], ["eval/success"])
        walks = [w for w in mod.walk_moves(path, row["run_id"], int(m["step"].max())) if w]
        assert all(len(set(w)) == 1 for w in walks), row["name"]
        assert len({w[0] for w in walks}) <= 1, row["name"]
        checked += 1
    assert checked >= GRIDS[name][2]


def preset_is_recorded(path: str, name: str, task: str, sft_steps: int) -> None:
    """Every field preset ``name`` sets equals the recorded ``TASK credit gigpo seed 0`` run's; the
    SFT lr is its start's (the RL runs go on from its checkpoint and never use theirs)."""
    from core.config.presets import PRESETS, preset
    runs = queries.runs(path)
    recorded = queries.run_config(
        runs[runs["name"] == f"{task} credit gigpo seed 0"].iloc[0]["config"])
    start = runs[runs["name"] == f"{task} credit start: SFT {sft_steps}"].iloc[0]
    recorded["sft_lr"] = queries.run_config(start["config"])["sft_lr"]
    cfg = preset(name).to_dict()
    for field in PRESETS[name]:
        assert cfg[field] == recorded[field], (field, cfg[field], recorded[field])


def test_the_lake_credit_preset_is_the_first_grids_gigpo_setting():
    """The preset says it is the grid's setup (16 RL steps at lr 3e-3 from 80 SFT steps): every
    field it sets equals the recorded GiGPO run's (13b's lower lr and longer budget did no better,
    so the preset keeps the shorter one)."""
    preset_is_recorded(store("credit_grid.duckdb"), "lake-credit", "lake", 80)
