"""Signals recorded every step besides the loss: rollout statistics, collapse, gradient norms.

Metric names are the strings the database and the charts use (CONTRACTS.md):

    reward/mean, reward/std, reward/min, reward/max, reward/group_std_mean, reward/frac_zero_std,
    reward/{outcome,format,cost,process}_mean, success/rate, success/pass@G,
    response/length_mean, response/length_max, response/clip_ratio, env/turns_mean,
    env/valid_action_ratio, env/obs_truncated_ratio, env/finish/{reason}, collapse/repeat_frac,
    collapse/repeat_fail_frac

RAGEN's "Echo Trap" shows in-group reward std and entropy falling before reward collapses, so the
in-group std, the share of groups with zero std and a repetition signal are tracked every step.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable, Sequence

import torch

from core.rollout.trajectory import FINISH_REASONS, Trajectory

COMPONENTS = ("outcome", "format", "cost", "process")


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def _std(xs: Sequence[float]) -> float:
    """Unbiased standard deviation (0 for fewer than two values)."""
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def groups_of(trajs: Iterable[Trajectory]) -> dict[str, list[Trajectory]]:
    out: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        out[t.group_id].append(t)
    return dict(out)


def success_of(traj: Trajectory) -> bool:
    return bool(traj.outcome.success) if traj.outcome is not None else False


def repeat_frac(trajs: Sequence[Trajectory], failed_only: bool = False) -> float:
    """Share of rollouts whose action sequence repeats another rollout's of the same group verbatim.

    A group of G identical rollouts gives 1, G distinct ones 0: the policy echoing itself. With
    ``failed_only``, only the repeats that did not succeed count (collapse/repeat_fail_frac): a
    group that repeats a solution has converged, it is not caught in a loop.
    """
    if not trajs:
        return 0.0
    repeated = 0
    for group in groups_of(trajs).values():
        seen: dict[tuple[str, ...], list[Trajectory]] = defaultdict(list)
        for t in group:
            seen[tuple(turn.action for turn in t.turns)].append(t)
        repeated += sum(sum(not (failed_only and success_of(t)) for t in same)
                        for same in seen.values() if len(same) > 1)
    return repeated / len(trajs)


def rollout_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Reward, success, length, turn and collapse statistics of one step's trajectories."""
    if not trajs:
        return {}
    rewards = [t.reward for t in trajs]
    groups = groups_of(trajs)
    group_stds = [_std([t.reward for t in g]) for g in groups.values()]
    turns = [turn for t in trajs for turn in t.turns]
    lengths = [t.response_tokens for t in trajs]
    m = {
        "reward/mean": _mean(rewards),
        "reward/std": _std(rewards),
        "reward/min": min(rewards),
        "reward/max": max(rewards),
        "reward/group_std_mean": _mean(group_stds),
        "reward/frac_zero_std": _mean([float(s < 1e-9) for s in group_stds]),
        "success/rate": _mean([float(success_of(t)) for t in trajs]),
        "success/pass@G": _mean([float(any(success_of(t) for t in g)) for g in groups.values()]),
        "response/length_mean": _mean(lengths),
        "response/length_max": float(max(lengths)),
        "response/clip_ratio": _mean([float(turn.action_truncated) for turn in turns]),
        "env/turns_mean": _mean([t.num_turns for t in trajs]),
        "env/valid_action_ratio": _mean([float(turn.valid) for turn in turns]),
        "env/obs_truncated_ratio": _mean([float(turn.obs_truncated) for turn in turns]),
        "collapse/repeat_frac": repeat_frac(trajs),
        "collapse/repeat_fail_frac": repeat_frac(trajs, failed_only=True),
    }
    for name in COMPONENTS:
        m[f"reward/{name}_mean"] = _mean([t.rewards.get(name, 0.0) for t in trajs])
    for reason in FINISH_REASONS:
        m[f"env/finish/{reason}"] = _mean([float(t.finish_reason == reason) for t in trajs])
    return m


def entropy_mean(trajs: Sequence[Trajectory]) -> float:
    """Mean sampling entropy over the model's own tokens (policy/entropy)."""
    values = [e for t in trajs for e, tr in zip(t.info.get("token_entropy", []), t.trained)
              if tr and e is not None]
    return _mean(values)


# -- gradients ------------------------------------------------------------------------------------
def flat_grad(params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    """All gradients as one vector (zeros for parameters without one yet)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in params])


class GradIncrements:
    """Per-trajectory gradient norms under accumulation: with one microbatch per trajectory, the
    norm of each microbatch's increment to the accumulated gradient is that trajectory's share.

        tracker = GradIncrements(params); loss_i.backward(); norm_i = tracker.increment()
    """

    def __init__(self, params: Sequence[torch.nn.Parameter]):
        self.params = list(params)
        self.last = flat_grad(self.params)

    def increment(self) -> float:
        now = flat_grad(self.params)
        norm = float(torch.linalg.vector_norm(now - self.last))
        self.last = now
        return norm


def module_grad_norms(modules: dict[str, list[torch.nn.Parameter]]) -> dict[str, float]:
    """L2 norm of the current gradient of each named group of parameters (before clipping)."""
    out = {}
    for name, params in modules.items():
        grads = [p.grad.reshape(-1) for p in params if p.grad is not None]
        out[name] = float(torch.linalg.vector_norm(torch.cat(grads))) if grads else 0.0
    return out
