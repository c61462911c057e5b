"""Losses over trained tokens, as pure tensor functions -> (loss, metrics).

Every token tensor is (B, T) and comes with ``mask`` (B, T) bool, True on the model's own tokens
(the loss mask exactly as recorded in ``tokens.trained``). Prompt, observation and padding
positions never reach the loss or its gradient: they are replaced by 0 before any exp or
product, so garbage there (e.g. padded logprobs) cannot leak NaN into the backward pass.

How token losses become one number is decided in one place, ``agg_loss``.
"""
from __future__ import annotations

from typing import Callable

import torch

# -------------------------------------------------------------------------------------------------
# Aggregation: (B, T) token values -> scalar


def _check_pair(x: torch.Tensor, mask: torch.Tensor, name: str = "x") -> None:
    if x.dim() != 2 or x.shape != mask.shape:
        raise ValueError(f"{name} {tuple(x.shape)} and mask {tuple(mask.shape)} must both be (B, T)")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")


def _masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, torch.zeros_like(x))


def token_mean(x: torch.Tensor, mask: torch.Tensor, t_max: int | None = None) -> torch.Tensor:
    """sum over all trained tokens / number of trained tokens (DAPO; verl's default). Long
    responses weigh more, token for token."""
    return _masked(x, mask).sum() / mask.sum().clamp(min=1)


def seq_mean_token_mean(x: torch.Tensor, mask: torch.Tensor, t_max: int | None = None) -> torch.Tensor:
    """mean over sequences with >= 1 trained token of (per-sequence token mean) (original GRPO).
    Every trajectory weighs the same, whatever its length."""
    count = mask.sum(dim=1)
    per_seq = _masked(x, mask).sum(dim=1) / count.clamp(min=1)
    has = count > 0
    return _masked(per_seq, has).sum() / has.sum().clamp(min=1)


def seq_mean_token_sum_norm(x: torch.Tensor, mask: torch.Tensor,
                            t_max: int | None = None) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025): mean over all B sequences of (per-sequence token sum / T_max).

    T_max is a constant (default mask.shape[1]), so no length normalisation biases the gradient
    towards short correct or long wrong answers (TRL: sum / (B * max_completion_length)).
    """
    t_max = mask.shape[1] if t_max is None else t_max
    if t_max <= 0:
        raise ValueError(f"t_max must be > 0, got {t_max}")
    return _masked(x, mask).sum(dim=1).div(t_max).sum() / max(mask.shape[0], 1)


AGGREGATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "token-mean": token_mean,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}


def agg_loss(x: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
             t_max: int | None = None) -> torch.Tensor:
    """Aggregate token values over trained tokens with the named mode (``AGGREGATIONS``).

    Shapes: x (B,T) float, mask (B,T) bool -> scalar. No trained token at all -> 0 (with a graph).
    ``t_max`` is used only by seq-mean-token-sum-norm.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGGREGATIONS)}")
    _check_pair(x, mask)
    return AGGREGATIONS[mode](x, mask, t_max)


def _mean_over(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float(token_mean(x.detach(), mask))


# -------------------------------------------------------------------------------------------------
# KL and entropy


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref) from samples of pi (verl's low_var_kl):

        k3 = exp(ref - lp) - (ref - lp) - 1     (>= 0, unbiased, low variance)

    The log-ratio is clamped to [-20, 20] and the result to [-10, 10], as verl does, so one
    extreme token cannot blow up the loss. Shapes: (B,T), (B,T) -> (B,T).
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)} and ref_logprobs "
                         f"{tuple(ref_logprobs.shape)} must have the same shape")
    log_ratio = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last axis: H = logsumexp(z) - sum softmax(z) * z.

    Shapes: (..., V) -> (...). Memory is a few (..., V) tensors: call it on chunks for big vocabs.
    """
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


# -------------------------------------------------------------------------------------------------
# Clipped policy gradient

CLIP_MODES = ("ppo", "log")


def _clip_bounds(clip_mode: str, clip_low: float, clip_high: float) -> tuple[float, float]:
    if clip_mode == "ppo":  # PPO; StarPO-S clip-higher uses 0.2 / 0.28 (DAPO's decoupled clip)
        if not 0 <= clip_low < 1 or clip_high < 0:
            raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
        return 1.0 - clip_low, 1.0 + clip_high
    if clip_mode == "log":  # LOOP: symmetric in log space, log r in [-log(1+eps), log(1+eps)]
        if clip_high < 0:
            raise ValueError(f"need clip_high >= 0, got {clip_high}")
        return 1.0 / (1.0 + clip_high), 1.0 + clip_high
    raise ValueError(f"unknown clip_mode {clip_mode!r}; choose one of {', '.join(CLIP_MODES)}")


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, clip_low: float = 0.2, clip_high: float = 0.2,
                clip_mode: str = "ppo", agg: str = "token-mean",
                ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
                dual_clip: float | None = None, t_max: int | None = None,
                is_weights: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate (Schulman et al. 2017) per trained token, plus an optional k3 KL penalty:

        r = exp(lp - old)   pg = max(-A * r, -A * clip(r, low, high))   loss = agg(pg + kl_coef * k3)

    clip_mode "ppo": [1 - clip_low, 1 + clip_high]; "log": LOOP's [1/(1+eps), 1+eps], eps =
    clip_high. dual_clip c > 1 (Ye et al. 2020, verl): for A < 0 the loss is capped at -A * c.
    ``is_weights`` (B,T), detached: rollout correction's importance weights (core/learn/mismatch.py
    ``tis_weights``), multiplying each token's pg term before aggregation, as verl applies them.
    ``old_logprobs`` and ``advantages`` are constants (detached). ``advantages`` may be (B,T) or
    (B,) (one per sequence, spread over its tokens).
    Shapes: logprobs, old_logprobs, mask (B,T) -> (loss scalar, metrics):
      policy/pg_loss        agg of pg alone
      policy/clipfrac       share of trained tokens where clipping changed the loss (= low + high)
      policy/clipfrac_low   ... with A < 0 and r < low     policy/clipfrac_high  ... A > 0, r > high
      policy/ratio_min/max  over trained tokens (1.0 when there are none)
      policy/approx_kl      KL(sampling || current) by k3 on sampled tokens: mean of (r - 1) - log r
      policy/kl             mean k3 to the reference over trained tokens (0 without a reference)
    """
    _check_pair(logprobs, mask, "logprobs")
    _check_pair(old_logprobs, mask, "old_logprobs")
    if advantages.dim() == 1 and advantages.shape[0] == mask.shape[0]:
        advantages = advantages[:, None].expand_as(logprobs)
    _check_pair(advantages, mask, "advantages")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    low, high = _clip_bounds(clip_mode, clip_low, clip_high)

    adv = _masked(advantages.detach(), mask)
    # clamp as verl does: a log-ratio beyond +-20 is a broken sample, not a signal
    log_ratio = _masked(logprobs - old_logprobs.detach(), mask).clamp(-20.0, 20.0)  # (B, T)
    ratio = torch.exp(log_ratio)
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(low, high)
    pg = torch.maximum(pg_unclipped, pg_clipped)  # pessimistic bound
    if dual_clip is not None:
        pg = torch.where(adv < 0, torch.minimum(pg, -adv * dual_clip), pg)
    if is_weights is not None:
        _check_pair(is_weights, mask, "is_weights")
        pg = pg * is_weights.detach()

    per_token = pg
    kl = torch.zeros_like(pg)
    if ref_logprobs is not None:
        _check_pair(ref_logprobs, mask, "ref_logprobs")
        kl = kl_k3(_masked(logprobs, mask), _masked(ref_logprobs.detach(), mask))
        if kl_coef > 0:
            per_token = pg + kl_coef * kl
    loss = agg_loss(per_token, mask, agg, t_max)

    with torch.no_grad():
        r = ratio.detach()
        clipped_low = mask & (adv < 0) & (r < low)
        clipped_high = mask & (adv > 0) & (r > high)
        any_token = bool(mask.any())
        metrics = {
            "policy/pg_loss": float(agg_loss(pg.detach(), mask, agg, t_max)),
            "policy/clipfrac": _mean_over((clipped_low | clipped_high).double(), mask),
            "policy/clipfrac_low": _mean_over(clipped_low.double(), mask),
            "policy/clipfrac_high": _mean_over(clipped_high.double(), mask),
            "policy/ratio_min": float(r[mask].min()) if any_token else 1.0,
            "policy/ratio_max": float(r[mask].max()) if any_token else 1.0,
            "policy/approx_kl": _mean_over((r - 1.0) - log_ratio.detach(), mask),
            "policy/kl": _mean_over(kl, mask),
        }
    return loss, metrics


# -------------------------------------------------------------------------------------------------
# Value head (PPO)


def value_loss(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               old_values: torch.Tensor | None = None, clip: float | None = None,
               ) -> tuple[torch.Tensor, dict[str, float]]:
    """Value regression on trained tokens: token-mean of 0.5 * (V - R)^2; with ``clip`` (PPO2;
    verl's critic with ``cliprange_value``, 0.5 there; the config's ``value_clip``)
    0.5 * max((V - R)^2, (old + clip(V - old, -c, c) - R)^2), so one update cannot move V far.

    Shapes: values, returns, mask (B,T) -> (loss scalar, metrics):
      value/loss            the loss
      value/explained_var   1 - Var(R - V) / Var(R) over trained tokens (0.0 when Var(R) = 0,
                            where it is undefined)
      value/clipfrac        share of trained tokens where the clipped term was larger (with clip)
    """
    _check_pair(values, mask, "values")
    _check_pair(returns, mask, "returns")
    ret = returns.detach()
    err = (values - ret) ** 2
    metrics: dict[str, float] = {}
    if clip is not None:
        if old_values is None:
            raise ValueError("value clipping needs old_values")
        _check_pair(old_values, mask, "old_values")
        old = old_values.detach()
        clipped_err = (old + (values - old).clamp(-clip, clip) - ret) ** 2
        metrics["value/clipfrac"] = _mean_over((clipped_err > err).double(), mask)
        err = torch.maximum(err, clipped_err)
    loss = 0.5 * token_mean(err, mask)

    with torch.no_grad():
        y, v = ret[mask].double(), values.detach()[mask].double()
        var_y = float(y.var(unbiased=False)) if y.numel() > 0 else 0.0
        explained = 1.0 - float((y - v).var(unbiased=False)) / var_y if var_y > 1e-12 else 0.0
    metrics.update({"value/loss": float(loss.detach()), "value/explained_var": explained})
    return loss, metrics
