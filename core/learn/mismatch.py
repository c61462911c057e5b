"""Training-inference mismatch: the sampler's logprob of a token against the trainer's own.

The rollout samples with one forward (incremental, with a KV cache, perhaps at another precision
or on another engine) and the update scores the same tokens with another (the whole sequence,
the trainer's precision). Under the same weights the two should agree; where they do not, the
importance ratio of the update is off before any step. With lp_s the sampler's logprob of a
sampled token and lp_t the trainer's, under the same weights, before the update:

    d = lp_t - lp_s        r = exp(d) = pi_train(y) / pi_sampler(y)

Per-step metrics over trained tokens (``mismatch_metrics``):

    mismatch/abs_mean        mean |d|
    mismatch/abs_p95         95th percentile of |d|
    mismatch/ratio_out_frac  share of tokens with r outside [0.9, 1.1] (TRL issue 6789's band)
    mismatch/kl_k3           k3 estimate of KL(sampler || trainer): mean (r - 1) - log r
                             (Schulman's k3; unbiased for samples drawn from the sampler)

Corrections, as verl's rollout correction defines them (``rollout_corr``: truncated and masked
importance sampling, token and sequence level), with C the cap (``--rollout-is-cap``):

    tis    w = min(r, C), detached, multiplies each token's policy-gradient loss
    mis    token level: a token with r outside [1/C, C] is left out of the loss (and of its
           denominator); sequence level: a trajectory whose r_seq = exp(sum_t d_t) leaves
           [1/C, C] is left out whole

With either, the update's PPO ratio is taken against the trainer's own logprob (verl's
decoupled ratio, pi_theta / pi_old with pi_old recomputed by the trainer), and the mismatch is
corrected by the weight or mask, not by the clip.
"""
from __future__ import annotations

from typing import Sequence

import torch

BAND = (0.9, 1.1)
"""The ratio band whose outside share is ``mismatch/ratio_out_frac``."""
CORRECTIONS = ("none", "tis", "mis")
LEVELS = ("token", "sequence")


def _trained(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x[mask.bool()].double()


def mismatch_metrics(train_lp: torch.Tensor, sample_lp: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, float]:
    """The four per-step metrics over the tokens where ``mask`` is True (any equal shapes);
    {} when there are none.

    >>> m = mismatch_metrics(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -2.2]),
    ...                      torch.tensor([True, True]))
    >>> round(m["mismatch/abs_mean"], 4), m["mismatch/ratio_out_frac"]
    (0.1, 0.5)
    """
    d = _trained(train_lp, mask) - _trained(sample_lp, mask)
    if d.numel() == 0:
        return {}
    r = torch.exp(d)
    return {"mismatch/abs_mean": float(d.abs().mean()),
            "mismatch/abs_p95": float(torch.quantile(d.abs(), 0.95)),
            "mismatch/ratio_out_frac": float(((r < BAND[0]) | (r > BAND[1])).double().mean()),
            "mismatch/kl_k3": float((r - 1 - d).mean())}


def distribution(train_lp: torch.Tensor, sample_lp: torch.Tensor,
                 mask: torch.Tensor) -> dict[str, float]:
    """The table TRL issue 6789 reports, over trained tokens: mean, sd, p95 and max of |d|, the
    share outside [0.9, 1.1], and the token count."""
    d = (_trained(train_lp, mask) - _trained(sample_lp, mask)).abs()
    if d.numel() == 0:
        return {"tokens": 0}
    r = torch.exp(_trained(train_lp, mask) - _trained(sample_lp, mask))
    return {"tokens": int(d.numel()), "mean": float(d.mean()),
            "sd": float(d.std()) if d.numel() > 1 else 0.0,
            "p95": float(torch.quantile(d, 0.95)), "max": float(d.max()),
            "out_of_band": float(((r < BAND[0]) | (r > BAND[1])).double().mean())}


def tis_weights(train_lp: torch.Tensor, sample_lp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance weights w = min(exp(lp_t - lp_s), C), detached (verl's token TIS).

    >>> tis_weights(torch.tensor([0.0, 0.0]), torch.tensor([-0.1, -2.0]), 2.0).tolist()
    [1.1051709651947021, 2.0]
    """
    if not cap >= 1:
        raise ValueError(f"the rollout IS cap must be >= 1, got {cap}")
    return torch.exp((train_lp - sample_lp).detach().clamp(max=20.0)).clamp(max=cap)


def mis_keep(train_lp: torch.Tensor, sample_lp: torch.Tensor, mask: torch.Tensor, cap: float,
             level: str = "token") -> torch.Tensor:
    """The tokens kept by masked importance sampling, a bool tensor like ``mask``: token level,
    those with r in [1/C, C]; sequence level, every token of a row whose exp(sum of d over its
    trained tokens) lies in [1/C, C] (rows are trajectories: shape (B, T)).

    >>> mis_keep(torch.tensor([[0.0, 0.0, 0.0]]), torch.tensor([[-0.1, -1.0, 0.9]]),
    ...          torch.tensor([[True, True, True]]), 2.0).tolist()
    [[True, False, False]]
    >>> mis_keep(torch.tensor([[0.0, 0.0]]), torch.tensor([[-0.5, 0.4]]),
    ...          torch.tensor([[True, True]]), 2.0, "sequence").tolist()
    [[True, True]]
    """
    if not cap >= 1:
        raise ValueError(f"the rollout IS cap must be >= 1, got {cap}")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    mask = mask.bool()
    d = torch.where(mask, (train_lp - sample_lp).detach().double(), torch.zeros((), dtype=torch.float64))
    lo, hi = -torch.log(torch.tensor(cap, dtype=torch.float64)), torch.log(
        torch.tensor(cap, dtype=torch.float64))
    if level == "token":
        return mask & (d >= lo) & (d <= hi)
    seq = d.sum(dim=-1, keepdim=True)
    return mask & (seq >= lo) & (seq <= hi)


# -- on the update's samples (core/learn/update.py) ---------------------------------------------------
def correct_rollout(samples: Sequence, cfg) -> dict[str, float]:
    """Apply ``cfg.rollout_correction`` to the update's samples (core/learn/update.py ``Sample``) that
    carry ``train_logprobs``: the PPO ratio is taken against the trainer's own logprob; "tis"
    sets ``is_weights``; "mis" narrows the loss mask, and the trajectory's ``trained`` with it
    (the recorded loss mask is the one the optimiser applied). Returns the correction's
    metrics."""
    weights, kept, total = [], 0, 0
    for s in samples:
        sampler = s.old_logprobs
        s.old_logprobs = s.train_logprobs
        total += s.tokens
        if cfg.rollout_correction == "tis":
            s.is_weights = tis_weights(s.train_logprobs, sampler, cfg.rollout_is_cap) * s.mask
            weights.append(s.is_weights[s.mask])
        else:
            s.mask = mis_keep(s.train_logprobs, sampler, s.mask, cfg.rollout_is_cap,
                              cfg.rollout_correction_level)
            s.traj.trained = [bool(x) for x in s.mask[0].tolist()]
        kept += s.tokens
    if cfg.rollout_correction == "tis":
        w = torch.cat(weights) if weights else torch.zeros(0)
        return {"rollout_corr/weight_mean": float(w.mean()) if w.numel() else 1.0,
                "rollout_corr/weight_max": float(w.max()) if w.numel() else 1.0,
                "rollout_corr/truncated_frac": float((w >= cfg.rollout_is_cap).double().mean())
                if w.numel() else 0.0}
    return {"rollout_corr/masked_frac": 1.0 - kept / total if total else 0.0}


def sample_mismatch(samples: Sequence, sampler: dict[str, torch.Tensor]) -> dict[str, float]:
    """mismatch/* over the trained tokens of this rank's samples whose trainer logprobs were
    read (``sampler``: each sample's sampler logprobs by trajectory id)."""
    have = [s for s in samples if s.train_logprobs is not None]
    if not have:
        return {}
    return mismatch_metrics(torch.cat([s.train_logprobs[s.mask] for s in have]),
                            torch.cat([sampler[s.traj.traj_id][s.mask] for s in have]),
                            torch.ones(sum(s.tokens for s in have), dtype=torch.bool))
