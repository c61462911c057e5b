"""Measuring information gain (core/credit/info_gain.py ``measure``): every turn of a trajectory packed in
one row vs one row per turn. A script:

    nice -n 15 .venv/bin/python bench/info_gain.py --init-from CHECKPOINT_DIR --repeats 3
    nice -n 15 .venv/bin/python bench/info_gain.py --model tiny --max-new-tokens 16

One rollout of ``--tasks`` x ``--group-size`` search trajectories (temperature 1, as the RL step
samples them), then both ways of reading p_k = P(gold | context before turn k) over the same
trajectories, interleaved (order rotated each repeat) so that load from other processes hits them
alike. Turn k's context is the history up to turn k's action plus ``<answer>`` and the gold:

* ``one row per turn``: each context is its own row, so the history before turn k is run once
  for every turn from k on: sum_k (s_k + m) tokens (s_k = turn k's action start, m = answer).
* ``packed``: the history up to the last turn is run once, then one answer block per turn that
  sees only its own prefix (a (T, T) mask, positions restarting at s_k): s_last + K * m tokens.

Both sort their rows by length before batching. Printed: seconds per variant (median, and CPU
seconds), the tokens each runs, and the largest difference between their probabilities.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.model import checkpoint  # noqa: E402
from core.config.env_options import parse_env_options  # noqa: E402
from core.envs.base import make_env  # noqa: E402
from core.credit.info_gain import ANSWER_OPEN, action_starts, has_gold, measure  # noqa: E402
from core.model.policy import load_policy  # noqa: E402
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling


def tokens_run(policy, trajs) -> tuple[int, int]:
    """(one row per turn, packed): real tokens each way runs, padding left out."""
    tok = policy.tokenizer
    per_turn = packed = 0
    for t in trajs:
        starts = action_starts(t)
        if not has_gold(t) or len(starts) != t.num_turns:
            continue
        m = len(tok.encode(ANSWER_OPEN, add_special_tokens=False)) + len(
            tok.encode(t.task.golds[0], add_special_tokens=False))
        per_turn += sum(s + m for s in starts)
        packed += starts[-1] + len(starts) * m
    return per_turn, packed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--init-from", default=None, help="a training checkpoint's adapter to load")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--env-options", default="two_hop_frac=0.75")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    policy = load_policy(args.model, seed=0)
    if args.init_from:
        ckpt = checkpoint.load(Path(args.init_from))
        if ckpt is None:
            ap.error(f"--init-from: no checkpoint in {args.init_from}")
        checkpoint.put_adapter({"adapter": ckpt.adapter}, policy)
    env = make_env("search", seed=0, **parse_env_options(args.env_options))
    t0 = time.perf_counter()
    trajs = rollout(policy, env, env.tasks("train", args.tasks, 0), group_size=args.group_size,
                    seed=0, id_prefix="b", sampling=Sampling(
                        max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                        temperature=1.0))
    turns = [t.num_turns for t in trajs]
    print(f"rollout: {len(trajs)} trajectories, turns mean {statistics.mean(turns):.2f} "
          f"max {max(turns)}, {time.perf_counter() - t0:.0f} s")

    variants = {"one row per turn": False, "packed": True}
    wall = {k: [] for k in variants}
    cpu = {k: [] for k in variants}
    results = {}
    for r in range(args.repeats):
        names = list(variants)
        names = names[r % len(names):] + names[:r % len(names)]
        for name in names:
            w0, c0 = time.perf_counter(), time.process_time()
            results[name] = measure(policy, trajs, batch=args.batch, packed=variants[name])
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
    a, b = results["one row per turn"], results["packed"]
    diff = max(abs(x - y) for k in a for x, y in zip(a[k].probs, b[k].probs))
    per_turn, packed = tokens_run(policy, trajs)
    print(f"\n| variant | s (median of {args.repeats}) | CPU s | tokens run |")
    print("|---|---|---|---|")
    for name, n in (("one row per turn", per_turn), ("packed", packed)):
        print(f"| {name} | {statistics.median(wall[name]):.2f} | "
              f"{statistics.median(cpu[name]):.2f} | {n} |")
    ratio = statistics.median(wall["one row per turn"]) / statistics.median(wall["packed"])
    print(f"\npacked is {ratio:.2f}x faster ({per_turn / packed:.2f}x fewer tokens); "
          f"largest probability difference {diff:.2e} over {sum(len(s.probs) for s in a.values())} "
          "turn contexts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
