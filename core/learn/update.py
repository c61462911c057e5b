"""The optimisation stage: scored trajectories -> gradient steps on the LoRA adapters.

One microbatch per trajectory (B = 1, no padding), gradients accumulated over a minibatch, so the
norm of each trajectory's increment to the accumulated gradient is returned as its own gradient
norm (``UpdateResult.grad_norms``, recorded as ``trajectories.grad_norm``): a grad-norm spike
can be traced to the trajectories behind it.
Each microbatch's loss is weighted so that the accumulated gradient equals the gradient of the
whole minibatch's loss under the configured aggregation (core/learn/losses.py decides the modes). PPO's
value loss is the token mean over the same minibatch, whatever ``minibatches`` is: splitting a
batch into minibatches changes how often the critic steps, not the size of each step.

``lora_dropout`` acts in the update's forward and backward only (``Policy.dropout``, its masks
drawn from the update's seed); sampling, the old-logprob, value and reference passes and
evaluation run without it, so they are deterministic.

Per optimizer step: norm before clipping -> clip -> step. A non-finite loss or gradient skips the
step (recorded); an approximate KL to the sampling policy above ``kl_abort`` aborts the rest of
the update (LOOP).

Under torchrun (``ranks``, core/learn/distributed.py) each rank passes only its own samples: the loss
weights use the totals of all ranks' samples, gradients are summed over ranks before clipping, and
every decision (skip, abort) and loss metric is taken over all ranks, so the step equals one
process's step over the whole batch. Every rank must call these functions the same number of times.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from core.algorithms.catalog import resolve
from core.algorithms.registry import Algorithm
from core.rollout.diagnostics import GradIncrements, module_grad_norms
from core.learn.distributed import ONE, Ranks
from core.learn.losses import policy_loss, value_loss
from core.learn.mismatch import correct_rollout, sample_mismatch
from core.model.policy import Policy, token_logprobs
from core.rollout.trajectory import Trajectory


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
    train_logprobs: torch.Tensor | None = None
    """The trainer's own logprobs under the weights that sampled (before any step of this
    update; core/learn/mismatch.py); None where not computed."""
    is_weights: torch.Tensor | None = None
    """Rollout correction's importance weights (``--rollout-correction tis|mis``), detached."""
    rejected: torch.Tensor | None = None
    """The tokens rollout correction's rejection band left out of the loss (``mis|rs``; bool like
    ``mask``, which no longer holds them); None where no rejection ran. Recorded as
    ``tokens.rejected``: the mismatch is measured on them too (core/learn/mismatch.py)."""
    old_values: torch.Tensor | None = None
    """The value head's estimates before the update (PPO's GAE input): the value clip's anchor."""

    @property
    def tokens(self) -> int:
        return int(self.mask.sum())


def make_samples(trajs: Sequence[Trajectory], advantages: Sequence[torch.Tensor] | None = None,
                 returns: Sequence[torch.Tensor | None] | None = None,
                 values: Sequence[torch.Tensor | None] | None = None) -> list[Sample]:
    """The trajectories as samples, with credit's per-token advantages and (PPO) returns and
    values before the update."""
    out = []
    for i, t in enumerate(trajs):
        lp = torch.tensor([x if x is not None else 0.0 for x in t.logprobs], dtype=torch.float32)
        adv = advantages[i].float()[None] if advantages is not None else None
        ret = returns[i] if returns is not None else None
        old = values[i] if values is not None else None
        out.append(Sample(traj=t, ids=torch.tensor([t.token_ids]),
                          mask=torch.tensor([t.trained], dtype=torch.bool), old_logprobs=lp[None],
                          advantages=adv,
                          returns=ret.float()[None] if ret is not None else None,
                          old_values=old.float()[None] if old is not None else None))
    return out


def _temp(cfg) -> float:
    return cfg.temperature if cfg.temperature > 0 else 1.0


def score_reference(policy: Policy, samples: Sequence[Sample], cfg) -> None:
    """The KL reference's logprobs of every trained token, for KL and record: the adapter frozen
    at the start of RL, or the base model (adapters off) with ``kl_reference=base``
    (``Policy.reference``)."""
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


def score_train(policy: Policy, samples: Sequence[Sample], cfg) -> None:
    """The trainer's own logprobs of every trained token under the current weights (no dropout,
    no gradient): the other side of the sampler's, for the rollout correction."""
    with torch.no_grad():
        for s in samples:
            s.train_logprobs = token_logprobs(policy, s.ids, s.mask, temperature=_temp(cfg))["logprobs"]


@dataclass
class UpdateResult:
    metrics: dict[str, float] = field(default_factory=dict)
    module_norms: dict[str, float] = field(default_factory=dict)
    grad_norms: dict[str, float] = field(default_factory=dict)
    """Trajectory id -> norm of its increment to the gradient (first epoch)."""
    bad: str | None = None
    """Why an optimizer step was skipped for non-finite values (None when all were fine)."""


def _weights(samples: Sequence[Sample], agg: str, ranks: Ranks = ONE
             ) -> tuple[list[float], list[float]]:
    """Per-trajectory loss weights making the accumulated loss the minibatch's aggregate (the
    minibatch being the union of every rank's ``samples``): the policy loss's under ``agg``, and
    the token mean's, ``tokens_i / sum_j tokens_j``, which the value loss always uses."""
    tokens, nonempty, count = ranks.sum([sum(s.tokens for s in samples),
                                         sum(1 for s in samples if s.tokens), len(samples)])
    by_token = [s.tokens / (tokens or 1) for s in samples]
    if agg == "sum":  # the loss already carries its own normalisation
        return [1.0] * len(samples), by_token
    if agg == "token-mean":
        return by_token, by_token
    if agg == "seq-mean-token-mean":
        n = nonempty or 1
        return [1.0 / n if s.tokens else 0.0 for s in samples], by_token
    return [1.0 / max(count, 1)] * len(samples), by_token


@dataclass
class _StepOutcome:
    """What one optimizer step did: per-sample stats, why it was skipped (None when it was
    taken), and its metrics, per-trajectory gradient increments and per-module norms."""
    stats: list[tuple[Sample, dict]] = field(default_factory=list)
    bad: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    grad_norms: dict[str, float] = field(default_factory=dict)
    module_norms: dict[str, float] = field(default_factory=dict)
    norm: float | None = None
    """The gradient norm before clipping (None when no step was tried)."""


def _optimizer_step(policy: Policy, optimizer, samples: Sequence[Sample],
                    loss_of: Callable[[Sample, float, float], tuple[torch.Tensor, dict]], cfg,
                    record_grad_norms: bool, abort_kl: float | None = None,
                    ranks: Ranks = ONE) -> _StepOutcome:
    """Accumulate the microbatches of one minibatch, then clip and step.

    ``loss_of(sample, w, w_token)`` gets the sample's policy-loss weight and token-mean weight
    within the minibatch (``_weights``)."""
    params = policy.trainable_parameters()
    optimizer.zero_grad(set_to_none=False)
    tracker = GradIncrements(params) if record_grad_norms else None
    out = _StepOutcome()
    for s, w, w_token in zip(samples, *_weights(samples, cfg.loss_agg, ranks)):
        loss, m = loss_of(s, w, w_token)
        if not torch.isfinite(loss):
            out.bad = f"non-finite loss on {s.traj.traj_id}"
            out.metrics["update/nonfinite_loss"] = 1.0
            break
        loss.backward()
        if tracker is not None:
            out.grad_norms[s.traj.traj_id] = tracker.increment()
        out.stats.append((s, m))
    if ranks.world > 1:
        kl_sum, kl_tokens, bad = ranks.sum([_token_weighted(out.stats, "policy/approx_kl") *
                                            _tokens_with(out.stats, "policy/approx_kl"),
                                            _tokens_with(out.stats, "policy/approx_kl"),
                                            float(out.bad is not None)])
        kl = kl_sum / kl_tokens if kl_tokens else 0.0
        if bad and out.bad is None:
            out.bad = "non-finite loss on another rank"
            out.metrics["update/nonfinite_loss"] = 1.0
        ranks.sum_grads(params)  # every rank calls it, even when the step is skipped
    else:
        kl = _token_weighted(out.stats, "policy/approx_kl")
    if out.bad is None and abort_kl is not None and kl > abort_kl:
        out.metrics["update/kl_aborted"] = 1.0
    elif out.bad is None:
        out.module_norms = module_grad_norms(policy.lora_modules())
        out.norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        if math.isfinite(out.norm):
            optimizer.step()
            out.metrics["update/steps"] = 1.0
        else:
            out.bad = f"non-finite gradient norm {out.norm}"
            out.metrics["update/nonfinite_grad"] = 1.0
    optimizer.zero_grad(set_to_none=False)
    return out


def _fold(result: UpdateResult, step: _StepOutcome) -> None:
    """One optimizer step's outcome into the update's result: steps counted, the first step's
    gradient norm and the largest, the first reason to skip."""
    m = result.metrics
    for key, value in step.metrics.items():
        m[key] = m.get(key, 0.0) + value if key == "update/steps" else value
    if step.norm is not None:
        m.setdefault("grad/norm", step.norm)  # the first step's, before clipping
        m["grad/norm_max"] = max(m.get("grad/norm_max", 0.0), step.norm)
    if step.module_norms:
        result.module_norms = step.module_norms
    result.grad_norms.update(step.grad_norms)
    result.bad = result.bad or step.bad


def _token_weighted(stats: list[tuple[Sample, dict]], name: str) -> float:
    total = _tokens_with(stats, name)
    return sum(m[name] * s.tokens for s, m in stats if name in m) / total if total else 0.0


def _tokens_with(stats: list[tuple[Sample, dict]], name: str) -> int:
    return sum(s.tokens for s, m in stats if name in m)


def policy_update(policy: Policy, optimizer, samples: Sequence[Sample], cfg,
                  seed: int = 0, ranks: Ranks = ONE, algo: Algorithm | None = None) -> UpdateResult:
    """``ppo_epochs`` passes over the (unfiltered) samples in ``minibatches`` minibatches, with
    the value loss where ``algo`` (the run's resolved algorithm; from ``cfg.algo`` if None) has
    a critic.

    On several ranks, optimizer step k takes the k-th minibatch of every rank's samples."""
    result = UpdateResult(metrics={"update/steps": 0.0})
    train = [s for s in samples if s.tokens and not s.traj.filtered]
    n_train = ranks.sum([len(train)])[0]
    if not n_train:
        return result
    ppo = (algo if algo is not None else resolve(cfg.algo)).needs_value_head
    dual_clip = cfg.dual_clip if cfg.dual_clip > 0 else None
    value_clip = getattr(cfg, "value_clip", 0.0) or None  # verl's cliprange_value
    t_max = cfg.max_new_tokens * cfg.max_turns
    sampler = {s.traj.traj_id: s.old_logprobs for s in train}
    correction = getattr(cfg, "rollout_correction", "none")
    if correction != "none":  # both sides before any step, and masks before the loss weights
        score_train(policy, train, cfg)
        result.metrics.update(sample_mismatch(train, sampler))  # every trained token, unmasked
        result.metrics.update(correct_rollout(train, cfg))
        train = [s for s in train if s.tokens]
    # Without a correction the trainer's own logprob comes free: a sample's first forward before
    # the first optimizer step (one minibatch, no dropout) runs under the weights that sampled.
    free = cfg.lora_dropout == 0

    def loss_of(s: Sample, w: float, w_token: float) -> tuple[torch.Tensor, dict]:
        out = token_logprobs(policy, s.ids, s.mask, temperature=_temp(cfg), with_values=ppo)
        s.new_logprobs = out["logprobs"].detach()
        if s.train_logprobs is None and free and not result.metrics["update/steps"]:
            s.train_logprobs = s.new_logprobs
        loss, m = policy_loss(out["logprobs"], s.old_logprobs, s.advantages, s.mask,
                              clip_low=cfg.clip_eps_low, clip_high=cfg.clip_eps_high,
                              clip_mode=cfg.clip_mode, agg=cfg.loss_agg,
                              ref_logprobs=s.ref_logprobs, kl_coef=cfg.kl_coef, t_max=t_max,
                              dual_clip=dual_clip, is_weights=s.is_weights)
        loss = loss * w
        if ppo:
            s.values = out["values"].detach()
            vloss, vm = value_loss(out["values"], s.returns, s.mask, old_values=s.old_values,
                                   clip=value_clip)
            # token mean over this minibatch (all ranks'), like the policy loss: not over the
            # whole batch, which would shrink the critic's step by the number of minibatches
            loss = loss + cfg.vf_coef * vloss * w_token
            m = {**m, **vm}
        return loss, m

    rng = random.Random(seed)
    before = _snapshot(policy)
    all_stats: list[tuple[Sample, dict]] = []
    # dropout spans forward and backward: the logits' checkpointed recomputation must meet the
    # same layers in the same mode, with the same masks
    with policy.dropout(seed=seed + 7_919 * ranks.rank):
        for epoch in range(cfg.ppo_epochs):
            order = list(train)
            if cfg.minibatches > 1:
                rng.shuffle(order)
            for batch in _minibatches(order, cfg.minibatches, ranks):
                step = _optimizer_step(policy, optimizer, batch, loss_of, cfg,
                                       record_grad_norms=epoch == 0, abort_kl=cfg.kl_abort,
                                       ranks=ranks)
                _fold(result, step)
                if epoch == 0:
                    all_stats += step.stats
                if result.bad or "update/kl_aborted" in result.metrics:
                    break
            if result.bad or "update/kl_aborted" in result.metrics:
                break
    result.metrics.update(_loss_metrics(all_stats, ranks))
    result.metrics.update(weight_change(before, policy.trainable_parameters()))
    if correction == "none":
        result.metrics.update(sample_mismatch(train, sampler))
    result.metrics["update/trained_trajectories"] = float(n_train)
    return result


def _snapshot(policy: Policy) -> list[torch.Tensor]:
    """Copies of the trainable weights, where they live (a LoRA adapter: a few MB)."""
    return [p.detach().clone() for p in policy.trainable_parameters()]


def weight_change(before: Sequence[torch.Tensor], after: Sequence[torch.Tensor]) -> dict[str, float]:
    """How far one update moved the adapter: ``update/delta_rms`` = sqrt(mean_i (w'_i - w_i)^2)
    and ``update/delta_rel`` = ||w' - w|| / ||w||, summed on the weights' device in float64 and
    read back once. AdamW's first step from a fresh state moves every weight with a gradient by
    the full lr (delta_rms = lr); started from SFT's second moments with zero momentum it moves
    them by lr x m_hat / sqrt(v_sft), far less when RL's gradients are small next to SFT's, so
    delta_rms / lr says how hard RL is actually pushing."""
    if not before:
        return {"update/delta_rms": 0.0, "update/delta_rel": 0.0}
    sums = torch.stack([torch.stack([(a.detach().double() - b.double()).pow(2).sum(),
                                     b.double().pow(2).sum()]) for b, a in zip(before, after)])
    moved, size = sums.sum(0).tolist()
    count = sum(b.numel() for b in before)
    return {"update/delta_rms": (moved / count) ** 0.5 if count else 0.0,
            "update/delta_rel": (moved / size) ** 0.5 if size > 0 else 0.0}


def _minibatches(order: list[Sample], count: int, ranks: Ranks) -> list[list[Sample]]:
    """Consecutive slices of ``order``. On several ranks exactly ``count`` slices (some maybe
    empty), so every rank takes part in every optimizer step's collectives."""
    if ranks.world == 1:
        size = math.ceil(len(order) / count)
        return [order[i:i + size] for i in range(0, len(order), size)]
    base, extra = divmod(len(order), count)
    bounds = [k * base + min(k, extra) for k in range(count + 1)]
    return [order[bounds[k]:bounds[k + 1]] for k in range(count)]


LOSS_METRICS = ("policy/pg_loss", "policy/clipfrac", "policy/clipfrac_low", "policy/clipfrac_high",
                "policy/approx_kl", "policy/kl", "value/loss", "value/clipfrac")


def _loss_metrics(stats: list[tuple[Sample, dict]], ranks: Ranks = ONE) -> dict[str, float]:
    """Token-weighted means of the first epoch's per-trajectory loss metrics (over all ranks).

    Built from sums (tokens, metric x tokens; for the value head's explained variance
    1 - Var(R - V) / Var(R), the sums of R, R^2, R - V and (R - V)^2) so that ranks add them up."""
    sums = []
    for name in LOSS_METRICS:
        sums += [sum(m[name] * s.tokens for s, m in stats if name in m),
                 _tokens_with(stats, name), float(any(name in m for _, m in stats))]
    valued = [(s.returns[s.mask], s.values[s.mask]) for s, _ in stats
              if s.values is not None and s.returns is not None]
    r = torch.cat([x for x, _ in valued]).double() if valued else torch.zeros(0, dtype=torch.float64)
    e = r - torch.cat([v for _, v in valued]).double() if valued else r
    sums += [float(len(valued)), float(r.numel()), float(r.sum()), float((r * r).sum()),
             float(e.sum()), float((e * e).sum()), float(len(stats))]
    sums = ranks.sum(sums)
    low, high = ranks.max([-min((m["policy/ratio_min"] for _, m in stats), default=float("inf")),
                           max((m["policy/ratio_max"] for _, m in stats), default=float("-inf"))])
    if not sums[-1]:
        return {}
    out = {}
    for k, name in enumerate(LOSS_METRICS):
        total, tokens, present = sums[3 * k:3 * k + 3]
        if present:
            out[name] = total / tokens if tokens else 0.0
    out["policy/ratio_min"], out["policy/ratio_max"] = -low, high
    valued_n, n, r_sum, r_sq, e_sum, e_sq = sums[3 * len(LOSS_METRICS):-1]
    if valued_n:
        var_r = r_sq / n - (r_sum / n) ** 2 if n else 0.0
        var_e = e_sq / n - (e_sum / n) ** 2 if n else 0.0
        out["value/explained_var"] = 1.0 - var_e / var_r if var_r > 1e-12 else 0.0
    return out


def sft_update(policy: Policy, optimizer, samples: Sequence[Sample], cfg,
               ranks: Ranks = ONE, seed: int = 0) -> UpdateResult:
    """One step of supervised fine-tuning: token-mean negative log-likelihood of the trained tokens
    (the mean over every rank's tokens), with LoRA dropout drawn from ``seed``."""
    result = UpdateResult(metrics={"update/steps": 0.0})
    train = [s for s in samples if s.tokens]
    total = int(ranks.sum([sum(s.tokens for s in train)])[0])
    losses = []

    def loss_of(s: Sample, w: float, w_token: float) -> tuple[torch.Tensor, dict]:
        lp = token_logprobs(policy, s.ids, s.mask)["logprobs"]
        s.new_logprobs = lp.detach()
        nll = -(lp * s.mask).sum() / max(total, 1)
        losses.append(float(nll.detach()))
        return nll, {}

    sft_cfg = _SftView(cfg)
    before = _snapshot(policy)
    with policy.dropout(seed=seed + 7_919 * ranks.rank):
        _fold(result, _optimizer_step(policy, optimizer, train, loss_of, sft_cfg,
                                      record_grad_norms=True, ranks=ranks))
    result.metrics.update(weight_change(before, policy.trainable_parameters()))
    result.metrics = {"sft/loss": ranks.sum([sum(losses)])[0],
                      "sft/grad_norm": result.metrics.get("grad/norm", 0.0),
                      "sft/tokens": float(total),
                      **{k: v for k, v in result.metrics.items() if k.startswith("update/")}}
    return result


def carry_second_moments(before, after) -> int:
    """Start ``after``, a fresh AdamW over the same parameters (RL's), from the second moments
    ``before`` (SFT's) gathered; return how many parameters were seeded (0: nothing to carry).

    AdamW moves a weight by lr * m_hat / (sqrt(v_hat) + eps). From a fresh state the first step
    has m_hat = g and v_hat = g^2, so every weight with any gradient moves by the full lr,
    sign(g) * lr, however small g is: one RL step on mostly zero-variance groups (gradient norm
    0.07) moved each LoRA weight of a sharp post-SFT policy by 2e-4 and halved held-out success.
    Seeded with SFT's v (and its step count, so the bias correction 1 - beta2^k stays that of
    v's history), the first RL step is lr * m_hat / sqrt(v_sft): in proportion to how the RL
    gradient compares with the gradients the adapter was trained with. The first moment starts
    at zero (SFT's direction is not RL's) under the carried step count, so it is barely
    bias-corrected: the first RL steps ramp up as the momentum fills (1 - beta1^k of a full
    step after k steps once SFT ran a few dozen steps), a warm-up that needs no schedule.
    """
    if after.state or not before.state:
        return 0
    seeded = 0
    for group_b, group_a in zip(before.param_groups, after.param_groups):
        for p_b, p_a in zip(group_b["params"], group_a["params"]):
            if p_b is not p_a:
                raise ValueError("carry_second_moments needs two optimizers over the same parameters")
            old = before.state.get(p_b)
            if not old or "exp_avg_sq" not in old:
                continue
            after.state[p_a] = {"step": old["step"].clone() if torch.is_tensor(old["step"])
                                else torch.tensor(float(old["step"])),
                                "exp_avg": torch.zeros_like(p_a, memory_format=torch.preserve_format),
                                "exp_avg_sq": old["exp_avg_sq"].clone()}
            if "max_exp_avg_sq" in old and group_a.get("amsgrad"):
                after.state[p_a]["max_exp_avg_sq"] = old["max_exp_avg_sq"].clone()
            seeded += 1
    return seeded


class _SftView:
    """The config as SFT sees it: its loss weights itself (token mean), so weights are 1."""

    def __init__(self, cfg):
        self.max_grad_norm = cfg.max_grad_norm
        self.loss_agg = "sum"
