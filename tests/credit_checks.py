"""What the turn-credit tests share (tests/test_info_gain.py, test_prm.py, test_progress.py and
test_trainer.py's credit tests): a hand-made trajectory of known token layout, one real RL step of
the tiny model on search with a turn signal switched on, the check that its recorded turn
advantages are the outcome advantage plus the signal's group-centred values, and the app's pages
opened on such a run."""
from __future__ import annotations

from pathlib import Path

import pytest

from core.algorithms.estimators import (discounted_turn_sums, info_gain_turn_advantages,
                                    spa_turn_advantages)
from core.config import TrainConfig
from core.envs.base import Outcome, Task
from core.run.trainer import train
from core.rollout.trajectory import Trajectory, Turn
from storage import queries
from storage.recorder import Recorder


def fake_trajectory(traj_id: str, group: str, turns: int, reward: float = 0.0,
                    obs: list[str] | None = None, task: str = "t",
                    golds: tuple[str, ...] = ()) -> Trajectory:
    """A hand-made trajectory: a prompt of 2 tokens, then per turn 2 action tokens (trained, with
    logprob -1) and 1 observation token; ``obs`` are the turns' observations (``o0``, ``o1``, ...
    when not given)."""
    t = Trajectory(traj_id=traj_id, group_id=group, task=Task(task, "q", golds=golds))
    t.token_ids, t.roles, t.trained, t.token_turn = [0, 0], ["prompt"] * 2, [False] * 2, [-1, -1]
    for k in range(turns):
        t.token_ids += [1, 1, 2]
        t.roles += ["action", "action", "observation"]
        t.trained += [True, True, False]
        t.token_turn += [k, k, k]
        t.turns.append(Turn(turn=k, action="a", observation=(obs or [f"o{k}"] * turns)[k],
                            valid=True, step_reward=0.0))
    t.logprobs = [-1.0 if m else None for m in t.trained]
    t.reward = reward
    t.outcome = Outcome(score=reward, success=reward > 0)
    return t


def one_rl_step(base: Path, name: str, **fields) -> tuple[Path, str]:
    """(store path, run id) of one real RL step of the tiny model on search, recorded in
    ``base/name.duckdb``: 2 tasks x 2 rollouts of short turns, no evaluation; ``fields`` set the
    turn signal (w_info_gain, w_spa, w_prm, ...) and override the rest."""
    db_path = base / f"{name}.duckdb"
    cfg = TrainConfig(**{**dict(env="search", model="tiny", algo="grpo", steps=1, group_size=2,
                                tasks_per_step=2, max_turns=3, max_new_tokens=8,
                                max_obs_tokens=48, eval_every=0, db=str(db_path),
                                checkpoint_dir=str(base / "ckpt")), **fields})
    return db_path, train(cfg, Recorder(db_path), progress=False)


def assert_turns_carry(db_path, run_id: str, trajs, values: list, groups: list, *,
                       scale: bool = False, last_keeps_outcome: bool = False,
                       gamma: float = 0.0, spa: bool = False) -> list:
    """Each trajectory's recorded turn advantages are its outcome advantage plus its ``values``
    centred within the group (and divided by the group's std when ``scale``:
    core/algorithms/estimators.py info_gain_turn_advantages; the weight is 1); with ``last_keeps_outcome``
    the last turn, which has no value, keeps the outcome advantage alone; with ``gamma`` > 0 each
    turn carries the discounted sum of its own and later turns' values (core/algorithms/estimators.py
    discounted_turn_sums); with ``spa`` each turn carries its return-to-go of the values less its
    group's mean at that turn (core/algorithms/estimators.py spa_turn_advantages). Returns the added
    values."""
    turns = queries.turns(db_path, run_id, list(trajs["traj_id"]))
    dense = (spa_turn_advantages(values, groups) if spa else
             discounted_turn_sums(info_gain_turn_advantages(values, groups, scale=scale), gamma))
    for (_, t), d in zip(trajs.iterrows(), dense):
        adv = turns[turns.traj_id == t.traj_id].sort_values("turn").advantage.tolist()
        last = [t.advantage] if last_keeps_outcome else []
        assert adv == pytest.approx([t.advantage + x for x in d] + last, abs=1e-6)
    return dense


@pytest.fixture
def open_page(monkeypatch, tmp_path):
    """A factory of AppTests on one page of the app, opened on ``store`` with URL ``params``."""
    from streamlit.testing.v1 import AppTest
    from streamlit.testing.v1 import app_test
    import streamlit as st
    from pages import _jobs
    from tests.test_pages import APP, ROOT, _NavigationPagesManager
    monkeypatch.setattr(app_test, "PagesManager", _NavigationPagesManager)
    monkeypatch.setenv(_jobs.RUNS_DIR_ENV, str(tmp_path / "runs"))
    monkeypatch.chdir(ROOT)
    st.cache_data.clear()

    def open_(page: str, store: str, **params) -> AppTest:
        monkeypatch.setenv(queries.STORE_DIRS_ENV, str(Path(store).parent))
        at = AppTest.from_file(APP, default_timeout=60).run()
        at.query_params.update({"store": store, **{k: str(v) for k, v in params.items()}})
        at = at.switch_page(f"pages/{page}.py").run()
        assert not at.exception, at.exception
        return at
    return open_
