"""What the update paid for: per step and behaviour, its prevalence, the covariance of the
trajectories' advantage with it, the trajectories that contributed most, and the shallow-strategy
alarm. Pure functions over NumPy arrays; the job and the trainer feed them (job.py).

Why Cov(A, b). A policy-gradient step with the score-function estimator moves the parameters by
    d theta = eta * (1/N) * sum_i A_i * grad log pi(tau_i).
To first order the expected behaviour E[b] = E_pi[b(tau)] then changes by
    d E[b] = grad E[b] . d theta,  with grad E[b] = E[b(tau) grad log pi(tau)]
           = E[(b - E b) grad log pi(tau)],
and if the per-trajectory scores grad log pi(tau_i) are of comparable norm and roughly
orthogonal across trajectories (the usual heuristic), the product sums to
    d E[b]  ~  eta * c * Cov(A, b)      (c > 0: the typical squared score norm),
so a positive covariance means this step made the behaviour more likely. Estimated over the
step's N trajectories where b is defined:
    Cov(A, b) = sum_i (A_i - mean A)(b_i - mean b) / (N - 1).

When it misleads: PPO/GRPO clipping zeroes the gradient of trajectories whose ratio left the
band (their A still counts here); a KL penalty or entropy bonus pulls the other way; a
per-sequence length normalisation (GRPO's 1/|o_i|, ``loss_agg`` seq-mean-token-mean) weighs a
long trajectory's step by less than its A says, so a behaviour correlated with length (tokens,
turns) is mis-scaled -- the length bias Dr. GRPO removes. A global token mean has no such
bias: it divides the whole batch by one count, a constant multiple of the sequence-sum
estimator above; per-token advantages (PPO, GiGPO's step term, IGPO's and SPA's turn credit)
are not one A per trajectory: A is their mean over the trained tokens, the advantage the loss
applied (job.py), not the stored episode scalar; groups whose rewards are all equal have A = 0
and contribute nothing, however common the behaviour; with a handful of trajectories the
estimate is noise -- hence the significance test below; and trajectories filtered out of the
update (StarPO-S) are counted though they trained nothing.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy.special import stdtr

ALPHA = 0.05
"""One-sided level of the test that a step's Cov(A, b) is above 0."""
K_STEPS = 3
"""Consecutive steps a shallow behaviour must be reinforced, its rate rising, to raise the alarm."""
MIN_N = 4
"""Fewer trajectories with both A and b than this: no test (the variance of 3 products is noise)."""


def covariance(adv: np.ndarray, b: np.ndarray) -> float:
    """Cov(A, b) = sum_i (A_i - mean A)(b_i - mean b) / (N - 1); NaN for N < 2.

    >>> covariance(np.array([1.0, -1.0, 1.0, -1.0]), np.array([1.0, 0.0, 1.0, 0.0]))
    0.6666666666666666
    """
    if len(adv) < 2:
        return math.nan
    return float(np.sum((adv - adv.mean()) * (b - b.mean())) / (len(adv) - 1))


def contributions(adv: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each trajectory's share of the covariance: (A_i - mean A)(b_i - mean b)."""
    return (adv - adv.mean()) * (b - b.mean())


def reinforced_p(adv: np.ndarray, b: np.ndarray) -> float:
    """One-sided p-value that Cov(A, b) > 0: a one-sample t-test on the products
    p_i = (A_i - mean A)(b_i - mean b), t = mean(p) / (sd(p) / sqrt(N)), Student's t with N - 1
    degrees of freedom. 1.0 when untestable: N < MIN_N, or A or b constant over the step (the
    step cannot move b: a zero-variance group, a behaviour every trajectory shares)."""
    n = len(adv)
    if n < MIN_N or np.ptp(adv) == 0 or np.ptp(b) == 0:
        return 1.0
    p = contributions(adv, b)
    sd = float(p.std(ddof=1))
    if sd == 0:
        return 0.0 if p.mean() > 0 else 1.0
    # stdtr(df, x) is Student's t CDF: the upper tail of t is stdtr(df, -t)
    return float(stdtr(n - 1, -p.mean() / (sd / math.sqrt(n))))


def step_stats(adv: Sequence[float | None], values: Sequence[float | None]) -> dict:
    """For one step and behaviour: ``rate`` = mean of b over the trajectories where b is defined;
    ``adv_cov`` and ``p`` over those that also have an advantage (NaN / 1.0 where fewer than 2).
    """
    b_all = np.array([v for v in values if v is not None], dtype=float)
    pairs = [(a, v) for a, v in zip(adv, values)
             if v is not None and a is not None and math.isfinite(a)]
    a = np.array([x for x, _ in pairs], dtype=float)
    b = np.array([y for _, y in pairs], dtype=float)
    return {"rate": float(b_all.mean()) if len(b_all) else math.nan,
            "adv_cov": covariance(a, b), "p": reinforced_p(a, b), "n": len(b_all)}


def alarm_steps(steps: Sequence[int], rate: Sequence[float], p: Sequence[float],
                adv_cov: Sequence[float], k: int = K_STEPS, alpha: float = ALPHA) -> list[int]:
    """Steps (of ``steps``, in order, each a recorded step of the run) where the shallow-strategy
    alarm holds: over the window of the last k recorded steps ending there, every step's
    Cov(A, b) > 0 with p < alpha, and the rate rose across the window (rate at its end >
    rate at its start). Under no real reinforcement, k independent tests pass together with
    probability alpha^k (1.25e-4 for 0.05 and 3)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    out = []
    for i in range(k - 1, len(steps)):
        window = range(i - k + 1, i + 1)
        if all(adv_cov[j] > 0 and p[j] < alpha for j in window) and \
                (k == 1 or rate[i] > rate[i - k + 1]):
            out.append(int(steps[i]))
    return out


class AlarmTracker:
    """The alarm as a trainer sees it, one step at a time: keeps the last k steps of each
    behaviour and answers whether the alarm holds at the newest (same rule as ``alarm_steps``)."""

    def __init__(self, k: int = K_STEPS, alpha: float = ALPHA):
        self.k, self.alpha = k, alpha
        self.history: dict[str, list[tuple[int, float, float, float]]] = {}

    def add(self, name: str, step: int, stats_: dict) -> bool:
        h = self.history.setdefault(name, [])
        h.append((step, stats_["rate"], stats_["p"], stats_["adv_cov"]))
        del h[:-self.k]
        steps, rate, p, cov = zip(*h)
        return bool(alarm_steps(steps[-self.k:], rate, p, cov, self.k, self.alpha)
                    and len(h) == self.k)
