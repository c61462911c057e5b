"""Credit's math on plain numbers (NumPy and Python floats, torch-free): the outcome estimators,
StarPO-S's group filter, GiGPO's episode and step terms, IGPO's, SPA's and the information-gain
turn credits. The trainer (core/credit/assign.py, core/credit/advantages.py wraps the estimators
for tensors) and the pages (what another estimator would have given a group) call the very same
functions. Each outcome estimator registers itself by name (core/algorithms/registry.py):

    grpo      A_i = (r_i - mean_g) / (std_g + 1e-6), std unbiased
    dr_grpo   A_i = r_i - mean_g
    rloo      A_k = K/(K-1) (R_k - mean_g)

A group whose rewards are all equal, or of one trajectory, carries no comparison: exactly 0.
"""
from __future__ import annotations

import hashlib
import math
from typing import Hashable, Sequence

import numpy as np

from core.algorithms.registry import register_estimator

EPS = 1e-6


# -------------------------------------------------------------------------------------------------
# Group bookkeeping (NumPy, float64)


def as_rewards(rewards, group_ids: Sequence[Hashable]) -> np.ndarray:
    """rewards as a finite float64 array (B,) with one group id each; ValueError naming the fault."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"rewards must be a 1-D array (B,), got shape {r.shape}")
    if len(group_ids) != r.shape[0]:
        raise ValueError(f"group_ids has {len(group_ids)} entries for {r.shape[0]} rewards")
    if not np.isfinite(r).all():
        raise ValueError("rewards contain NaN or inf")
    return r


def group_stats(rewards, group_ids: Sequence[Hashable]):
    """Per-group (mean (G,), unbiased std (G,), count (G,), all_equal (G,) bool, index (B,)),
    groups numbered 0..G-1 in order of first appearance.

    std of a group of one is 0 (not NaN): one sample has no spread to measure.
    """
    r = as_rewards(rewards, group_ids)
    dense: dict[Hashable, int] = {}
    index = np.array([dense.setdefault(g, len(dense)) for g in group_ids], dtype=np.int64)
    n = len(dense)
    count = np.bincount(index, minlength=n).astype(np.float64)
    mean = np.bincount(index, weights=r, minlength=n) / np.maximum(count, 1)
    sq = np.bincount(index, weights=(r - mean[index]) ** 2, minlength=n)
    std = np.sqrt(np.where(count > 1, sq / np.maximum(count - 1, 1), 0.0))
    gmax, gmin = np.full(n, -np.inf), np.full(n, np.inf)
    np.maximum.at(gmax, index, r)
    np.minimum.at(gmin, index, r)
    return mean, std, count, gmax == gmin, index


# -------------------------------------------------------------------------------------------------
# Outcome-level estimators: (rewards (B,), group_ids) -> advantages (B,) float64.
# A group whose rewards are all equal, or of one trajectory, carries no comparison: exactly 0.


@register_estimator("grpo")
def grpo(rewards, group_ids: Sequence[Hashable]) -> np.ndarray:
    """GRPO (Shao et al. 2024; Search-R1): A_i = (r_i - mean_g) / (std_g + 1e-6), std unbiased."""
    mean, std, _, flat, index = group_stats(rewards, group_ids)
    adv = (as_rewards(rewards, group_ids) - mean[index]) / (std[index] + EPS)
    return np.where(flat[index], 0.0, adv)


@register_estimator("dr_grpo")
def dr_grpo(rewards, group_ids: Sequence[Hashable]) -> np.ndarray:
    """Dr. GRPO (Liu et al. 2025): A_i = r_i - mean_g (no std division, which favours groups with
    little spread)."""
    mean, _, _, flat, index = group_stats(rewards, group_ids)
    adv = as_rewards(rewards, group_ids) - mean[index]
    return np.where(flat[index], 0.0, adv)


@register_estimator("rloo")
def rloo(rewards, group_ids: Sequence[Hashable]) -> np.ndarray:
    """RLOO / LOOP leave-one-out (Kool et al. 2019; Chen et al. 2025):
    A_k = R_k - (sum_j R_j - R_k) / (K - 1) = K/(K-1) (R_k - mean_g).

    The baseline of each rollout is the mean of the *other* K-1 rollouts of its task, so it does
    not depend on the rollout itself (unbiased). No std normalisation (LOOP's default).
    """
    mean, _, count, flat, index = group_stats(rewards, group_ids)
    k = count[index]
    adv = k / np.maximum(k - 1, 1) * (as_rewards(rewards, group_ids) - mean[index])
    return np.where(flat[index] | (k < 2), 0.0, adv)


def starpo_s_keep(rewards, group_ids: Sequence[Hashable], keep_frac: float = 0.25) -> np.ndarray:
    """RAGEN's StarPO-S filter: keep whole groups, the top ``keep_frac`` of groups by in-group
    reward std (unbiased); the others are dropped from the update (but still recorded).

    Groups kept = max(1, floor(keep_frac * G)) (RAGEN takes int(ratio * groups)). Ties in std are
    broken by first appearance of the group, so the choice is deterministic.
    Shapes: rewards (B,), group_ids length B -> keep (B,) bool.
    """
    if not 0 < keep_frac <= 1:
        raise ValueError(f"keep_frac must be in (0, 1], got {keep_frac}")
    _, std, _, _, index = group_stats(rewards, group_ids)
    if std.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    n_keep = max(1, int(keep_frac * std.shape[0] + 1e-9))  # 1e-9: 0.3 * 10 must give 3, not 2
    order = sorted(range(std.shape[0]), key=lambda g: (-float(std[g]), g))
    kept = np.zeros(std.shape[0], dtype=bool)
    kept[order[:n_keep]] = True
    return kept[index]


# -------------------------------------------------------------------------------------------------
# GiGPO: step-level credit from anchor states (plain Python: lists of turns of unequal length)


def anchor_key(observation: str) -> str:
    """Exact hash of a raw observation: turns acting from identical observations share a key."""
    return hashlib.sha1(observation.encode("utf-8")).hexdigest()


def gigpo_step_advantages(step_rewards: list[list[float]], anchor_keys: list[list[str]],
                          group_ids: Sequence[Hashable], gamma: float = 0.95,
                          normalize: str = "std") -> list[list[float]]:
    """GiGPO step advantages (Feng et al. 2025): within one task group, turns that acted from the
    same anchor state (same key) form a step group; their discounted returns are compared there.

        G_t = r_t + gamma * G_{t+1}    A_step = (G_t - mean_s) / (std_s + 1e-6)   ("std")
                                       A_step =  G_t - mean_s                     ("mean")

    ("std" is verl-agent's mode mean_std_norm, "mean" its mean_norm, chosen by ``gigpo_norm``.)

    std_s is unbiased. A step group of one turn, or whose returns are all equal, gets 0, as in
    verl-agent's ``step_norm_reward`` (a singleton is centred on itself). The trainer adds
    A = A_episode + w * A_step per turn, A_episode from ``gigpo_episode_advantages``.
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


def gigpo_episode_advantages(rewards: Sequence[float], turns: Sequence[int],
                             group_ids: Sequence[Hashable], cross_steps: bool = True,
                             normalize: str = "std") -> list[float]:
    """GiGPO's episode advantage, as verl-agent's ``episode_norm_reward`` computes it:

        A_episode,i = (R_i - mean_g) / (std_g + 1e-6)    ("std", its mean_std_norm)
        A_episode,i =  R_i - mean_g                      ("mean", its mean_norm)

    over the entries of trajectory i's task group g, std unbiased. ``cross_steps`` (verl-agent's
    default, ``compute_mean_std_cross_steps=True``) gives each trajectory one entry per turn (a
    step row there), so long trajectories weigh more in mean_g and std_g; False gives one entry
    per trajectory (the paper's Eq. 3). A group with a single entry is not normalised: mean 0,
    std 1, so it keeps its raw reward (verl-agent's rule); equal entries give 0. A trajectory
    with no turns counts once.

    A 1-turn success and a 3-turn failure: entries (1, 0, 0, 0), mean 0.25, std 0.5:

    >>> [round(a, 4) for a in gigpo_episode_advantages([1.0, 0.0], [1, 3], ["g", "g"])]
    [1.5, -0.5]
    >>> [round(a, 4) for a in gigpo_episode_advantages([1.0, 0.0], [1, 3], ["g", "g"], False)]
    [0.7071, -0.7071]
    """
    if normalize not in ("std", "mean"):
        raise ValueError(f"normalize must be 'std' or 'mean', got {normalize!r}")
    if not len(rewards) == len(turns) == len(group_ids):
        raise ValueError(f"rewards ({len(rewards)}), turns ({len(turns)}) and group_ids "
                         f"({len(group_ids)}) must have one entry per trajectory")
    r = as_rewards(rewards, group_ids)
    entries: dict[Hashable, list[float]] = {}
    for x, n, gid in zip(r.tolist(), turns, group_ids):
        entries.setdefault(gid, []).extend([x] * (max(1, int(n)) if cross_steps else 1))
    stats = {}
    for gid, values in entries.items():
        if len(values) == 1:
            stats[gid] = (0.0, 1.0)
            continue
        mean = math.fsum(values) / len(values)
        stats[gid] = (mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)))
    return [(x - stats[g][0]) / (stats[g][1] + EPS) if normalize == "std" else x - stats[g][0]
            for x, g in zip(r.tolist(), group_ids)]


def info_gain_turn_advantages(gains: list[list[float]], group_ids: Sequence[Hashable],
                              scale: bool = True) -> list[list[float]]:
    """IGPO's dense turn credit: each turn's information gain (core/credit/info_gain.py, g_{i,k} =
    p_{i,k+1} - p_{i,k}) normalised over every gain in its trajectory's task group,

        A_{i,k} = (g_{i,k} - mean_group(g)) / (std_group(g) + 1e-6)     (std unbiased)

    one value per gain (turns 0..T_i-2; the final turn's credit is the outcome's). A group with
    fewer than two gains, or all gains equal, carries no comparison: 0. ``scale=False`` only
    centres, A_{i,k} = g_{i,k} - mean_group(g) (SPA's contributions keep the outcome's scale: a
    head that learned little would otherwise have its noise blown up to unit size). The trainer adds
    ``w_info_gain`` x A_{i,k} to turn k's action tokens, on top of the algorithm's own credit.

    >>> info_gain_turn_advantages([[0.5, 0.0], [0.0]], ["g", "g"])[0][0] > 0
    True
    """
    if len(gains) != len(group_ids):
        raise ValueError(f"gains ({len(gains)}) and group_ids ({len(group_ids)}) must have one "
                         "entry per trajectory")
    members: dict[Hashable, list[float]] = {}
    for g, gid in zip(gains, group_ids):
        if not all(math.isfinite(x) for x in g):
            raise ValueError("information gains contain NaN or inf")
        members.setdefault(gid, []).extend(float(x) for x in g)
    stats = {}
    for gid, values in members.items():
        if len(values) < 2 or max(values) == min(values):
            continue
        mean = math.fsum(values) / len(values)
        stats[gid] = (mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)))
    return [[(float(x) - stats[gid][0]) / ((stats[gid][1] + EPS) if scale else 1.0)
             if gid in stats else 0.0 for x in g] for g, gid in zip(gains, group_ids)]


def igpo_stats(values: Sequence[float]) -> tuple[float, float]:
    """(mean, std) as IGPO's released trainer normalises a group: the population std with 1e-8
    under the root, std = sqrt(mean((v - mean)^2) + 1e-8); a group of one value (or none) gets
    std 1, so it is only centred (to 0).

    >>> [round(x, 6) for x in igpo_stats([1.0, 0.0, 0.0])]
    [0.333333, 0.471405]
    """
    if len(values) <= 1:
        return (float(values[0]) if values else 0.0), 1.0
    mean = math.fsum(values) / len(values)
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values) + 1e-8)


def _counted_gain(x) -> bool:
    """A gain IGPO's release normalises: finite and not exactly 0."""
    x = float(x)
    return math.isfinite(x) and x != 0.0


def igpo_turn_advantages(gains: list[list[float]], outcomes: Sequence[float],
                         group_ids: Sequence[Hashable], gamma: float,
                         gain_weight: float = 1.0) -> tuple[list[list[float]], int]:
    """IGPO's turn advantages (Wang et al. 2025), as its released trainer computes them
    ("separate" normalisation, the mode of its training script): within one task group the
    gains and the outcomes are z-scored apart, each with ``igpo_stats`` (population std),

        zg_{i,k} = (g_{i,k} - mean_G(g)) / (std_G(g) + 1e-6)     over every gain of the group
        zo_i     = (R_i - mean_G(R)) / (std_G(R) + 1e-6)           over the group's outcomes

    the outcome is the last turn's reward and the turn rewards are accumulated backwards,

        r_{i,k} = w * zg_{i,k}  (k < T_i - 1),   r_{i,T_i-1} = zo_i
        A_{i,k} = r_{i,k} + gamma * A_{i,k+1}

    so gamma discounts the outcome into earlier turns too. ``gains[i]`` holds turns 0..T_i-2 (the
    last turn has no gain); ``w`` is ``gain_weight`` (IGPO's information-gain weight, 1 there).
    A gain that is not finite (a NaN read of the gold answer) is left out of its group's
    statistics and its turn gets no gain reward (r = 0, IGPO's code does the same with a NaN
    difference); the count of such turns is returned beside the advantages. A gain of exactly 0
    is left out of the statistics the same way and gets r = 0, as the release does (it selects
    gain positions by ``reward != 0``). One difference remains, at gamma < 1 only: the release
    also drops such a turn's boundary, so its tokens take the next turn's A undiscounted, where
    here they take gamma x A_{i,k+1}; at gamma = 1 (the release's scripts) the two agree.

    >>> adv, skipped = igpo_turn_advantages([[0.5], [0.1]], [1.0, 0.0], ["g", "g"], gamma=1.0)
    >>> [[round(a, 3) for a in row] for row in adv], skipped
    ([[2.0, 1.0], [-2.0, -1.0]], 0)
    """
    if not len(gains) == len(outcomes) == len(group_ids):
        raise ValueError(f"gains ({len(gains)}), outcomes ({len(outcomes)}) and group_ids "
                         f"({len(group_ids)}) must have one entry per trajectory")
    if not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if not all(math.isfinite(float(r)) for r in outcomes):
        raise ValueError("outcomes contain NaN or inf")
    pooled_g: dict[Hashable, list[float]] = {}
    pooled_r: dict[Hashable, list[float]] = {}
    for g, r, gid in zip(gains, outcomes, group_ids):
        pooled_g.setdefault(gid, []).extend(float(x) for x in g if _counted_gain(x))
        pooled_r.setdefault(gid, []).append(float(r))
    stats_g = {gid: igpo_stats(v) for gid, v in pooled_g.items()}
    stats_r = {gid: igpo_stats(v) for gid, v in pooled_r.items()}
    out, skipped = [], 0
    for g, r, gid in zip(gains, outcomes, group_ids):
        (mg, sg), (mr, sr) = stats_g[gid], stats_r[gid]
        rewards = []
        for x in g:
            if _counted_gain(x):
                rewards.append(gain_weight * (float(x) - mg) / (sg + EPS))
            else:
                rewards.append(0.0)
                skipped += not math.isfinite(float(x))
        rewards.append((float(r) - mr) / (sr + EPS))
        out.append(discounted_turn_sums([rewards], gamma)[0])
    return out, skipped


def spa_turn_advantages(contributions: list[list[float]],
                        group_ids: Sequence[Hashable]) -> list[list[float]]:
    """SPA's per-turn credit (Wang et al. 2025, SPA-RL) for the algorithms without a critic.

    SPA's progress rewards c_{i,k} (one per turn, summing to the trajectory's outcome) enter its
    PPO as rewards on each turn's last token, so turn k is credited with its return-to-go less
    the critic's V(s_k). Without a critic, the stand-in for V(s_k) is the mean return-to-go at
    the same turn of the task group's trajectories that reached turn k:

        G_{i,k} = sum_{j >= k} c_{i,j}
        A_{i,k} = G_{i,k} - mean { G_{j,k} : j in group(i), T_j > k }

    Every turn of a success carries the outcome still to be made from it, whatever the
    trajectory's length (centring the c's pooled over all turns gave a 4-turn success -0.036 a
    turn and a 1-turn success +0.714); a turn no other rollout of the group reached gets 0.
    Not divided by a std: a head that learned little adds little.

    >>> [[round(a, 3) for a in row] for row in spa_turn_advantages(
    ...     [[1.0], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0]], ["g", "g", "g"])]
    [[0.333], [0.333, 0.375, 0.0, 0.0], [-0.667, -0.375]]
    """
    if len(contributions) != len(group_ids):
        raise ValueError(f"contributions ({len(contributions)}) and group_ids ({len(group_ids)}) "
                         "must have one entry per trajectory")
    if not all(math.isfinite(float(c)) for cs in contributions for c in cs):
        raise ValueError("progress contributions contain NaN or inf")
    returns = discounted_turn_sums(contributions, 1.0)
    at_turn: dict[tuple[Hashable, int], list[float]] = {}
    for gs, gid in zip(returns, group_ids):
        for k, g in enumerate(gs):
            at_turn.setdefault((gid, k), []).append(g)
    return [[g - math.fsum(at_turn[(gid, k)]) / len(at_turn[(gid, k)]) for k, g in enumerate(gs)]
            for gs, gid in zip(returns, group_ids)]


def discounted_turn_sums(values: list[list[float]], gamma: float) -> list[list[float]]:
    """Each turn's discounted sum of its own and its later turns' values, per trajectory:

        S_{i,k} = sum_{j >= k} gamma^(j-k) v_{i,j}        (S_{i,k} = v_{i,k} + gamma S_{i,k+1})

    IGPO's turn-level accumulation of normalised turn rewards (gamma 1 in its released scripts);
    gamma 0 leaves every value as it is.

    >>> discounted_turn_sums([[1.0, -0.5, 2.0]], 0.5)
    [[1.25, 0.5, 2.0]]
    """
    if not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    out = []
    for vs in values:
        acc, sums = 0.0, [0.0] * len(vs)
        for k in range(len(vs) - 1, -1, -1):
            acc = float(vs[k]) + gamma * acc
            sums[k] = acc
        out.append(sums)
    return out
