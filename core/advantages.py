"""Credit assignment: from rewards to advantages, as pure tensor functions.

Outcome-level estimators take one scalar reward per trajectory and the id of the task group each
trajectory was sampled in, and return one advantage per trajectory; ``ESTIMATORS`` selects them
by name (the ``--algo`` flag). The trainer spreads a trajectory's advantage over its trained
tokens with ``token_advantages``.

    grpo      A = (r - mean_g) / (std_g + 1e-6)        Shao et al. 2024 (DeepSeekMath); Search-R1
    dr_grpo   A = r - mean_g                           Liu et al. 2025 ("Understanding R1-Zero")
    rloo      A_k = R_k - (sum_j R_j - R_k) / (K - 1)  Kool et al. 2019; LOOP (Chen et al. 2025)
    starpo_s  GRPO advantages; ``starpo_s_keep`` then keeps the top groups by reward std (RAGEN)
    gigpo     GRPO advantages at the episode level; ``gigpo_step_advantages`` adds step-level
              credit from anchor states (Feng et al. 2025, verl-agent)

``std_g`` is the unbiased (n - 1) standard deviation. A group whose rewards are all equal, and a
group of one trajectory, carry no comparison and get advantage exactly 0.

``ppo`` is not in ``ESTIMATORS``: it needs per-token values and uses ``gae``.
"""
from __future__ import annotations

import hashlib
import math
from typing import Callable, Hashable, Sequence

import torch

EPS = 1e-6


# -------------------------------------------------------------------------------------------------
# Group bookkeeping


def _check_rewards(rewards: torch.Tensor, group_ids: Sequence[Hashable]) -> None:
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1:
        raise ValueError(f"rewards must be a 1-D tensor (B,), got {getattr(rewards, 'shape', type(rewards))}")
    if not rewards.is_floating_point():
        raise ValueError(f"rewards must be a float tensor, got {rewards.dtype}")
    if len(group_ids) != rewards.shape[0]:
        raise ValueError(f"group_ids has {len(group_ids)} entries for {rewards.shape[0]} rewards")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf")


def group_index(group_ids: Sequence[Hashable]) -> tuple[torch.Tensor, int]:
    """Map group ids to dense indices 0..G-1 in order of first appearance -> (index (B,), G)."""
    dense: dict[Hashable, int] = {}
    index = [dense.setdefault(g, len(dense)) for g in group_ids]
    return torch.tensor(index, dtype=torch.long), len(dense)


def group_stats(rewards: torch.Tensor, group_ids: Sequence[Hashable]):
    """Per-group (mean (G,), unbiased std (G,), count (G,), all_equal (G,) bool, index (B,)).

    std of a group of one is 0 (not NaN): one sample has no spread to measure.
    """
    _check_rewards(rewards, group_ids)
    index, n_groups = group_index(group_ids)
    r = rewards.detach().double()  # float64 so that all-equal groups give exactly zero spread
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, index, torch.ones_like(r))
    mean = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, index, r) / count
    sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, index, (r - mean[index]) ** 2)
    std = torch.where(count > 1, sq / (count - 1).clamp(min=1), torch.zeros_like(sq)).sqrt()
    gmax = torch.full((n_groups,), -math.inf, dtype=torch.float64).scatter_reduce_(0, index, r, "amax")
    gmin = torch.full((n_groups,), math.inf, dtype=torch.float64).scatter_reduce_(0, index, r, "amin")
    return mean, std, count, gmax == gmin, index


# -------------------------------------------------------------------------------------------------
# Outcome-level estimators: (rewards (B,), group_ids) -> advantages (B,)


def grpo(rewards: torch.Tensor, group_ids: Sequence[Hashable]) -> torch.Tensor:
    """GRPO (Shao et al. 2024): A_i = (r_i - mean_g) / (std_g + 1e-6), std unbiased.

    Shapes: rewards (B,) float, group_ids length B -> (B,) same dtype as rewards.
    """
    mean, std, _, flat, index = group_stats(rewards, group_ids)
    adv = (rewards.double() - mean[index]) / (std[index] + EPS)
    return torch.where(flat[index], torch.zeros_like(adv), adv).to(rewards.dtype)


def dr_grpo(rewards: torch.Tensor, group_ids: Sequence[Hashable]) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025): A_i = r_i - mean_g (no std division, which biases towards
    groups with little spread).

    Shapes: rewards (B,) float, group_ids length B -> (B,).
    """
    mean, _, _, flat, index = group_stats(rewards, group_ids)
    adv = rewards.double() - mean[index]
    return torch.where(flat[index], torch.zeros_like(adv), adv).to(rewards.dtype)


def rloo(rewards: torch.Tensor, group_ids: Sequence[Hashable]) -> torch.Tensor:
    """RLOO / LOOP leave-one-out: A_k = R_k - (sum_j R_j - R_k) / (K - 1) = K/(K-1) (R_k - mean_g).

    The baseline of each rollout is the mean of the *other* K-1 rollouts of its task, so it is
    independent of the rollout itself (unbiased). No std normalisation (LOOP's default).
    Shapes: rewards (B,) float, group_ids length B -> (B,). A group of one gets 0.
    """
    mean, _, count, flat, index = group_stats(rewards, group_ids)
    k = count[index]
    adv = k / (k - 1).clamp(min=1) * (rewards.double() - mean[index])
    return torch.where(flat[index] | (k < 2), torch.zeros_like(adv), adv).to(rewards.dtype)


ESTIMATORS: dict[str, Callable[[torch.Tensor, Sequence[Hashable]], torch.Tensor]] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    # StarPO-S and GiGPO both start from GRPO episode advantages; their extra parts
    # (group filtering, step-level credit) are the two functions below.
    "starpo_s": grpo,
    "gigpo": grpo,
}


# -------------------------------------------------------------------------------------------------
# StarPO-S: keep the task groups the policy is still uncertain about


def starpo_s_keep(rewards: torch.Tensor, group_ids: Sequence[Hashable],
                  keep_frac: float = 0.25) -> torch.Tensor:
    """RAGEN's StarPO-S filter: keep whole groups, the top ``keep_frac`` of groups by in-group
    reward std (unbiased); the others are dropped from the update (but still recorded).

    Groups kept = max(1, floor(keep_frac * G)) (RAGEN takes int(ratio * groups)). Ties in std are
    broken by first appearance of the group, so the choice is deterministic.
    Shapes: rewards (B,), group_ids length B -> keep (B,) bool.
    """
    if not 0 < keep_frac <= 1:
        raise ValueError(f"keep_frac must be in (0, 1], got {keep_frac}")
    _, std, _, _, index = group_stats(rewards, group_ids)
    n_groups = std.shape[0]
    if n_groups == 0:
        return torch.zeros(0, dtype=torch.bool)
    n_keep = max(1, int(keep_frac * n_groups + 1e-9))  # 1e-9: 0.3 * 10 must give 3, not 2
    order = sorted(range(n_groups), key=lambda g: (-float(std[g]), g))
    kept = torch.zeros(n_groups, dtype=torch.bool)
    kept[order[:n_keep]] = True
    return kept[index]


# -------------------------------------------------------------------------------------------------
# GiGPO: step-level credit from anchor states


def anchor_key(observation: str) -> str:
    """Exact hash of a raw observation: turns acting from identical observations share a key."""
    return hashlib.sha1(observation.encode("utf-8")).hexdigest()


def gigpo_step_advantages(step_rewards: list[list[float]], anchor_keys: list[list[str]],
                          group_ids: Sequence[Hashable], gamma: float = 0.95,
                          normalize: str = "std") -> list[list[float]]:
    """GiGPO step advantages (Feng et al. 2025): within one task group, turns that acted from an
    identical observation (same anchor key) form a step group; their discounted returns are
    compared there.

        G_t = r_t + gamma * G_{t+1}    A_step = (G_t - mean_s) / (std_s + 1e-6)   ("std")
                                       A_step =  G_t - mean_s                     ("mean")

    std_s is unbiased. A step group of one turn, or whose returns are all equal, gets 0 (verl-agent
    leaves a singleton's return unnormalised; here a turn with nothing to compare against carries
    no step-level signal). The trainer adds A = A_episode + w * A_step per turn.
    Shapes: step_rewards[i][t], anchor_keys[i][t] for trajectory i, turn t; group_ids length N
    -> list of N lists, one float per turn.
    """
    if normalize not in ("std", "mean"):
        raise ValueError(f"normalize must be 'std' or 'mean', got {normalize!r}")
    if not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if not len(step_rewards) == len(anchor_keys) == len(group_ids):
        raise ValueError(f"step_rewards ({len(step_rewards)}), anchor_keys ({len(anchor_keys)}) and "
                         f"group_ids ({len(group_ids)}) must have one entry per trajectory")
    returns: list[list[float]] = []
    for i, (rs, keys) in enumerate(zip(step_rewards, anchor_keys)):
        if len(rs) != len(keys):
            raise ValueError(f"trajectory {i}: {len(rs)} step rewards but {len(keys)} anchor keys")
        g, out = 0.0, [0.0] * len(rs)
        for t in range(len(rs) - 1, -1, -1):
            g = float(rs[t]) + gamma * g
            out[t] = g
        if not all(math.isfinite(x) for x in out):
            raise ValueError(f"trajectory {i}: step rewards contain NaN or inf")
        returns.append(out)

    members: dict[tuple, list[tuple[int, int]]] = {}
    for i, keys in enumerate(anchor_keys):
        for t, key in enumerate(keys):
            members.setdefault((group_ids[i], key), []).append((i, t))

    adv = [[0.0] * len(rs) for rs in returns]
    for cells in members.values():
        values = [returns[i][t] for i, t in cells]
        if len(values) < 2 or max(values) == min(values):
            continue
        mean = math.fsum(values) / len(values)
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
        for (i, t), v in zip(cells, values):
            adv[i][t] = (v - mean) / (std + EPS) if normalize == "std" else v - mean
    return adv


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
