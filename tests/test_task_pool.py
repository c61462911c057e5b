"""The train task pool is a config field whose default is the whole train split (issue #16
point 5): training drew from at most 256 tasks although the search world has 22,478 train
questions (18,096 of them drawable at the default half two-hop mix)."""
import pytest

from core.config import ConfigError, TrainConfig, validate
from core.envs.base import make_env
from core.run.schedule import TrainingError, pool_size
from core.run.schedule import task_pool as _task_pool


def test_default_pool_is_the_whole_search_train_split():
    env = make_env("search")
    cfg = TrainConfig(env="search")
    assert cfg.task_pool == 0
    pool = _task_pool(env, cfg)
    assert len(pool) == pool_size(env, cfg) == env.split_size("train") > 256
    assert len({t.task_id for t in pool}) == len(pool)
    assert {t.split for t in pool} == {"train"}
    # the whole split: one task more cannot be drawn at this mix
    with pytest.raises(ValueError):
        env.tasks("train", len(pool) + 1, 0)


def test_explicit_pool_and_generated_envs():
    env = make_env("frozenlake")
    assert len(_task_pool(env, TrainConfig(env="frozenlake", task_pool=7))) == 7
    # generated without bound: as many as the run draws, so no task repeats
    cfg = TrainConfig(env="frozenlake", steps=30, tasks_per_step=4)
    assert pool_size(env, cfg) == 120 and len(_task_pool(env, cfg)) == 120
    with pytest.raises(TrainingError, match="task_pool"):
        _task_pool(make_env("search"), TrainConfig(env="search", task_pool=10**6))
    with pytest.raises(ConfigError, match="task_pool"):
        validate(TrainConfig(task_pool=-1))
