"""The credit grid sample store (sample_runs/credit_grid.duckdb, README section 13) holds what the
README says: every method from one SFT start, differing only in the method's own flags and the
seed, and the table's final held-out figures are the store's (bench/credit_grid.py reads them)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from storage import queries

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "sample_runs" / "credit_grid.duckdb"
METHOD_FIELDS = {"algo", "gigpo_episode_stats", "w_prm", "w_spa", "clip_eps_high"}
"""What a method may change (StarPO-S's clip-higher is its algorithm's own default)."""
PER_RUN = {"seed", "name", "db", "checkpoint_dir", "run_id"}


def grid():
    if not STORE.exists():
        pytest.skip("credit_grid.duckdb is not recorded: bash sample_runs/make.sh credit_grid")
    spec = importlib.util.spec_from_file_location("credit_grid", ROOT / "bench" / "credit_grid.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_run_starts_from_its_sft_start_and_differs_only_by_its_method():
    """One SFT start for every method but PPO, whose optimizer also holds its value head and so
    goes on from its own start (the same 80 SFT steps, seed and data)."""
    runs = queries.runs(str(STORE))
    starts = runs[runs["name"].str.startswith("lake credit start")]
    assert sorted(starts["name"]) == ["lake credit start-ppo: SFT 80", "lake credit start: SFT 80"]
    start_of = {}
    for _, row in starts.iterrows():
        cfg = queries.run_config(row["config"])
        assert (cfg["sft_steps"], cfg["steps"]) == (80, 0)
        start_of["ppo" if "ppo" in row["name"] else "other"] = row["run_id"]
    others = runs.drop(starts.index)
    assert len(others) >= 18
    base = None
    for _, row in others.iterrows():
        cfg = queries.run_config(row["config"])
        kind = "ppo" if cfg["algo"] == "ppo" else "other"
        assert start_of[kind] in cfg["init_from"], row["name"]
        same = {k: v for k, v in cfg.items() if k not in METHOD_FIELDS | PER_RUN | {"init_from"}}
        base = base or same
        assert same == base, row["name"]
        assert cfg["env_options"] == "size=3,slip=0,actions_per_turn=1,max_actions=6"


def test_the_start_succeeds_sometimes_when_sampled_and_never_greedily():
    """pass@G > 0 and pass@1 well below 1 at every run's first RL step; greedy held-out 0."""
    runs = queries.runs(str(STORE))
    for _, row in runs.iterrows():
        m = queries.metrics(str(STORE), row["run_id"], ["success/rate", "success/pass@G",
                                                        "eval/success"])
        wide = m.pivot_table(index="step", columns="name", values="value")
        if row["name"].startswith("lake credit start"):
            assert wide.loc[80, "eval/success"] == 0.0
            continue
        first = wide.loc[81]
        assert first["success/pass@G"] > 0 and first["success/rate"] < 0.5, row["name"]


def test_the_readme_table_is_the_stores():
    mod = grid()
    by_method, _ = mod.curves(str(STORE))
    text = (ROOT / "sample_runs" / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## 13. "):]
    for method, seeds in by_method.items():
        finals = [pts[max(pts)] for pts in seeds.values() if pts]
        mean = sum(finals) / len(finals)
        row = re.search(rf"^\| {re.escape(method)} \|.*$", section, re.M)
        assert row, f"README section 13 has no row for {method}"
        assert f"{mean:.2f}" in row.group(0), (method, mean, row.group(0))
