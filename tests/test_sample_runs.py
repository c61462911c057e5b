"""Each committed sample run has the shape sample_runs/README.md claims for it.

That every sample run opens on every page without an exception is tests/test_pages.py's
``test_every_page_renders_every_run`` (it loops over every store under sample_runs/); here each
run's own story is checked with the app's own signal functions, on the committed data.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from pages import _credit, _signals
from storage import queries

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "sample_runs"


def store(name: str) -> str:
    """The committed store's path; a run not recorded yet is skipped, saying how to record it."""
    path = RUNS / name
    if not path.exists():
        pytest.skip(f"sample run {name} is not recorded: bash sample_runs/make.sh")
    return str(path)


def the_runs(name: str) -> pd.DataFrame:
    runs = queries.runs(store(name))
    assert (runs["status"] == "finished").all(), runs[["name", "status", "error"]]
    return runs


def wide_metrics(path: str, run_id: str) -> pd.DataFrame:
    m = queries.metrics(path, run_id)
    return m.pivot_table(index="step", columns="name", values="value")


def config_of(row) -> dict:
    return queries.run_config(row["config"])


def test_every_sample_store_is_small():
    sizes = {p.name: p.stat().st_size for p in RUNS.glob("*.duckdb")}
    assert sizes, "no sample runs"
    assert sum(sizes.values()) < 40e6, sizes


# -- 2. reward variance and collapse ---------------------------------------------------------------
def test_collapse_run_compares_two_algorithms_on_the_same_tasks_and_one_alarm_fires():
    path = store("collapse_bandit.duckdb")
    runs = the_runs("collapse_bandit.duckdb")
    configs = {r["name"]: config_of(r) for _, r in runs.iterrows()}
    assert sorted(c["algo"] for c in configs.values()) == ["grpo", "starpo_s"]
    assert len({(c["env"], c["env_options"], c["seed"]) for c in configs.values()}) == 1
    alarms = {}
    for _, r in runs.iterrows():
        alarms[config_of(r)["algo"]] = _signals.collapse_alarms(wide_metrics(path, r["run_id"]))
    assert alarms["grpo"], "the GRPO run's collapse alarm does not fire"
    grpo_id = runs[[config_of(r)["algo"] == "grpo" for _, r in runs.iterrows()]]["run_id"].iloc[0]
    wide = wide_metrics(path, grpo_id).dropna(subset=["reward/mean"])   # the RL steps
    first = alarms["grpo"][0]["step"]
    assert first <= wide.index.max()
    assert wide.loc[first, "reward/group_std_mean"] < 0.5 * wide["reward/group_std_mean"].max() or \
        wide.loc[first:, "collapse/repeat_frac"].max() > _signals.REPEAT_LEVEL
    # what README section 2 describes: the high learning rate wrecks the answer format, after which
    # success, in-group reward std and the gradient are all zero
    start, end = wide.iloc[0], wide.iloc[-1]
    assert start["success/rate"] > 0 and end["success/rate"] == 0
    assert end["env/valid_action_ratio"] < start["env/valid_action_ratio"]
    assert end["reward/group_std_mean"] == 0 and end["grad/norm"] == 0


# -- 3. a gradient spike ----------------------------------------------------------------------------
def test_spike_run_has_a_detected_spike_with_per_trajectory_gradient_norms():
    path = store("spike_frozenlake.duckdb")
    run_id = the_runs("spike_frozenlake.duckdb")["run_id"].iloc[0]
    sp = _signals.spike_threshold(wide_metrics(path, run_id)["grad/norm"])
    spikes = [int(s) for s in sp.index[sp["spike"]]]
    assert spikes, "the app's spike detector finds no spike"
    ranked = queries.top_gradient_trajectories(path, run_id, spikes[0])
    assert len(ranked) >= 2 and ranked["grad_norm"].notna().all()
    assert ranked["grad_norm"].is_monotonic_decreasing
    # README section 3: the spike is the first step with a success, and that rollout tops the list
    assert ranked["reward"].iloc[0] == ranked["reward"].max() > 0


# -- 4. the apps world ------------------------------------------------------------------------------
def test_apps_run_shows_expert_demos_state_diffs_and_state_failures():
    path = store("apps_tiny.duckdb")
    runs = the_runs("apps_tiny.duckdb")
    run_id = runs[runs["source"] == "trainer"]["run_id"].iloc[0]
    trajs = queries.trajectories(path, run_id)
    assert {"sft", "train"} <= set(trajs["split"])              # the expert's demos are recorded
    demos, policy = trajs[trajs["split"] == "sft"], trajs[trajs["split"] == "train"]
    assert demos["success"].all()
    demo = demos["traj_id"].iloc[0]
    turns = queries.turns(path, run_id, [demo])
    diffs = [json.loads(d) for d in turns["state_diff"] if isinstance(d, str)]
    assert any(diffs), "no turn of an expert demo carries a state diff"
    # the tiny policy never writes a parseable tool call (README section 4), so its failures are
    # format errors, which the taxonomy ranks above unmet state tests; the unit tests on its final
    # state are still run and recorded, and the state-changing ones fail
    assert not policy["success"].any()
    assert set(policy["failure_class"]) == {"format_error"}
    tests = queries.test_results(path, run_id, policy["traj_id"].tolist())
    assert set(tests["traj_id"]) == set(policy["traj_id"])
    state_tests = tests[~tests["name"].isin(["answer_matches", "no_collateral_damage"])]
    assert len(state_tests) and not state_tests["passed"].any()
    assert tests[tests["name"] == "no_collateral_damage"]["passed"].all()   # it changed nothing


def test_apps_store_holds_the_careless_agents_collateral_damage_with_tests_and_diffs():
    path = store("apps_tiny.duckdb")
    runs = the_runs("apps_tiny.duckdb")
    imported = runs[runs["source"].str.startswith("import")]
    assert len(imported) == 1 and config_of(imported.iloc[0])["env"] == "apps"
    run_id = imported["run_id"].iloc[0]
    trajs = queries.trajectories(path, run_id)
    classes = set(trajs["failure_class"])
    # README section 4: the careless agent's slips show as harm and as unmet state tests
    assert {"success", "collateral_damage", "unmet_state_test"} <= classes, classes
    damaged = trajs[trajs["failure_class"] == "collateral_damage"]["traj_id"].tolist()
    tests = queries.test_results(path, run_id, damaged)
    shown = 0
    for traj_id in damaged:
        own = tests[tests["traj_id"] == traj_id].set_index("name")
        assert not own.loc["no_collateral_damage", "passed"], traj_id
        turns = queries.turns(path, run_id, [traj_id])
        diffs = [json.loads(d) for d in turns["state_diff"] if isinstance(d, str)]
        changed = {f"{e['op']} {e['table']}#{e['key']}" for d in diffs for e in d}
        named = own.loc["no_collateral_damage", "detail"].split(": ", 1)[1].split(", ")
        assert set(named) <= changed, (traj_id, named)    # the harm is in the turn's state diff
        shown += 1
    assert shown >= 1
    unmet = trajs[trajs["failure_class"] == "unmet_state_test"]["traj_id"].tolist()
    tests = queries.test_results(path, run_id, unmet)
    assert tests[tests["name"] == "no_collateral_damage"]["passed"].all()
    assert set(tests.loc[~tests["passed"], "traj_id"]) == set(unmet)


# -- 5. credit assignment ---------------------------------------------------------------------------
def test_credit_run_has_gigpo_step_groups_that_change_the_advantage():
    path = store("credit_gigpo.duckdb")
    run_id = the_runs("credit_gigpo.duckdb")["run_id"].iloc[0]
    trajs = queries.trajectories(path, run_id)
    train = trajs[trajs["split"] == "train"]
    differs = 0
    for _, group in train.groupby(["step", "group_id"]):
        turns = queries.turns(path, run_id, group["traj_id"].tolist())
        steps = _credit.gigpo_steps(group, turns)
        later = steps[steps["turn"] > 0]
        shared = later.groupby("anchor").size()
        if (shared >= 2).any() and (steps["A_step"] != 0).any():
            differs += 1
    assert differs >= 1, "no group where identical states recur and GiGPO's step term is non-zero"


# -- 6. an imported run -----------------------------------------------------------------------------
def test_imported_run_comes_from_the_rule_based_agent():
    runs = the_runs("imported_greedy_lake.duckdb")
    assert runs["source"].str.startswith("import").all(), runs["source"]
    path = store("imported_greedy_lake.duckdb")
    trajs = queries.trajectories(path, runs["run_id"].iloc[0])
    assert len(trajs) >= 100 and 0 < trajs["success"].mean() < 1
    assert trajs["grad_norm"].isna().all()                        # no trainer, no gradients


# -- the committed stores are compacted copies: nothing is lost in the copy -------------------------
def test_compaction_keeps_every_row_and_shrinks_the_file(tmp_path):
    from storage import compact
    from storage.recorder import Recorder
    path = tmp_path / "store.duckdb"
    rec = Recorder(path)
    run = rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo"}, name="small")
    for step in range(1, 4):
        rec.record_step(step, metrics={"reward/mean": step / 10, "grad/norm": 0.5})
    rec.finish("finished")
    rec.close()
    before_rows = queries.metrics(str(path), run)
    before, after = compact.compact(path)
    assert after < before
    pd.testing.assert_frame_equal(queries.metrics(str(path), run), before_rows)
    assert queries.runs(str(path))["status"].tolist() == ["finished"]
    assert not (tmp_path / "store.duckdb.compact").exists()
