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

verl's own names for the same comparison, in probability space (verl's
``calculate_debug_metrics``), so a user reads the numbers a verl dashboard shows:

    training/rollout_probs_diff_{max,mean,std}   |exp(lp_t) - exp(lp_s)| (std unbiased)
    training/rollout_actor_probs_pearson_corr    Pearson r of exp(lp_t) and exp(lp_s)

Which tokens: every generated token the trainer scored, i.e. the loss mask before any rollout
rejection (``mis``/``rs`` below take the most mismatched tokens out of the loss: measured after
it, the mismatch would hide exactly them). The store keeps them apart (``tokens.rejected``,
``trained`` stays the mask the optimiser applied), and storage/mismatch_queries.py reads the
trained and rejected tokens, so the store's figures equal these.

A token whose logprob on either side is NaN or +/-inf enters none of them: the metrics are over
the finite tokens and ``mismatch/nonfinite_tokens`` counts the others, so one bad value cannot
blank a step's curve.

Corrections, as verl's rollout correction (``rollout_corr_helper.py``) defines them, with C the
cap (``--rollout-is-cap``) and r_seq = exp(sum_t d_t) over a trajectory's trained tokens:

    tis    truncated IS: w = min(r, C) per token, or min(r_seq, C) on every token of the row
           at sequence level (verl's rollout_is token|sequence), detached, multiplying each
           token's policy-gradient loss
    mis    masked IS: w = r * 1[r in [1/C, C]] (sequence level: r_seq * 1[r_seq in [1/C, C]]
           on the whole row); a token with w = 0 also leaves the loss's denominator (verl's
           rejection mask applied to the response mask, with IS weights on what is kept)
    rs     rejection only: the tokens (or rows) MIS would leave out are left out, the rest
           trained with weight 1 (verl's rollout_rs without rollout_is)

Example (trainer [-1, -1, -1], sampler [-1.5, -1.2, -4], C = 2, A = 1, ratio 1, token-mean):
tis -> -(1.6487 + 1.2214 + 2) / 3 = -1.6234; mis -> -(1.6487 + 1.2214) / 2 = -1.4351;
rs -> -1.0.

With any of them, the update's PPO ratio is taken against the trainer's own logprob (verl's
decoupled ratio, pi_theta / pi_old with pi_old recomputed by the trainer), and the mismatch is
corrected by the weight or mask, not by the clip.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

BAND = (0.9, 1.1)
"""The ratio band whose outside share is ``mismatch/ratio_out_frac``."""
CORRECTIONS = ("none", "tis", "mis", "rs")
LEVELS = ("token", "sequence")


def _trained(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x[mask.bool()].double()


def _finite_pairs(train_lp: torch.Tensor, sample_lp: torch.Tensor,
                  mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The trained tokens' (trainer, sampler) logprobs where both are finite, and how many
    trained tokens were left out for a NaN or infinite value on either side."""
    t, s = _trained(train_lp, mask), _trained(sample_lp, mask)
    ok = torch.isfinite(t) & torch.isfinite(s)
    return t[ok], s[ok], int((~ok).sum())


def _pearson(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Pearson r of two float64 vectors; None where it is undefined (under two values, or
    either side constant)."""
    if x.numel() < 2:
        return None
    xc, yc = x - x.mean(), y - y.mean()
    den = torch.sqrt((xc * xc).sum() * (yc * yc).sum())
    return float((xc * yc).sum() / den) if den > 0 else None


def mismatch_metrics(train_lp: torch.Tensor, sample_lp: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, float]:
    """The per-step metrics over the tokens where ``mask`` is True (any equal shapes) and both
    logprobs are finite, ours and verl's (module docstring), with
    ``mismatch/nonfinite_tokens`` the count of masked tokens left out; {} when there are no
    masked tokens at all.

    >>> m = mismatch_metrics(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -2.2]),
    ...                      torch.tensor([True, True]))
    >>> round(m["mismatch/abs_mean"], 4), m["mismatch/ratio_out_frac"]
    (0.1, 0.5)
    """
    t, s, bad = _finite_pairs(train_lp, sample_lp, mask)
    if t.numel() == 0:
        return {"mismatch/nonfinite_tokens": float(bad)} if bad else {}
    d = t - s
    r = torch.exp(d)
    out = {"mismatch/abs_mean": float(d.abs().mean()),
           "mismatch/abs_p95": float(torch.quantile(d.abs(), 0.95)),
           "mismatch/ratio_out_frac": float(((r < BAND[0]) | (r > BAND[1])).double().mean()),
           "mismatch/kl_k3": float((r - 1 - d).mean()),
           "mismatch/nonfinite_tokens": float(bad)}
    p_t, p_s = torch.exp(t), torch.exp(s)
    diff = (p_t - p_s).abs()
    out.update({"training/rollout_probs_diff_max": float(diff.max()),
                "training/rollout_probs_diff_mean": float(diff.mean()),
                "training/rollout_probs_diff_std": float(diff.std()) if diff.numel() > 1 else 0.0})
    corr = _pearson(p_t, p_s)
    if corr is not None:
        out["training/rollout_actor_probs_pearson_corr"] = corr
    return out


def distribution(train_lp: torch.Tensor, sample_lp: torch.Tensor,
                 mask: torch.Tensor) -> dict[str, float]:
    """The table TRL issue 6789 reports, over trained tokens with both logprobs finite: mean,
    sd, p95 and max of |d|, the share outside [0.9, 1.1], and the token count."""
    t, s, _ = _finite_pairs(train_lp, sample_lp, mask)
    d = (t - s).abs()
    if d.numel() == 0:
        return {"tokens": 0}
    r = torch.exp(t - s)
    return {"tokens": int(d.numel()), "mean": float(d.mean()),
            "sd": float(d.std()) if d.numel() > 1 else 0.0,
            "p95": float(torch.quantile(d, 0.95)), "max": float(d.max()),
            "out_of_band": float(((r < BAND[0]) | (r > BAND[1])).double().mean())}


def _check(cap: float, level: str) -> None:
    if not cap >= 1:
        raise ValueError(f"the rollout IS cap must be >= 1, got {cap}")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")


def log_ratios(train_lp: torch.Tensor, sample_lp: torch.Tensor, mask: torch.Tensor | None,
               level: str = "token") -> torch.Tensor:
    """float64 d = lp_t - lp_s per token (0 off the mask), detached; at sequence level each row
    (a trajectory, shape (B, T)) carries sum_t d_t over its masked tokens on every position."""
    d = (train_lp - sample_lp).detach().double()
    if mask is not None:
        d = torch.where(mask.bool(), d, torch.zeros((), dtype=torch.float64))
    if level == "sequence":
        d = d.sum(dim=-1, keepdim=True).expand_as(d)
    return d


def tis_weights(train_lp: torch.Tensor, sample_lp: torch.Tensor, cap: float,
                mask: torch.Tensor | None = None, level: str = "token") -> torch.Tensor:
    """Truncated importance weights, detached: min(exp(d), C) per token, or at sequence level
    min(exp(sum_t d_t), C) broadcast over each row (verl's rollout_is token|sequence).

    >>> tis_weights(torch.tensor([0.0, 0.0]), torch.tensor([-0.1, -2.0]), 2.0).tolist()
    [1.1051709651947021, 2.0]
    >>> tis_weights(torch.tensor([[0.0, 0.0]]), torch.tensor([[-0.1, 0.3]]), 2.0,
    ...             level="sequence")[0].tolist()
    [0.8187307715415955, 0.8187307715415955]
    """
    _check(cap, level)
    w = torch.exp(log_ratios(train_lp, sample_lp, mask, level).clamp(max=20.0)).clamp(max=cap)
    return w.to(train_lp.dtype)


def mis_keep(train_lp: torch.Tensor, sample_lp: torch.Tensor, mask: torch.Tensor, cap: float,
             level: str = "token") -> torch.Tensor:
    """The tokens kept by the rejection band, a bool tensor like ``mask``: token level, those
    with r in [1/C, C]; sequence level, every token of a row whose exp(sum of d over its
    trained tokens) lies in [1/C, C] (rows are trajectories: shape (B, T)).

    >>> mis_keep(torch.tensor([[0.0, 0.0, 0.0]]), torch.tensor([[-0.1, -1.0, 0.9]]),
    ...          torch.tensor([[True, True, True]]), 2.0).tolist()
    [[True, False, False]]
    >>> mis_keep(torch.tensor([[0.0, 0.0]]), torch.tensor([[-0.5, 0.4]]),
    ...          torch.tensor([[True, True]]), 2.0, "sequence").tolist()
    [[True, True]]
    """
    _check(cap, level)
    d = log_ratios(train_lp, sample_lp, mask, level)
    hi = math.log(cap)
    return mask.bool() & (d >= -hi) & (d <= hi)


def mis_weights(train_lp: torch.Tensor, sample_lp: torch.Tensor, mask: torch.Tensor, cap: float,
                level: str = "token") -> tuple[torch.Tensor, torch.Tensor]:
    """Masked importance sampling: (w, keep) with keep = ``mis_keep`` and w = exp(d) (sequence
    level: exp(sum_t d_t) on the row) where kept, 0 elsewhere; detached.

    >>> w, keep = mis_weights(torch.tensor([[-1.0, -1.0, -1.0]]),
    ...                       torch.tensor([[-1.5, -1.2, -4.0]]), torch.ones(1, 3, dtype=torch.bool), 2.0)
    >>> [round(x, 4) for x in w[0].tolist()], keep.tolist()
    ([1.6487, 1.2214, 0.0], [[True, True, False]])
    """
    keep = mis_keep(train_lp, sample_lp, mask, cap, level)
    d = log_ratios(train_lp, sample_lp, mask, level).clamp(max=math.log(cap))
    w = torch.where(keep, torch.exp(d), torch.zeros((), dtype=torch.float64))
    return w.to(train_lp.dtype), keep


# -- on the update's samples (core/learn/update.py) ---------------------------------------------------
def correct_rollout(samples: Sequence, cfg) -> dict[str, float]:
    """Apply ``cfg.rollout_correction`` at ``cfg.rollout_correction_level`` to the update's
    samples (core/learn/update.py ``Sample``) that carry ``train_logprobs``: the PPO ratio is
    taken against the trainer's own logprob; "tis" and "mis" set ``is_weights``; "mis" and "rs"
    narrow the loss mask, and the trajectory's ``trained`` with it (the recorded loss mask is
    the one the optimiser applied), and ``rejected`` names the tokens it took out (recorded as
    ``tokens.rejected``, so the store's mismatch figures are over the same tokens as
    ``sample_mismatch``'s, taken before the rejection). Returns the correction's metrics: the weights' mean and max
    over the trained tokens and the share truncated (tis, mis), the share masked (mis, rs)."""
    kind, cap, level = cfg.rollout_correction, cfg.rollout_is_cap, cfg.rollout_correction_level
    weights, kept, total = [], 0, 0
    for s in samples:
        sampler = s.old_logprobs
        s.old_logprobs = s.train_logprobs
        total += s.tokens
        if kind == "tis":
            s.is_weights = tis_weights(s.train_logprobs, sampler, cap, s.mask, level) * s.mask
        else:
            w, keep = mis_weights(s.train_logprobs, sampler, s.mask, cap, level)
            s.rejected = s.mask.bool() & ~keep
            s.mask = keep
            s.traj.trained = [bool(x) for x in keep[0].tolist()]
            if kind == "mis":
                s.is_weights = w
        if s.is_weights is not None:
            weights.append(s.is_weights[s.mask])
        kept += s.tokens
    out: dict[str, float] = {}
    if kind in ("tis", "mis"):
        w = torch.cat(weights).double() if weights else torch.zeros(0, dtype=torch.float64)
        out.update({"rollout_corr/weight_mean": float(w.mean()) if w.numel() else 1.0,
                    "rollout_corr/weight_max": float(w.max()) if w.numel() else 1.0,
                    "rollout_corr/truncated_frac": float((w >= cap).double().mean())
                    if kind == "tis" and w.numel() else 0.0})
    if kind in ("mis", "rs"):
        out["rollout_corr/masked_frac"] = 1.0 - kept / total if total else 0.0
    return out


def sample_mismatch(samples: Sequence, sampler: dict[str, torch.Tensor]) -> dict[str, float]:
    """mismatch/* over the trained tokens of this rank's samples whose trainer logprobs were
    read (``sampler``: each sample's sampler logprobs by trajectory id)."""
    have = [s for s in samples if s.train_logprobs is not None]
    if not have:
        return {}
    return mismatch_metrics(torch.cat([s.train_logprobs[s.mask] for s in have]),
                            torch.cat([sampler[s.traj.traj_id][s.mask] for s in have]),
                            torch.ones(sum(s.tokens for s in have), dtype=torch.bool))
