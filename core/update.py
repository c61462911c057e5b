"""The optimisation stage: scored trajectories -> gradient steps on the LoRA adapters.

One microbatch per trajectory (B = 1, no padding), gradients accumulated over a minibatch, so the
norm of each trajectory's increment to the accumulated gradient is recorded as its own gradient
norm (``trajectories.grad_norm``): a grad-norm spike can be traced to the trajectories behind it.
Each microbatch's loss is weighted so that the accumulated gradient equals the gradient of the
whole minibatch's loss under the configured aggregation (core/losses.py decides the modes).

Per optimizer step: norm before clipping -> clip -> step. A non-finite loss or gradient skips the
step (recorded); an approximate KL to the sampling policy above ``kl_abort`` aborts the rest of
the update (LOOP).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from core.diagnostics import GradIncrements, module_grad_norms
from core.losses import policy_loss, value_loss
from core.policy import Policy, token_logprobs
from core.trajectory import Trajectory


@dataclass
class Sample:
    """One trajectory as (1, T) tensors."""
    traj: Trajectory
    ids: torch.Tensor
    mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor | None = None
    """None for SFT demonstrations (no advantage)."""
    ref_logprobs: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    new_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None

    @property
    def tokens(self) -> int:
        return int(self.mask.sum())


def make_samples(trajs: Sequence[Trajectory], advantages: Sequence[torch.Tensor] | None = None,
                 ) -> list[Sample]:
    out = []
    for i, t in enumerate(trajs):
        lp = torch.tensor([x if x is not None else 0.0 for x in t.logprobs], dtype=torch.float32)
        adv = advantages[i].float()[None] if advantages is not None else None
        ret = t.info.get("returns")
        out.append(Sample(traj=t, ids=torch.tensor([t.token_ids]),
                          mask=torch.tensor([t.trained], dtype=torch.bool), old_logprobs=lp[None],
                          advantages=adv,
                          returns=ret.float()[None] if ret is not None else None))
    return out


def _temp(cfg) -> float:
    return cfg.temperature if cfg.temperature > 0 else 1.0


def score_reference(policy: Policy, samples: Sequence[Sample], cfg) -> None:
    """The reference policy's (adapters off) logprobs of every trained token, for KL and record."""
    with torch.no_grad(), policy.reference():
        for s in samples:
            s.ref_logprobs = token_logprobs(policy, s.ids, s.mask, temperature=_temp(cfg))["logprobs"]


def score_values(policy: Policy, trajs: Sequence[Trajectory], cfg) -> list[torch.Tensor]:
    """The value head's estimates V(context before token t) at trained tokens, before the update."""
    out = []
    with torch.no_grad():
        for t in trajs:
            ids, mask = torch.tensor([t.token_ids]), torch.tensor([t.trained], dtype=torch.bool)
            out.append(token_logprobs(policy, ids, mask, temperature=_temp(cfg),
                                      with_values=True)["values"][0])
    return out


@dataclass
class UpdateResult:
    metrics: dict[str, float] = field(default_factory=dict)
    module_norms: dict[str, float] = field(default_factory=dict)
    bad: str | None = None
    """Why an optimizer step was skipped for non-finite values (None when all were fine)."""


def _weights(samples: Sequence[Sample], agg: str) -> list[float]:
    """Per-trajectory loss weights making the accumulated loss the minibatch's aggregate."""
    if agg == "sum":  # the loss already carries its own normalisation
        return [1.0] * len(samples)
    if agg == "token-mean":
        total = sum(s.tokens for s in samples) or 1
        return [s.tokens / total for s in samples]
    if agg == "seq-mean-token-mean":
        n = sum(1 for s in samples if s.tokens) or 1
        return [1.0 / n if s.tokens else 0.0 for s in samples]
    return [1.0 / max(len(samples), 1)] * len(samples)


def _optimizer_step(policy: Policy, optimizer, samples: Sequence[Sample],
                    loss_of: Callable[[Sample, float], tuple[torch.Tensor, dict]], cfg,
                    record_grad_norms: bool, result: UpdateResult,
                    abort_kl: float | None = None) -> list[tuple[Sample, dict]]:
    """Accumulate the microbatches of one minibatch, then clip and step. Returns per-sample stats."""
    params = policy.trainable_parameters()
    optimizer.zero_grad(set_to_none=False)
    tracker = GradIncrements(params) if record_grad_norms else None
    stats = []
    for s, w in zip(samples, _weights(samples, cfg.loss_agg)):
        loss, m = loss_of(s, w)
        if not torch.isfinite(loss):
            result.bad = f"non-finite loss on {s.traj.traj_id}"
            result.metrics["update/nonfinite_loss"] = 1.0
            break
        loss.backward()
        if tracker is not None:
            s.traj.info["grad_norm"] = tracker.increment()
        stats.append((s, m))
    kl = _token_weighted(stats, "policy/approx_kl")
    if result.bad is None and abort_kl is not None and kl > abort_kl:
        result.metrics["update/kl_aborted"] = 1.0
    elif result.bad is None:
        result.module_norms = module_grad_norms(policy.lora_modules())
        norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        result.metrics.setdefault("grad/norm", norm)  # the first step's, before clipping
        result.metrics["grad/norm_max"] = max(result.metrics.get("grad/norm_max", 0.0), norm)
        if math.isfinite(norm):
            optimizer.step()
            result.metrics["update/steps"] = result.metrics.get("update/steps", 0.0) + 1
        else:
            result.bad = f"non-finite gradient norm {norm}"
            result.metrics["update/nonfinite_grad"] = 1.0
    optimizer.zero_grad(set_to_none=False)
    return stats


def _token_weighted(stats: list[tuple[Sample, dict]], name: str) -> float:
    total = sum(s.tokens for s, m in stats if name in m)
    return sum(m[name] * s.tokens for s, m in stats if name in m) / total if total else 0.0


def policy_update(policy: Policy, optimizer, samples: Sequence[Sample], cfg,
                  seed: int = 0) -> UpdateResult:
    """``ppo_epochs`` passes over the (unfiltered) samples in ``minibatches`` minibatches."""
    result = UpdateResult(metrics={"update/steps": 0.0})
    train = [s for s in samples if s.tokens and not s.traj.filtered]
    if not train:
        return result
    ppo = cfg.algo == "ppo"
    t_max = cfg.max_new_tokens * cfg.max_turns

    def loss_of(s: Sample, w: float) -> tuple[torch.Tensor, dict]:
        out = token_logprobs(policy, s.ids, s.mask, temperature=_temp(cfg), with_values=ppo)
        s.new_logprobs = out["logprobs"].detach()
        loss, m = policy_loss(out["logprobs"], s.old_logprobs, s.advantages, s.mask,
                              clip_low=cfg.clip_eps_low, clip_high=cfg.clip_eps_high,
                              clip_mode=cfg.clip_mode, agg=cfg.loss_agg,
                              ref_logprobs=s.ref_logprobs, kl_coef=cfg.kl_coef, t_max=t_max)
        loss = loss * w
        if ppo:
            s.values = out["values"].detach()
            vloss, vm = value_loss(out["values"], s.returns, s.mask)
            loss = loss + cfg.vf_coef * vloss * (s.tokens / max(sum(x.tokens for x in train), 1))
            m = {**m, **vm}
        return loss, m

    rng = random.Random(seed)
    all_stats: list[tuple[Sample, dict]] = []
    for epoch in range(cfg.ppo_epochs):
        order = list(train)
        if cfg.minibatches > 1:
            rng.shuffle(order)
        size = math.ceil(len(order) / cfg.minibatches)
        for start in range(0, len(order), size):
            stats = _optimizer_step(policy, optimizer, order[start:start + size], loss_of, cfg,
                                    record_grad_norms=epoch == 0, result=result,
                                    abort_kl=cfg.kl_abort)
            if epoch == 0:
                all_stats += stats
            if result.bad or "update/kl_aborted" in result.metrics:
                break
        if result.bad or "update/kl_aborted" in result.metrics:
            break
    result.metrics.update(_loss_metrics(all_stats))
    result.metrics["update/trained_trajectories"] = float(len(train))
    return result


def _loss_metrics(stats: list[tuple[Sample, dict]]) -> dict[str, float]:
    """Token-weighted means of the first epoch's per-trajectory loss metrics."""
    if not stats:
        return {}
    out = {name: _token_weighted(stats, name) for name in
           ("policy/pg_loss", "policy/clipfrac", "policy/clipfrac_low", "policy/clipfrac_high",
            "policy/approx_kl", "policy/kl", "value/loss")
           if any(name in m for _, m in stats)}
    out["policy/ratio_min"] = min(m["policy/ratio_min"] for _, m in stats)
    out["policy/ratio_max"] = max(m["policy/ratio_max"] for _, m in stats)
    if any(s.values is not None and s.returns is not None for s, _ in stats):
        v = torch.cat([s.values[s.mask] for s, _ in stats])
        r = torch.cat([s.returns[s.mask] for s, _ in stats])
        var = float(r.var(unbiased=False)) if r.numel() else 0.0
        out["value/explained_var"] = 1.0 - float((r - v).var(unbiased=False)) / var if var > 1e-12 else 0.0
    return out


def sft_update(policy: Policy, optimizer, samples: Sequence[Sample], cfg) -> UpdateResult:
    """One step of supervised fine-tuning: token-mean negative log-likelihood of the trained tokens."""
    result = UpdateResult(metrics={"update/steps": 0.0})
    train = [s for s in samples if s.tokens]
    total = sum(s.tokens for s in train)
    losses = []

    def loss_of(s: Sample, w: float) -> tuple[torch.Tensor, dict]:
        lp = token_logprobs(policy, s.ids, s.mask)["logprobs"]
        s.new_logprobs = lp.detach()
        nll = -(lp * s.mask).sum() / max(total, 1)
        losses.append(float(nll.detach()))
        return nll, {}

    sft_cfg = _SftView(cfg)
    _optimizer_step(policy, optimizer, train, loss_of, sft_cfg, record_grad_norms=True, result=result)
    result.metrics = {"sft/loss": sum(losses), "sft/grad_norm": result.metrics.get("grad/norm", 0.0),
                      "sft/tokens": float(total), **{k: v for k, v in result.metrics.items()
                                                     if k.startswith("update/")}}
    return result


class _SftView:
    """The config as SFT sees it: its loss weights itself (token mean), so weights are 1."""

    def __init__(self, cfg):
        self.max_grad_norm = cfg.max_grad_norm
        self.loss_agg = "sum"
