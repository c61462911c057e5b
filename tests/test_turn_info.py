"""StepResult.info and state_key are stored per turn and read back (issue #16 point 5): a
FrozenLake slip and the apps sandbox's layers survive the store; stores recorded before the
columns existed still read, with NULLs, and gain the columns when migrated."""
import glob
import json
import shutil

import duckdb
import pandas as pd
import pytest

from core.envs.base import make_env, observation_role
from core.run.step_rows import step_tables
from core.rollout.episode import initial_state_key
from core.rollout.sampling import Sampling
from core.rollout.transcript import record_turn
from core.rollout.trajectory import Trajectory
from storage import queries
from storage.migrations import SCHEMA_VERSION, prepare
from storage.recorder import Recorder


@pytest.fixture(scope="module")
def tok():
    from core.model.policy import load_tokenizer
    return load_tokenizer("tiny")


def played(env, task, actions, tok, traj_id, seed=0):
    episode = env.episode(task, seed=seed)
    traj = Trajectory(traj_id=traj_id, group_id="g", task=task)
    key = initial_state_key(episode)
    for turn, action in enumerate(actions):
        result = episode.step(action)
        record_turn(traj, tok, turn, action, tok.encode(action), None, result,
                    Sampling(max_context=4096), state_key=key, role=observation_role(env))
        key = result.state_key
        if result.done:
            break
    traj.outcome, traj.token_text = episode.outcome(), [""] * len(traj.token_ids)
    return traj


def _slipped_frozenlake(tok):
    """A FrozenLake trajectory in which at least one move slipped (seeds tried in order)."""
    env = make_env("frozenlake", slip=0.5, actions_per_turn=3)
    task = env.tasks("train", 1, 0)[0]
    for seed in range(50):
        traj = played(env, task, ["<answer>Up || Left || Down</answer>"] * 3, tok, "lake", seed)
        moves = [m for t in traj.turns for m in t.info.get("executed", [])]
        if any(m["intended"] != m["actual"] for m in moves):
            return traj
    raise AssertionError("no slip in 50 seeds at slip 0.5")


def test_info_and_state_key_survive_the_store(tmp_path, tok):
    lake = _slipped_frozenlake(tok)
    apps = make_env("apps")
    code = played(apps, apps.tasks("train", 1, 0)[0], ["<code>print(6 * 7)</code>"], tok, "apps")
    assert code.turns[0].info.get("sandbox_layers"), code.turns[0].info
    store = tmp_path / "s.duckdb"
    rec = Recorder(store)
    run = rec.start_run({"env": "frozenlake", "model": "tiny", "algo": "gigpo"})
    rec.record_step(0, **{k: v for k, v in step_tables([lake, code]).items()})
    turns = queries.turns(store, run, ["lake", "apps"])
    got = turns[turns["traj_id"] == "lake"].sort_values("turn")
    for turn, row in zip(lake.turns, got.to_dict("records")):
        assert json.loads(row["info"]) == turn.info
        assert row["state_key"] == turn.state_key
    slips = [m for info in got["info"] for m in json.loads(info)["executed"]
             if m["intended"] != m["actual"]]
    assert slips  # the careless slip is in the store, not only in memory
    apps_info = json.loads(turns[turns["traj_id"] == "apps"]["info"].iloc[0])
    assert apps_info["sandbox_layers"] == code.turns[0].info["sandbox_layers"]
    assert turns[turns["traj_id"] == "apps"]["state_key"].iloc[0].startswith("db:")


def test_old_stores_read_with_nulls_and_migrate(tmp_path):
    sample = sorted(glob.glob("sample_runs/*.duckdb"))
    assert sample, "the sample runs are part of the checkout"
    old = tmp_path / "old.duckdb"
    shutil.copy(sample[0], old)
    with duckdb.connect(str(old), read_only=True) as con:
        version = con.execute("SELECT max(version) FROM _migrations").fetchone()[0]
        assert version < SCHEMA_VERSION  # recorded before the new columns
        run, traj = con.execute("SELECT run_id, traj_id FROM turns LIMIT 1").fetchone()
    turns = queries.turns(old, run, [traj])  # read-only: not migrated, still readable
    assert not turns.empty and turns["state_key"].isna().all() and turns["info"].isna().all()
    assert "m003_turn_state" in prepare(old)
    with duckdb.connect(str(old), read_only=True) as con:
        cols = {r[0] for r in con.execute("DESCRIBE turns").fetchall()}
    assert {"state_key", "info"} <= cols
    again = queries.turns(old, run, [traj])
    pd.testing.assert_frame_equal(again, turns)
