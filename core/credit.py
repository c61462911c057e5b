"""Credit assignment: trajectory rewards -> one advantage per trained token, by algorithm.

Each credit step (``STEPS``, named by core/algorithms.py's registry; ``CREDIT`` maps every
algorithm to its step) takes the step's scored trajectories and returns per-token advantages
(one float tensor (T_i,) per trajectory, 0 on untrained tokens). It also fills, for the record,
``traj.advantage`` (the trajectory's scalar advantage), ``traj.filtered`` (dropped from the
update) and for turn-level methods ``traj.info["turn_advantages"]``.

    outcome                 the algorithm's outcome estimator (grpo, dr_grpo, rloo, loop):
                            the trajectory's advantage on every one of its tokens
    starpo_s                GRPO + RAGEN's filter: only the top ``starpo_keep`` groups by in-group
                            reward std are trained (whole groups kept or dropped)
    gigpo                   A = A_episode + w * A_step per turn (anchor-state step groups)
    gae (ppo)               GAE over trained tokens with the value head's estimates, reward on
                            each trajectory's last trained token, whitened over the batch (verl)
After any of them, LOOP's filter drops trajectories with |A| < ``min_abs_advantage``.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from core import algorithms
from core.advantages import anchor_key, drop_small, gae, gigpo_step_advantages, starpo_s_keep
from core.trajectory import Trajectory


def _mask(traj: Trajectory) -> torch.Tensor:
    return torch.tensor(traj.trained, dtype=torch.bool)


def _rewards(trajs: Sequence[Trajectory]) -> tuple[torch.Tensor, list[str]]:
    return (torch.tensor([t.reward for t in trajs], dtype=torch.float32),
            [t.group_id for t in trajs])


def outcome(trajs: Sequence[Trajectory], cfg, values=None) -> list[torch.Tensor]:
    """Group-relative outcome advantage (the registry's estimator for ``cfg.algo``) spread over
    the trajectory's tokens."""
    estimator = algorithms.get(cfg.algo).estimator
    adv = estimator([t.reward for t in trajs], [t.group_id for t in trajs])  # (B,) float64
    for t, a in zip(trajs, adv.tolist()):
        t.advantage = a
    return [a * _mask(t).float() for t, a in zip(trajs, adv.tolist())]


def starpo_s(trajs: Sequence[Trajectory], cfg, values=None) -> list[torch.Tensor]:
    """GRPO advantages; groups outside the top ``starpo_keep`` by reward std are filtered."""
    per_token = outcome(trajs, cfg)
    rewards, gids = _rewards(trajs)
    keep = starpo_s_keep(rewards, gids, cfg.starpo_keep)
    for t, k in zip(trajs, keep.tolist()):
        t.filtered = t.filtered or not k
    return per_token


def step_rewards(traj: Trajectory) -> list[float]:
    """Per-turn rewards whose sum is the trajectory's reward: the env's step rewards, with the
    part of the scored reward they do not pay out (outcome, format, costs) paid on the last turn."""
    rs = [float(turn.step_reward) for turn in traj.turns]
    if rs:
        rs[-1] += traj.reward - sum(rs)
    return rs


def anchor_keys(traj: Trajectory) -> list[str]:
    """The state each turn acted from, as GiGPO's anchor: the env's ``state_key`` stored on the
    turn, so one state reached at different turns is one anchor. A turn without one (an env that
    offers none) falls back to the state as text: the task at the start, then the previous
    observation."""
    seen = ["task:" + traj.task.task_id] + [turn.observation for turn in traj.turns[:-1]]
    return [anchor_key("state:" + turn.state_key) if turn.state_key is not None
            else anchor_key(text) for turn, text in zip(traj.turns, seen)]


def gigpo(trajs: Sequence[Trajectory], cfg, values=None) -> list[torch.Tensor]:
    """GiGPO: episode advantage (GRPO) plus ``gigpo_weight`` x the anchor-state step advantage."""
    episode = outcome(trajs, cfg)
    steps = gigpo_step_advantages([step_rewards(t) for t in trajs], [anchor_keys(t) for t in trajs],
                                  [t.group_id for t in trajs], gamma=cfg.gigpo_gamma)
    out = []
    for t, ep, st in zip(trajs, episode, steps):
        per_turn = [t.advantage + cfg.gigpo_weight * a for a in st]
        t.info["turn_advantages"] = per_turn
        turn_of = torch.tensor(t.token_turn)
        adv = torch.zeros(len(t.token_ids))
        for k, a in enumerate(per_turn):
            adv[(turn_of == k) & _mask(t)] = a
        out.append(adv)
    return out


def ppo(trajs: Sequence[Trajectory], cfg, values: Sequence[torch.Tensor] | None = None,
        ) -> list[torch.Tensor]:
    """GAE per trajectory (reward on its last trained token), whitened over all trained tokens."""
    if values is None:
        raise ValueError("ppo credit needs the value head's estimates")
    advs, rets = [], []
    for t, v in zip(trajs, values):
        mask = _mask(t)
        r = torch.zeros(len(t.token_ids))
        if mask.any():
            r[int(mask.nonzero()[-1])] = t.reward
        a, ret = gae(r[None], v.detach().float()[None], mask[None], cfg.gamma, cfg.lam)
        advs.append(a[0])
        rets.append(ret[0])
    trained = torch.cat([a[_mask(t)] for a, t in zip(advs, trajs)]) if trajs else torch.zeros(0)
    if trained.numel() > 1:
        mean, std = trained.mean(), trained.std()
        advs = [torch.where(_mask(t), (a - mean) / (std + 1e-8), torch.zeros_like(a))
                for a, t in zip(advs, trajs)]
    for t, a, ret in zip(trajs, advs, rets):
        m = _mask(t)
        t.advantage = float(a[m].mean()) if m.any() else 0.0
        t.info["returns"] = ret
    return advs


STEPS: dict[str, Callable[..., list[torch.Tensor]]] = {
    "outcome": outcome, "starpo_s": starpo_s, "gigpo": gigpo, "gae": ppo,
}
"""Credit step by name (core/algorithms.py ``CREDIT_STEPS``)."""

CREDIT: dict[str, Callable[..., list[torch.Tensor]]] = {
    name: STEPS[algo.credit] for name, algo in algorithms.ALGORITHMS.items()
}
"""Algorithm name -> its credit step, as the registry declares it."""


def assign(trajs: Sequence[Trajectory], cfg, values=None) -> list[torch.Tensor]:
    """Per-token advantages for ``cfg.algo``; then LOOP's |A| filter (``min_abs_advantage``)."""
    per_token = CREDIT[cfg.algo](trajs, cfg, values)
    if cfg.min_abs_advantage > 0 and trajs:
        keep = drop_small(torch.tensor([t.advantage for t in trajs]), cfg.min_abs_advantage)
        for t, k in zip(trajs, keep.tolist()):
            t.filtered = t.filtered or not k
    return per_token
