"""Which tasks each step draws, its seed, and when held-out evaluation runs.

The run draws each phase's task pool once (``pool_size``) and cycles through it in a fixed,
seeded order: RL batch k takes tasks ``k * tasks_per_step ...`` of that order, SFT batch k the
same from the SFT pool in its own order; held-out tasks are one fixed list. Every rank computes the
same schedule (core/learn/distributed.py then splits each batch into whole groups).
"""
from __future__ import annotations

import random

from core.config import TrainConfig

POOL_SIZES = (256, 64, 16)
"""Fallback pool sizes for an env that cannot make the default pool (``pool_size``)."""


EVAL_SEED_OFFSET = 7
"""Held-out sampling is seeded held_out_seed + 7, apart from the draw's own seed."""


def held_out_seed(cfg) -> int:
    """The seed of the held-out draw: ``eval_seed``, or the run's seed."""
    return cfg.seed if cfg.eval_seed < 0 else cfg.eval_seed


def eval_sampling_seed(cfg) -> int:
    """The seed held-out rollouts are sampled with (rank 0; the trainer offsets other ranks)."""
    return held_out_seed(cfg) + EVAL_SEED_OFFSET


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. too many consecutive non-finite updates, no task pool)."""


class Schedule:
    """The run's tasks by step: ``rl_tasks(step)``, ``sft_tasks(step)``, ``eval_tasks``."""

    def __init__(self, cfg: TrainConfig, env, sft_env=None, eval_env=None):
        self.cfg = cfg
        self.pool = task_pool(env, cfg)
        # SFT demonstrations may come from differently mixed train tasks (sft_env_options).
        own_sft = sft_env is not None and sft_env is not env
        self.sft_pool = task_pool(sft_env, cfg) if own_sft else self.pool
        # Held-out evaluation may use its own options (eval_env_options) so its task set stays
        # fixed when the RL task mix changes.
        eval_env = env if eval_env is None else eval_env
        self.eval_tasks = (eval_env.tasks("heldout", cfg.eval_tasks, held_out_seed(cfg))
                           if cfg.eval_tasks else [])

    def rl_tasks(self, step: int) -> list:
        """The ``tasks_per_step`` tasks of RL step ``step`` (numbered after the SFT steps)."""
        return self.tasks_for(step - self.cfg.sft_steps - 1, self.cfg.tasks_per_step, salt=0)

    def sft_tasks(self, step: int) -> list:
        return self.tasks_for(step - 1, self.cfg.sft_batch_size, salt=1, pool=self.sft_pool)

    def tasks_for(self, index: int, count: int, salt: int, pool: list | None = None) -> list:
        """``count`` train tasks for the index-th batch of a phase, cycling through the pool."""
        pool = self.pool if pool is None else pool
        order = list(range(len(pool)))
        random.Random(self.cfg.seed * 31 + salt).shuffle(order)
        return [pool[order[(index * count + j) % len(order)]] for j in range(count)]

    def seed(self, step: int) -> int:
        """The step's sampling / update seed."""
        return (self.cfg.seed * 100_003 + step) % (2 ** 31)

    def eval_on(self) -> bool:
        return self.cfg.eval_every > 0 and bool(self.eval_tasks)

    def eval_due(self, step: int) -> bool:
        """Every ``sft_eval_every`` SFT steps, right after SFT, every ``eval_every`` RL steps and
        at the end (step 0, before any training, is the trainer's own call when there is no
        SFT)."""
        cfg = self.cfg
        if not self.eval_on():
            return False
        if step < cfg.sft_steps:
            return cfg.sft_eval_every > 0 and step % cfg.sft_eval_every == 0
        rl_index = step - cfg.sft_steps
        return (step == cfg.sft_steps or rl_index % cfg.eval_every == 0
                or step == cfg.sft_steps + cfg.steps)


def pool_size(env, cfg: TrainConfig) -> int:
    """How many train tasks the run draws once and cycles through: ``cfg.task_pool``; 0 = the
    whole train split (``env.split_size('train')``), or, for an env that generates tasks without
    bound, as many as the run will ask for, so no task repeats (at least 16)."""
    if cfg.task_pool:
        return cfg.task_pool
    size_of = getattr(env, "split_size", None)
    size = size_of("train") if callable(size_of) else None
    if size is not None:
        return int(size)
    return max(cfg.steps * cfg.tasks_per_step, cfg.sft_steps * cfg.sft_batch_size, 16)


def task_pool(env, cfg: TrainConfig) -> list:
    n = pool_size(env, cfg)
    if cfg.task_pool:  # asked for: exactly that many, or a clear error
        try:
            return env.tasks("train", n, cfg.seed)
        except ValueError as exc:
            raise TrainingError(f"task_pool={n}: {exc}") from exc
    # An env that cannot make as many as that (a user's small split) gives what it can.
    for size in [n] + [p for p in POOL_SIZES if p < n]:
        try:
            return env.tasks("train", size, cfg.seed)
        except ValueError:
            continue
    raise TrainingError(f"environment {env.name!r} cannot make {POOL_SIZES[-1]} train tasks")
