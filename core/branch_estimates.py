"""The estimates of a branch job (core/branch.py), pure functions of the continuations' returns.

With R a continuation's return (its reward as trained on, core/rewards.py), for each turn t::

    V(s_t)      = mean of R over the resample continuations (a new action sampled at t)
    Q(s_t, a_t) = mean of R over the keep continuations (the recorded a_t kept)
    A_t         = Q(s_t, a_t) - V(s_t)

each with a 95% percentile-bootstrap interval (``BOOTSTRAP`` resamples, seeded), and the worst
turn argmin_t A_t over A_t < 0: the turn whose recorded action lost the most value.
"""
from __future__ import annotations

import numpy as np

BOOTSTRAP = 2000


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
    """Per turn: v = mean(resample returns), q = mean(keep returns), a = q - v, and their 95%
    bootstrap intervals (v_lo, v_hi, q_lo, q_hi, a_lo, a_hi), n = continuations per kind."""
    rows = []
    for turn in sorted(returns):
        keep, resample = returns[turn].get("keep", []), returns[turn].get("resample", [])
        v = float(np.mean(resample)) if resample else float("nan")
        q = float(np.mean(keep)) if keep else float("nan")
        v_lo, v_hi = bootstrap_ci(resample, seed * 1_009 + turn * 2 + 0)
        q_lo, q_hi = bootstrap_ci(keep, seed * 1_009 + turn * 2 + 1)
        a_lo, a_hi = diff_ci(keep, resample, seed * 1_013 + turn)
        rows.append({"turn": turn, "v": v, "q": q, "a": q - v, "v_lo": v_lo, "v_hi": v_hi,
                     "q_lo": q_lo, "q_hi": q_hi, "a_lo": a_lo, "a_hi": a_hi,
                     "n": float(min(len(keep), len(resample)))})
    return rows


def worst_turn(rows: list[dict]) -> int | None:
    """The turn with the lowest A = Q - V < 0 (the earliest among equals); None when no turn's
    recorded action lost value (every A >= 0) or there are no rows."""
    lost = [r for r in rows if np.isfinite(r["a"]) and r["a"] < 0]
    return min(lost, key=lambda r: (r["a"], r["turn"]))["turn"] if lost else None
