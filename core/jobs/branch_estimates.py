"""The estimates of a branch job (core/jobs/branch.py), pure functions of the continuations' returns.

With R a continuation's return (its reward as trained on, core/credit/rewards.py), for each turn t::

    V(s_t)      = mean of R over the resample continuations (a new action sampled at t)
    Q(s_t, a_t) = mean of R over the keep continuations (the recorded a_t kept)
    A_t         = Q(s_t, a_t) - V(s_t)

each with a 95% interval that stays truthful at small K:

* returns all 0 or 1 (success rewards, the common case): Wilson's score interval for V and Q,
  and Newcombe's hybrid score interval (his method 10, built from the two Wilson intervals) for
  A. At K = 1, or when every continuation returned the same, these are wide, as they must be:
  eight successes in eight still leave Q in [0.68, 1].
* other returns: a percentile bootstrap (``BOOTSTRAP`` resamples, seeded), and no interval (NaN)
  where it would claim certainty it has not got: fewer than two continuations, or all equal.

The verdict: ``worst_turn`` names the turn whose recorded action lost the most value only when
its interval for A lies wholly below 0. Otherwise ``candidates`` lists the turns with A < 0, each
with ``k_needed``, about how many continuations per kind would make its interval exclude 0 at
the same A (the interval's half-width shrinks as 1 / sqrt(K)).
"""
from __future__ import annotations

import math

import numpy as np

BOOTSTRAP = 2000
Z95 = 1.959964
"""The standard normal's 97.5% quantile: a two-sided 95% interval."""


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a proportion: centre (p + z^2/2n) / (1 + z^2/n), half-width
    z sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n), with p = successes / n. (nan, nan) for n = 0.

    >>> [round(x, 4) for x in wilson(8, 8)]
    [0.6756, 1.0]
    >>> [round(x, 4) for x in wilson(0, 1)]
    [0.0, 0.7935]
    """
    if n == 0:
        return float("nan"), float("nan")
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe(k1: float, n1: int, k2: float, n2: int, z: float = Z95) -> tuple[float, float]:
    """Newcombe's hybrid score interval for p1 - p2 (1998, method 10), from the Wilson intervals
    (l1, u1) and (l2, u2): d - sqrt((p1 - l1)^2 + (u2 - p2)^2), d + sqrt((u1 - p1)^2 + (p2 - l2)^2).

    >>> [round(x, 4) for x in newcombe(0, 1, 1, 1)]
    [-1.0, 0.1221]
    """
    if n1 == 0 or n2 == 0:
        return float("nan"), float("nan")
    p1, p2 = k1 / n1, k2 / n2
    (l1, u1), (l2, u2) = wilson(k1, n1, z), wilson(k2, n2, z)
    d = p1 - p2
    return (d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2),
            d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2))


def binary(values) -> bool:
    """Whether every return is exactly 0 or 1 (a success reward)."""
    return all(float(v) in (0.0, 1.0) for v in values)


def _certain(values) -> bool:
    """Too little to bootstrap honestly: one value, or all equal (a zero-width interval)."""
    return len(values) < 2 or min(values) == max(values)


def bootstrap_ci(values, seed: int, n: int = BOOTSTRAP, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values``: the (1-level)/2 and (1+level)/2
    quantiles of mean(values[idx]) over ``n`` resamples idx ~ Uniform{0..m-1}^m."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def diff_ci(keep, resample, seed: int, n: int = BOOTSTRAP, level: float = 0.95):
    """Bootstrap interval of mean(keep) - mean(resample), the two sets resampled independently."""
    q, v = np.asarray(keep, dtype=float), np.asarray(resample, dtype=float)
    if q.size == 0 or v.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    d = (q[rng.integers(0, q.size, size=(n, q.size))].mean(axis=1)
         - v[rng.integers(0, v.size, size=(n, v.size))].mean(axis=1))
    lo, hi = np.quantile(d, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def estimate(returns: dict[int, dict[str, list[float]]], seed: int = 0) -> list[dict]:
    """Per turn: v = mean(resample returns), q = mean(keep returns), a = q - v, their 95%
    intervals (v_lo, v_hi, q_lo, q_hi, a_lo, a_hi; see the module docstring), n = continuations
    per kind, and k_needed (``continuations_needed``)."""
    rows = []
    for turn in sorted(returns):
        keep, resample = returns[turn].get("keep", []), returns[turn].get("resample", [])
        v = float(np.mean(resample)) if resample else float("nan")
        q = float(np.mean(keep)) if keep else float("nan")
        if binary(keep) and binary(resample):
            (v_lo, v_hi), (q_lo, q_hi) = wilson(sum(resample), len(resample)), wilson(sum(keep), len(keep))
            a_lo, a_hi = newcombe(sum(keep), len(keep), sum(resample), len(resample))
        else:
            nan2 = (float("nan"), float("nan"))
            v_lo, v_hi = nan2 if _certain(resample) else bootstrap_ci(resample, seed * 1_009 + turn * 2)
            q_lo, q_hi = nan2 if _certain(keep) else bootstrap_ci(keep, seed * 1_009 + turn * 2 + 1)
            a_lo, a_hi = (nan2 if _certain(keep) and _certain(resample)
                          else diff_ci(keep, resample, seed * 1_013 + turn))
        n = min(len(keep), len(resample))
        row = {"turn": turn, "v": v, "q": q, "a": q - v, "v_lo": v_lo, "v_hi": v_hi,
               "q_lo": q_lo, "q_hi": q_hi, "a_lo": a_lo, "a_hi": a_hi, "n": float(n)}
        row["k_needed"] = continuations_needed(row)
        rows.append(row)
    return rows


def continuations_needed(row: dict) -> float:
    """About how many continuations per kind would put 0 outside A's interval at the same A:
    K (h / |A|)^2 with h the interval's half-width on the side of 0 (half-widths shrink as
    1 / sqrt(K)); the present K when it already excludes 0, nan when A is 0 or unknown.

    >>> continuations_needed({"a": -0.25, "a_lo": -0.75, "a_hi": 0.25, "n": 8.0})
    32.0
    """
    a, lo, hi, k = row["a"], row["a_lo"], row["a_hi"], row["n"]
    if not all(np.isfinite([a, lo, hi, k])) or a == 0 or k <= 0:
        return float("nan")
    if hi < 0 or lo > 0:
        return float(k)
    half = (hi - a) if a < 0 else (a - lo)
    return float(math.ceil(k * (half / abs(a)) ** 2))


def worst_turn(rows: list[dict]) -> int | None:
    """The turn with the lowest A whose whole interval lies below 0 (the earliest among equals):
    the turn whose recorded action lost value beyond the continuations' noise. None when no
    turn's interval excludes 0 (see ``candidates``) or there are no rows."""
    lost = [r for r in rows if np.isfinite(r["a_hi"]) and r["a_hi"] < 0]
    return min(lost, key=lambda r: (r["a"], r["turn"]))["turn"] if lost else None


def candidates(rows: list[dict]) -> list[dict]:
    """The turns with A < 0 whose interval still reaches 0 (or is unknown), lowest A first: the
    turns that may have lost the reward, each with ``k_needed`` to tell."""
    maybe = [r for r in rows if np.isfinite(r["a"]) and r["a"] < 0
             and not (np.isfinite(r["a_hi"]) and r["a_hi"] < 0)]
    return sorted(maybe, key=lambda r: (r["a"], r["turn"]))
