"""The rule-based agents under sample_runs/agents/: they play the real environments, and what
they write imports as the trainer would have recorded it."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from core.envs.apps.env import make_task
from core.envs.apps.tasks import COLLATERAL_TEST, TEMPLATES
from core.envs.base import make_env
from core.credit.scoring import classify_trajectory
from core.rollout.trajectory import Trajectory, Turn
from storage import ingest, io, queries

AGENTS = Path(__file__).resolve().parent.parent / "sample_runs" / "agents"


def _agent(name: str):
    spec = importlib.util.spec_from_file_location(name, AGENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


careless = _agent("careless_apps")
# the class each kind of slip earns once it matters: harm, or a required write wrong/missing
EXPECTED = {"every_match": "collateral_damage", "marks_read": "collateral_damage",
            "ignores_condition": "collateral_damage", "skips_a_write": "unmet_state_test",
            "wrong_record": "unmet_state_test", "skips_reading": "unmet_state_test",
            "stale_read": "unmet_state_test"}


def _tasks(template: str, n: int):
    env = make_env("apps", templates=template)
    return env, env.tasks("train", n, 0)


def _replayed(rec: dict) -> Trajectory:
    """The record's actions played again in a fresh episode, as the trainer's rollout records
    them (the apps world is deterministic once the task is fixed)."""
    _, split, template, seed = rec["task_id"].split("/")
    task = make_task(template, int(seed), split)
    episode = make_env("apps").episode(task, 0)
    episode.reset()
    traj = Trajectory(rec["traj_id"], rec["group_id"], task, finish_reason=rec["finish_reason"])
    for i, turn in enumerate(rec["turns"]):
        r = episode.step(turn["action"])
        traj.turns.append(Turn(i, turn["action"], r.observation, r.valid, r.action_type,
                               r.parsed, r.error, r.state_diff))
    traj.outcome = episode.outcome()
    return traj


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_without_a_slip_the_agent_does_what_the_expert_does(template):
    env, tasks = _tasks(template, 2)
    for task in tasks:
        rec = careless.play(env, task, None, max_turns=16)
        assert rec["success"], (task.task_id, rec["tests"])
        assert rec["finish_reason"] == "answered"


@pytest.mark.parametrize("template", sorted(careless.SLIPS))
def test_each_slip_is_caught_by_the_envs_own_unit_tests(template):
    slip = careless.SLIPS[template][0]
    env, tasks = _tasks(template, 8)
    failed = []
    for task in tasks:
        rec = careless.play(env, task, slip, max_turns=16)
        if rec["success"]:
            continue  # a conditional slip that happened not to matter (the afternoon was free)
        tests = {t["name"]: t for t in rec["tests"]}
        collateral = not tests[COLLATERAL_TEST]["passed"]
        assert collateral == (EXPECTED[slip] == "collateral_damage"), (task.task_id, tests)
        assert collateral == rec["info"]["collateral"]
        changed = {f"{e['op']} {e['table']}#{e['key']}" for t in rec["turns"]
                   for e in t["state_diff"] or ()}
        if collateral:  # every row the test calls unrequested is in some turn's state diff
            named = tests[COLLATERAL_TEST]["detail"].split(": ", 1)[1].split(", ")
            assert set(named) <= changed, (named, changed)
        else:
            assert any(not t["passed"] for t in rec["tests"])
        failed.append(task.task_id)
    assert failed, f"the {slip} slip never failed a {template} task"


def test_what_it_writes_imports_with_tests_diffs_and_the_trainers_failure_classes(tmp_path):
    out, store = tmp_path / "careless.jsonl", tmp_path / "s.duckdb"
    assert careless.main(["--out", str(out), "--tasks", "16", "--rollouts", "2", "--steps", "1",
                          "--slip-rate", "0.5", "--seed", "0"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 32 and records[0]["run"]["env"] == "apps"
    report = ingest.import_file(out, store, run_id="careless")
    assert (report.imported, report.failed) == (32, 0)
    trajs = queries.trajectories(str(store), "careless").set_index("traj_id")
    for rec in records:
        native = _replayed(rec)
        assert [(t["name"], t["passed"], t["detail"]) for t in rec["tests"]] == \
            list(native.outcome.tests)
        assert trajs.loc[rec["traj_id"], "failure_class"] == classify_trajectory(native)
    classes = set(trajs["failure_class"])
    assert {"success", "collateral_damage", "unmet_state_test"} <= classes, classes
    damaged = trajs.index[trajs["failure_class"] == "collateral_damage"].tolist()
    tests = queries.test_results(str(store), "careless", damaged)
    assert not tests[tests["name"] == COLLATERAL_TEST]["passed"].any()
    turns = queries.turns(str(store), "careless", damaged)
    assert turns["state_diff"].notna().any()


def test_the_slip_rate_is_checked(capsys):
    with pytest.raises(SystemExit):
        careless.main(["--out", "unused.jsonl", "--slip-rate", "1.5"])
    assert "--slip-rate must be between 0 and 1" in capsys.readouterr().err
