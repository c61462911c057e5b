"""Credit assignment: from rewards to advantages, tensor side.

Outcome-level estimators take one scalar reward per trajectory and the id of the task group each
trajectory was sampled in, and return one advantage per trajectory. They are written once, in
NumPy, in core/algorithms/estimators.py (so the pages use the same code); here they take and return
tensors. ``ESTIMATORS`` (the fixed ``core.advantages.ESTIMATORS``) is a view of the registry
(core/algorithms/registry.py): each algorithm's registered estimator, by algorithm name:

    grpo      A = (r - mean_g) / (std_g + 1e-6)        Shao et al. 2024 (DeepSeekMath); Search-R1
    dr_grpo   A = r - mean_g                           Liu et al. 2025 ("Understanding R1-Zero")
    rloo      A_k = R_k - (sum_j R_j - R_k) / (K - 1)  Kool et al. 2019; LOOP (Chen et al. 2025)
    starpo_s  GRPO advantages; ``starpo_s_keep`` then keeps the top groups by reward std (RAGEN)
    gigpo     GRPO advantages at the episode level; ``gigpo_step_advantages`` adds step-level
              credit from anchor states (Feng et al. 2025, verl-agent)
    loop      RLOO advantages (LOOP's loss settings are config defaults, core/algorithms/catalog.py)

``std_g`` is the unbiased (n - 1) standard deviation. A group whose rewards are all equal, and a
group of one trajectory, carry no comparison and get advantage exactly 0.

``ppo`` is not in ``ESTIMATORS``: it needs per-token values and uses ``gae``. The per-token work
(GAE, spreading advantages over tokens) is tensor code and lives here.
"""
from __future__ import annotations

import functools
from typing import Callable, Hashable, Sequence

import numpy as np
import torch

from core.algorithms import estimators
from core.algorithms.catalog import REGISTRY
from core.algorithms.estimators import EPS, anchor_key, gigpo_step_advantages  # noqa: F401 (re-exported)


# -------------------------------------------------------------------------------------------------
# Outcome-level estimators: (rewards (B,), group_ids) -> advantages (B,)


def _check_rewards(rewards: torch.Tensor, group_ids: Sequence[Hashable]) -> None:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be a 1-D tensor (B,), got {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        raise ValueError(f"rewards must be a float tensor, got {rewards.dtype}")


def _on_tensors(estimator: Callable) -> Callable:
    """The NumPy ``estimator`` with the ESTIMATORS contract: a float tensor (B,) in gives a tensor
    of its dtype and device out (no gradient: advantages are constants); NumPy in, NumPy out."""
    @functools.wraps(estimator)
    def run(rewards, group_ids: Sequence[Hashable]):
        if not isinstance(rewards, torch.Tensor):
            return estimator(rewards, group_ids)
        _check_rewards(rewards, group_ids)
        out = estimator(rewards.detach().double().cpu().numpy(), group_ids)
        return torch.from_numpy(np.ascontiguousarray(out)).to(rewards.dtype).to(rewards.device)
    return run


grpo = _on_tensors(estimators.grpo)
dr_grpo = _on_tensors(estimators.dr_grpo)
rloo = _on_tensors(estimators.rloo)

ESTIMATORS: dict[str, Callable[[torch.Tensor, Sequence[Hashable]], torch.Tensor]] = {
    name: _on_tensors(REGISTRY.estimators[algo.estimator])
    for name, algo in REGISTRY.algorithms.items() if algo.estimator is not None
}
"""Algorithm name -> tensor estimator, derived from the registry (not a second table); StarPO-S
and GiGPO start from GRPO's episode advantages, LOOP from RLOO's (their extra parts are credit
steps, core/credit/assign.py)."""


def starpo_s_keep(rewards: torch.Tensor, group_ids: Sequence[Hashable],
                  keep_frac: float = 0.25) -> torch.Tensor:
    """RAGEN's StarPO-S filter (core/algorithms/estimators.py ``starpo_s_keep``) on a tensor: keep (B,) bool,
    whole groups, the top ``keep_frac`` of groups by in-group reward std."""
    if isinstance(rewards, torch.Tensor):
        _check_rewards(rewards, group_ids)
        rewards = rewards.detach().double().cpu().numpy()
    return torch.from_numpy(estimators.starpo_s_keep(rewards, group_ids, keep_frac))


# -------------------------------------------------------------------------------------------------
# PPO: generalised advantage estimation over the model's own tokens


def _check_bt(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> None:
    if rewards.dim() != 2 or rewards.shape != values.shape or rewards.shape != mask.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and mask "
                         f"{tuple(mask.shape)} must all be (B, T)")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")
    if (rewards.detach()[~mask] != 0).any():
        # A reward placed on an observation/padding token would be silently lost.
        raise ValueError("rewards must be zero where mask is False; put them on trained tokens")


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016) over trained tokens only; untrained tokens (prompt, observations,
    padding) are skipped as if absent, so an environment's reply is not treated as an action.

        delta_t = r_t + gamma * V_next(t) - V_t     A_t = delta_t + gamma * lam * A_next(t)

    where next(t) is the next trained token of the same row (V = A = 0 after the last one).
    Returns (advantages (B,T), returns = A + V (B,T)), both 0 where mask is False; no gradient.
    Vectorised over rows, one reverse pass over T; ``gae_loop`` is the plain reference.
    Shapes: rewards, values (B,T) float; mask (B,T) bool.
    """
    _check_bt(rewards, values, mask)
    r, v = rewards.detach(), values.detach()
    batch, horizon = r.shape
    next_value = torch.zeros(batch, dtype=v.dtype)
    next_adv = torch.zeros(batch, dtype=v.dtype)
    adv = torch.zeros_like(v)
    for t in range(horizon - 1, -1, -1):
        m = mask[:, t]
        delta = r[:, t] + gamma * next_value - v[:, t]
        a = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(m, a, torch.zeros_like(a))
        next_value = torch.where(m, v[:, t], next_value)  # skipped tokens leave the carry alone
        next_adv = torch.where(m, a, next_adv)
    returns = torch.where(mask, adv + v, torch.zeros_like(adv))
    return adv, returns


def gae_loop(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
             lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-Python reference for ``gae``: per row, gather the trained positions and run the
    textbook recursion over them. Slow; used to check the vectorised version."""
    _check_bt(rewards, values, mask)
    adv = torch.zeros_like(values.detach())
    returns = torch.zeros_like(adv)
    for b in range(rewards.shape[0]):
        positions = [t for t in range(rewards.shape[1]) if bool(mask[b, t])]
        last_adv, next_value = 0.0, 0.0
        for t in reversed(positions):
            delta = float(rewards[b, t]) + gamma * next_value - float(values[b, t])
            last_adv = delta + gamma * lam * last_adv
            adv[b, t] = last_adv
            returns[b, t] = last_adv + float(values[b, t])
            next_value = float(values[b, t])
    return adv, returns


# -------------------------------------------------------------------------------------------------
# Helpers the trainer applies after an estimator


def token_advantages(traj_adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Spread each trajectory's advantage over its trained tokens: A[b,t] = traj_adv[b] * mask[b,t].

    Shapes: traj_adv (B,), mask (B,T) bool -> (B,T), 0 where mask is False.
    """
    if traj_adv.dim() != 1 or mask.dim() != 2 or traj_adv.shape[0] != mask.shape[0]:
        raise ValueError(f"traj_adv {tuple(traj_adv.shape)} must be (B,) for mask (B,T) "
                         f"{tuple(mask.shape)}")
    return traj_adv[:, None] * mask.to(traj_adv.dtype)


def drop_small(advantages: torch.Tensor, threshold: float) -> torch.Tensor:
    """LOOP's filter: rollouts with |A| < threshold (LOOP: 0.01) carry almost no signal and are
    dropped. Returns the KEEP mask, True where |A| >= threshold (threshold 0 keeps everything).

    Shapes: advantages (B,) -> (B,) bool.
    """
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    return advantages.detach().abs() >= threshold
