"""Tokens/s of the policy update against a bare forward+backward over the same tokens. A script:

    nice -n 15 .venv/bin/python bench/update.py --model tiny --trajectories 32

The batch: ``--trajectories`` real rollouts of the model on the search env (max 4 turns, 48 new
tokens a turn), each cut after a seeded random number of turns (1-4), as episodes end at
different turns; advantages are seeded random per trajectory. Variants, interleaved (order rotated
each repeat) so load on the machine hits them alike, each ending in an AdamW step on the LoRA
parameters:

* ``ours: reference + policy_update`` what the trainer runs (core/run/trainer.py ``rl_step``):
  ``score_reference`` (adapters off, no grad) then ``policy_update`` (one microbatch per
  trajectory, logprobs at trained tokens only, clipped PG + KL loss, per-trajectory gradient
  norms, per-module norms, clipping).
* ``ours: policy_update, kl_coef 0`` the same without the reference pass (nothing needs it).
* ``bare B=1, logprobs at trained tokens`` one trajectory per forward through the project's
  ``token_logprobs`` (LM head only at trained tokens), a plain NLL, backward: the same compute as
  ours without the loss terms and diagnostics, so ours / this = their overhead.
* ``bare B=1`` one trajectory per forward: ``model(ids, labels=...)`` (Hugging Face's own
  cross-entropy over the trained tokens), backward; no diagnostics.
* ``bare padded, rollout order`` / ``bare padded, sorted`` the same in right-padded microbatches
  of ``--micro`` rows, in rollout order or sorted by length (less padding).

"vs best bare" = seconds / the fastest bare variant's - 1. Padding fraction = pad tokens / all tokens of the
padded microbatches.
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.config import TrainConfig  # noqa: E402
from core.envs.base import make_env  # noqa: E402
from core.model.policy import load_policy, token_logprobs  # noqa: E402
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling
from core.learn.update import make_samples, policy_update, score_reference  # noqa: E402


def make_batch(policy, n: int, seed: int = 0) -> list:
    """n rollouts on the search env, each cut after a random number (1-4) of its turns."""
    env = make_env("search", seed=0)
    G = 8
    tasks = env.tasks("train", max(1, n // G), seed)
    trajs = rollout(policy, env, tasks, group_size=G, seed=seed,
                    sampling=Sampling(max_turns=4, max_new_tokens=48))[:n]
    rng = random.Random(seed)
    out = []
    for t in trajs:
        k = rng.randint(1, 4)
        end = max(i for i, turn in enumerate(t.token_turn) if turn < k) + 1
        out.append(dataclasses.replace(
            t, token_ids=t.token_ids[:end], roles=t.roles[:end], trained=t.trained[:end],
            logprobs=t.logprobs[:end], token_turn=t.token_turn[:end], turns=t.turns[:k],
            info=dict(t.info)))
    return out


def advantages(trajs, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.full((len(t.token_ids),), float(torch.randn(1, generator=g))) for t in trajs]


def padded(trajs, micro: int, pad_id: int) -> tuple[list[tuple], float]:
    """Right-padded microbatches (ids, attention mask, labels); and the padding fraction."""
    batches, pad, total = [], 0, 0
    for start in range(0, len(trajs), micro):
        chunk = trajs[start:start + micro]
        width = max(len(t.token_ids) for t in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        labels = torch.full((len(chunk), width), -100, dtype=torch.long)
        for b, t in enumerate(chunk):
            n = len(t.token_ids)
            ids[b, :n] = torch.tensor(t.token_ids)
            mask[b, :n] = 1
            labels[b, :n] = torch.where(torch.tensor(t.trained), ids[b, :n], -100)
        batches.append((ids, mask, labels))
        pad += int((mask == 0).sum())
        total += mask.numel()
    return batches, pad / total


def bare(policy, optimizer, batches) -> None:
    optimizer.zero_grad()
    n = len(batches)
    for ids, mask, labels in batches:
        loss = policy.model(input_ids=ids, attention_mask=mask, labels=labels).loss / n
        loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), 1.0)
    optimizer.step()


def bare_scored(policy, optimizer, trajs) -> None:
    """B=1 with the project's logprobs at trained tokens only, a plain mean NLL, nothing else."""
    optimizer.zero_grad()
    for t in trajs:
        ids, mask = torch.tensor([t.token_ids]), torch.tensor([t.trained])
        lp = token_logprobs(policy, ids, mask)["logprobs"]
        (-(lp.sum()) / mask.sum() / len(trajs)).backward()
    torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), 1.0)
    optimizer.step()


def ours(policy, optimizer, trajs, advs, cfg, reference: bool) -> None:
    samples = make_samples(trajs, advs)
    if reference:
        score_reference(policy, samples, cfg)
    result = policy_update(policy, optimizer, samples, cfg)
    assert result.bad is None and result.metrics["update/steps"] == 1.0, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--trajectories", type=int, default=32)
    parser.add_argument("--micro", type=int, default=8, help="rows per padded microbatch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    policy = load_policy(args.model, seed=0)
    trajs = make_batch(policy, args.trajectories)
    advs = advantages(trajs)
    policy.model.train()
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-6)
    cfg = TrainConfig(model=args.model)
    cfg0 = dataclasses.replace(cfg, kl_coef=0.0)
    pad = policy.pad_id
    by_len = sorted(trajs, key=lambda t: len(t.token_ids))
    one = [padded([t], 1, pad)[0][0] for t in trajs]
    rollout_order, pad_before = padded(trajs, args.micro, pad)
    sorted_order, pad_after = padded(by_len, args.micro, pad)
    variants = {
        "ours: reference + policy_update": lambda: ours(policy, optimizer, trajs, advs, cfg, True),
        "ours: policy_update, kl_coef 0": lambda: ours(policy, optimizer, trajs, advs, cfg0, False),
        "bare B=1, logprobs at trained tokens": lambda: bare_scored(policy, optimizer, trajs),
        "bare B=1 (HF loss, no diagnostics)": lambda: bare(policy, optimizer, one),
        f"bare padded B={args.micro}, rollout order": lambda: bare(policy, optimizer,
                                                                   rollout_order),
        f"bare padded B={args.micro}, sorted by length": lambda: bare(policy, optimizer,
                                                                      sorted_order),
    }
    names = list(variants)
    times = {n: [] for n in names}
    variants[names[1]]()  # warm-up
    for rep in range(args.repeats):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            t0 = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - t0)
    tokens = sum(len(t.token_ids) for t in trajs)
    trained = sum(sum(t.trained) for t in trajs)
    lengths = [len(t.token_ids) for t in trajs]
    best_bare = min(statistics.median(times[n]) for n in names if n.startswith("bare"))
    print(f"model {args.model}: {len(trajs)} trajectories, {tokens:,} tokens ({trained:,} trained), "
          f"lengths {min(lengths)}-{max(lengths)}; median of {args.repeats} interleaved repeats, "
          f"{args.threads} torch thread(s)")
    print(f"{'variant':42s} {'s/update':>9s} {'tokens/s':>9s} {'vs best bare':>13s}")
    for name in names:
        med = statistics.median(times[name])
        print(f"{name:42s} {med:9.2f} {tokens / med:9.0f} {med / best_bare - 1:+12.1%}")
    print(f"padding fraction of B={args.micro} microbatches: rollout order {pad_before:.1%}, "
          f"sorted by length {pad_after:.1%}; ours (B=1 per trajectory) 0%")


if __name__ == "__main__":
    main()
