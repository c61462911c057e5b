"""Generated tokens/s of the batched multi-turn rollout against the obvious alternatives. A script:

    nice -n 15 .venv/bin/python bench/rollout.py --model tiny --tasks 2 --group-size 8
    nice -n 15 .venv/bin/python bench/rollout.py --model smollm2-135m --tasks 1 --max-turns 2 \\
        --max-new-tokens 48 --repeats 2
    nice -n 15 .venv/bin/python bench/rollout.py --model smollm2-135m --tasks 1 --max-turns 2 \\
        --max-new-tokens 48 --group-size 32 --sequential-rollouts 8 --repeats 2

Three ways to roll out the same tasks x G trajectories on the search environment, same model (the
LoRA-wrapped policy), seeds, sampling (temperature 1, no top-k; top-p 1 unless ``--top-p``) and
token budgets:

* ``batched, KV reused``: ``core.rollout.engine.rollout`` as the trainer calls it. All rows sample
  together; one KV cache lives across turns, so a turn only encodes its new observation tokens;
  the LoRA adapter is merged into the weights while sampling (``Policy.merged``).
* ``batched, LoRA unmerged``: the same with ``merge_adapter=False``: peft's LoRA layers as they
  train, three products a linear layer (what the rollout did before the merge).
* ``batched, re-encode``: the same, with ``reuse_cache=False``: every turn starts a fresh cache and
  encodes the whole history again (Search-R1's generation loop does this).
* ``batched, bf16 sampling``: ours with ``--rollout-dtype bf16``: the sampling pass under torch's
  CPU bf16 autocast (the matrix products in bf16, as a bf16 inference engine samples; the
  update stays fp32, so the recorded logprobs carry that mismatch: docs/mismatch.md).
* ``sequential generate``: what a first implementation does. One trajectory at a time; each turn
  calls ``model.generate`` on the full history (KV cache only within that call), stops at the
  env's stop strings, steps the env and appends the observation ids.

The variants are interleaved (order rotated each repeat), so load from other processes on the
machine hits them alike; the ratios are the figure to read: each repeat's tokens/s over the last
variant's in the same repeat, min / median / max over the repeats (``per repeat``), by wall
time and by the process's CPU time (on a machine shared with other work the CPU time is what
the variants' own work costs; the wall time adds the waits for a core).
``--sequential-rollouts N`` times the sequential loop on the first N rollouts of each task only
(at G = 32 on SmolLM2 it would take most of the run): its rollouts run one after another, so its
tokens/s does not depend on how many run; the ratio is tokens/s over tokens/s (the table's token
counts then differ).

The ceiling. Model FLOPs per generated token (forward only):

    F = 2 * N_linear + 2 * V * d + 4 * L * d * c

``N_linear`` = parameters of the decoder's linear layers, the LoRA adapter merged into them (the
unmerged variant's A/B products are extra work, not counted; the embedding is a lookup: no
FLOPs), ``2 V d`` the LM head, ``4 L d c`` attention's QK^T and AV over a context of ``c`` tokens
(``c`` = the mean position of the generated tokens, measured). Achieved = F x tokens/s, against
``torch.matmul`` timed in the same run on the model's own decode shapes ((B, d) x (d, V),
(B, d) x (d, ffn), (B, ffn) x (ffn, d), B = rows in the batch) and on a large square product
(the machine's best case).

Those percentages count the generated tokens' FLOPs only, over the whole rollout's time, which
also holds the prefills (prompts, observations), the sampling and the environment. So the
network calls are also timed by kind (``Forwards``): the decode calls' FLOPs against matmul on
the batch sizes they had, and the whole rollout against its ceiling, the time its decode and
prefill FLOPs take at torch.matmul's rate on those batch sizes and on a large product.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.envs.base import make_env  # noqa: E402
from core.model.policy import load_policy  # noqa: E402
from core.rollout.engine import _first_stop, rollout
from core.rollout.sampling import Sampling
from core.rollout.transcript import prompt_ids


def sequential_generate(policy, env, tasks, group_size: int, sampling: Sampling,
                        seed: int, rollouts: int | None = None) -> tuple[int, list[int]]:
    """The plain loop: one trajectory at a time, ``model.generate`` over the whole history each
    turn; only the first ``rollouts`` of each task's ``group_size`` when given (its cost per token
    does not depend on how many run: they run one after another). Returns (generated tokens,
    context position of every generated token)."""
    model, tok = policy.model, policy.tokenizer
    eos = sorted(policy.eos_ids)
    generated, positions = 0, []
    for g, task in enumerate(tasks):
        for r in range(min(group_size, rollouts or group_size)):
            torch.manual_seed(seed * 1_000_003 + g * 1_009 + r)
            episode = env.episode(task, seed=(seed * 1_000_003 + g * 1_009 + r) % (2 ** 31))
            history = prompt_ids(tok, env.system_prompt, episode.reset())
            for _ in range(sampling.max_turns):
                budget = min(sampling.max_new_tokens, sampling.max_context - len(history))
                if budget <= 0:
                    break
                ids = torch.tensor([history])
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     max_new_tokens=budget, do_sample=True,
                                     temperature=sampling.temperature, top_k=0,
                                     top_p=sampling.top_p,
                                     stop_strings=list(env.stop_tags), tokenizer=tok,
                                     eos_token_id=eos, pad_token_id=policy.pad_id)
                new = out[0, len(history):].tolist()
                generated += len(new)
                positions += range(len(history), len(history) + len(new))
                text = tok.decode(new, skip_special_tokens=True)
                cut = _first_stop(text, env.stop_tags)
                result = episode.step(text[:cut] if cut is not None else text)
                obs = tok.encode(result.observation, add_special_tokens=False)[:sampling.max_obs_tokens]
                history = history + new + obs
                if result.done or len(history) >= sampling.max_context:
                    break
    return generated, positions


def batched(policy, env, tasks, group_size: int, sampling: Sampling, seed: int,
            reuse_cache: bool, merge_adapter: bool = True) -> tuple[int, list[int]]:
    trajs = rollout(policy, env, tasks, group_size=group_size, sampling=sampling, seed=seed,
                    reuse_cache=reuse_cache, merge_adapter=merge_adapter)
    positions = [i for t in trajs for i, role in enumerate(t.roles) if role == "action"]
    return len(positions), positions


class Forwards:
    """Every network call the batched engine makes (core/model/kv_cache.py ``Batch._run``), timed
    and sorted by kind: a decode step (one new token a row) or a prefill (a prompt, an
    observation: several a row). Decode FLOPs over the decode calls' time, against matmul timed on
    the batch sizes those calls had (weighted by the tokens each made), is the share the decode
    itself reaches; the rest of a rollout's time is prefill, sampling and the environment."""

    def __init__(self):
        self.decode_s = self.prefill_s = 0.0
        self.decode_rows: dict[int, int] = {}  # rows in a decode call -> tokens made at that size
        self.prefill_tokens = self.prefill_rows = 0
        self.prefill_positions = 0  # their positions summed (attention's context)
        self.on = False

    def prefill_flops(self, parts: dict) -> float:
        """The prefill calls' FLOPs: 2 N_linear + 4 L d c a token at its position c, and the LM
        head on each row's last token only (2 V d a row and call)."""
        return (2 * parts["N_linear"] * self.prefill_tokens
                + 4 * parts["L"] * parts["d"] * self.prefill_positions
                + 2 * parts["V"] * parts["d"] * self.prefill_rows)

    def __enter__(self):
        from core.model import kv_cache
        self._original = original = kv_cache.Batch._run
        me = self

        def run(batch, ids, new_mask, pos, n, width):
            if not me.on:
                return original(batch, ids, new_mask, pos, n, width)
            t0 = time.perf_counter()
            out = original(batch, ids, new_mask, pos, n, width)
            took = time.perf_counter() - t0
            if width == 1:
                me.decode_s += took
                me.decode_rows[n] = me.decode_rows.get(n, 0) + n
            else:
                me.prefill_s += took
                me.prefill_tokens += int(new_mask.sum())
                me.prefill_rows += n
                me.prefill_positions += int((pos * new_mask).sum())
            return out

        kv_cache.Batch._run = run
        return self

    def __exit__(self, *exc):
        from core.model import kv_cache
        kv_cache.Batch._run = self._original


def profile(policy, env, tasks, group_size: int, sampling: Sampling, seed: int,
            top: int) -> None:
    """cProfile of one batched rollout (KV reused): the ``top`` functions by their own time, then
    the engine's and the environment's functions by cumulative time (where Python per token
    goes: sampling, stop detection, the env, the cache bookkeeping)."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    trajs = rollout(policy, env, tasks, group_size=group_size, sampling=sampling, seed=seed)
    prof.disable()
    took = time.perf_counter() - t0
    tokens = sum(role == "action" for t in trajs for role in t.roles)
    print(f"profiled: {tokens} tokens in {took:.1f} s ({tokens / took:.1f} tokens/s under cProfile)")
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(r"rollout\.py|kv_cache\.py|transcript\.py|envs")


def flops_per_token(policy, context: float) -> tuple[float, dict]:
    """F = 2 N_linear + 2 V d + 4 L d c (see the module docstring)."""
    cfg = policy.base.config
    n_linear = sum(m.weight.numel() for name, m in policy.backbone.named_modules()
                   if isinstance(m, torch.nn.Linear) and ".lora_" not in name)
    d, V, L = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
    parts = {"N_linear": n_linear, "V": V, "d": d, "L": L, "c": context}
    return 2 * n_linear + 2 * V * d + 4 * L * d * context, parts


def decode_shapes(policy, rows: int) -> list[tuple[int, int, int]]:
    """The (m, k, n) products of a decode step over ``rows`` rows: head, MLP in and out, a
    projection."""
    cfg = policy.base.config
    d, V, ffn = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    return [(rows, d, V), (rows, d, ffn), (rows, ffn, d), (rows, d, d)]


def matmul_rate(shapes, dtype=torch.float32, repeats: int = 20) -> float:
    """torch.matmul's FLOP/s over ``shapes`` (m, k, n), median of ``repeats`` after a warm-up."""
    mats = [(torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype))
            for m, k, n in shapes]
    flops = sum(2 * m * k * n for m, k, n in shapes)
    for a, b in mats:
        torch.matmul(a, b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for a, b in mats:
            torch.matmul(a, b)
        times.append(time.perf_counter() - t0)
    return flops / statistics.median(times)


def decode_rate(policy, rows: dict[int, int], repeats: int = 10) -> float:
    """torch.matmul's FLOP/s on the decode shapes at the batch sizes the decode calls had,
    weighted by the tokens made at each: the time those tokens' products take at best."""
    flops = seconds = 0.0
    for b, made in rows.items():
        shapes = decode_shapes(policy, b)
        per_call = sum(2 * m * k * n for m, k, n in shapes)
        calls = made / b
        flops += per_call * calls
        seconds += per_call / matmul_rate(shapes, repeats=repeats) * calls
    return flops / seconds


def matmul_rates(policy, rows: int, repeats: int = 20) -> tuple[float, float, float]:
    """(FLOP/s on the model's decode shapes, FLOP/s on a 1024^3 product, FLOP/s on the decode
    shapes in bf16: the bf16 sampling pass's own ceiling), timed here and now."""
    shapes = decode_shapes(policy, rows)
    return (matmul_rate(shapes, repeats=repeats), matmul_rate([(1024, 1024, 1024)],
                                                             repeats=repeats),
            matmul_rate(shapes, torch.bfloat16, repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variants", default="batched-kv,batched-reencode,sequential",
                        help="comma-separated, the last is the base of the ratios: batched-kv, "
                             "batched-unmerged, batched-reencode, batched-bf16, sequential")
    parser.add_argument("--sequential-rollouts", type=int, default=None,
                        help="time the sequential loop on only the first N rollouts of each task "
                             "(same seeds as the batched rows); tokens/s compares the variants")
    parser.add_argument("--top-p", type=float, default=1.0,
                        help="nucleus sampling for every variant (default 1: none)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="instead of the table: cProfile one batched rollout, print the top N")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    policy = load_policy(args.model, seed=0)
    policy.model.eval()
    env = make_env("search", seed=0)
    tasks = env.tasks("train", args.tasks, 0)
    sampling = Sampling(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                        temperature=1.0, top_p=args.top_p)
    bf16 = dataclasses.replace(sampling, precision="bf16")  # --rollout-dtype bf16's pass
    if args.profile:
        with torch.no_grad():
            batched(policy, env, tasks[:1], 2, Sampling(max_turns=1, max_new_tokens=4), 0, True)
            profile(policy, env, tasks, args.group_size, sampling, 100, args.profile)
        return
    variants = {
        "batched, KV reused (ours)": lambda s: batched(policy, env, tasks, args.group_size,
                                                       sampling, s, reuse_cache=True),
        "batched, LoRA unmerged": lambda s: batched(policy, env, tasks, args.group_size,
                                                    sampling, s, reuse_cache=True,
                                                    merge_adapter=False),
        "batched, re-encode each turn": lambda s: batched(policy, env, tasks, args.group_size,
                                                          sampling, s, reuse_cache=False),
        "batched, bf16 sampling": lambda s: batched(policy, env, tasks, args.group_size,
                                                    bf16, s, reuse_cache=True),
        "sequential model.generate": lambda s: sequential_generate(
            policy, env, tasks, args.group_size, sampling, s, args.sequential_rollouts),
    }
    keep = dict(zip(["batched-kv", "batched-unmerged", "batched-reencode", "batched-bf16",
                     "sequential"],
                    variants))
    variants = {keep[k]: variants[keep[k]] for k in args.variants.split(",")}
    names = list(variants)
    bf16_name = "batched, bf16 sampling"
    tokens = {n: 0 for n in names}
    seconds = {n: 0.0 for n in names}
    positions: list[int] = []
    per_repeat: dict[str, list[float]] = {n: [] for n in names}
    per_repeat_cpu: dict[str, list[float]] = {n: [] for n in names}
    forwards = {n: Forwards() for n in names}
    with torch.no_grad():
        for warm in ("fp32", "bf16"):  # first use of each precision's kernels, untimed
            batched(policy, env, tasks[:1], 2, Sampling(max_turns=1, max_new_tokens=4,
                                                        precision=warm), 0, True)
        for rep in range(args.repeats):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                t0, c0 = time.perf_counter(), time.process_time()
                with forwards[name] as f:
                    f.on = name != names[-1] and "re-encode" not in name
                    n, pos = variants[name](100 + rep)
                took = time.perf_counter() - t0
                seconds[name] += took
                per_repeat[name].append(n / took)
                per_repeat_cpu[name].append(n / (time.process_time() - c0))
                tokens[name] += n
                positions += pos
        mm_decode, mm_square, mm_bf16 = matmul_rates(policy, rows=args.tasks * args.group_size)
    flops, parts = flops_per_token(policy, statistics.mean(positions))
    first = names[0]
    base = tokens[names[-1]] / seconds[names[-1]]
    print(f"model {args.model}, search env, {args.tasks} task(s) x G={args.group_size}, "
          f"max_turns {args.max_turns}, max_new_tokens {args.max_new_tokens}, "
          f"{args.repeats} interleaved repeats, {args.threads} torch thread(s)"
          + (f"; sequential on the first {args.sequential_rollouts} rollout(s) of each task"
             if args.sequential_rollouts else ""))
    print(f"{'variant':32s} {'tokens':>8s} {'seconds':>8s} {'tokens/s':>9s} "
          f"{'vs last':>8s} {'% matmul(decode)':>17s} {'% matmul(1024^3)':>17s}")
    for name in names:
        tps = tokens[name] / seconds[name]
        print(f"{name:32s} {tokens[name]:8d} {seconds[name]:8.1f} {tps:9.1f} {tps / base:7.2f}x "
              f"{100 * flops * tps / mm_decode:16.1f}% {100 * flops * tps / mm_square:16.1f}%")
    print(f"FLOPs/token F = 2*N_linear + 2*V*d + 4*L*d*c = 2*{parts['N_linear']:,} + "
          f"2*{parts['V']}*{parts['d']} + 4*{parts['L']}*{parts['d']}*{parts['c']:.0f} "
          f"= {flops / 1e6:.1f} MFLOP")
    print(f"torch.matmul: decode shapes (B={args.tasks * args.group_size}) "
          f"{mm_decode / 1e9:.2f} GFLOP/s, 1024^3 {mm_square / 1e9:.2f} GFLOP/s; "
          f"{first}: {flops * tokens[first] / seconds[first] / 1e9:.2f} GFLOP/s achieved")
    if bf16_name in names:  # against its own ceiling too: bf16 products on the same shapes
        tps = tokens[bf16_name] / seconds[bf16_name]
        print(f"{bf16_name}: {flops * tps / 1e9:.2f} GFLOP/s, {100 * flops * tps / mm_bf16:.1f}% "
              f"of torch.matmul's bf16 rate on the decode shapes ({mm_bf16 / 1e9:.2f} GFLOP/s)")
    for name in names:
        f = forwards[name]
        if not f.decode_rows or "bf16" in name:
            continue
        made = sum(f.decode_rows.values())
        rate = decode_rate(policy, f.decode_rows)
        print(f"{name}: of {seconds[name]:.1f} s, decode calls {f.decode_s:.1f} s ({made} tokens, "
              f"{made / sum(k and made_k / k for k, made_k in f.decode_rows.items()):.1f} rows a "
              f"call on average), prefill calls {f.prefill_s:.1f} s ({f.prefill_tokens} tokens), "
              f"the rest {seconds[name] - f.decode_s - f.prefill_s:.1f} s; decode FLOPs over the "
              f"decode calls' time {100 * flops * made / f.decode_s / rate:.1f}% of torch.matmul "
              f"on their batch sizes ({rate / 1e9:.2f} GFLOP/s), "
              f"{100 * flops * made / f.decode_s / mm_decode:.1f}% of the B="
              f"{args.tasks * args.group_size} rate")
        best = flops * made / rate + f.prefill_flops(parts) / mm_square
        print(f"  the whole rollout at the matmul ceiling: decode {flops * made / 1e9:.0f} GFLOP "
              f"at {rate / 1e9:.2f} GFLOP/s + prefill {f.prefill_flops(parts) / 1e9:.0f} GFLOP at "
              f"the 1024^3 rate = {best:.1f} s against {seconds[name]:.1f} s: "
              f"{100 * best / seconds[name]:.1f}% of the ceiling")
    for what, rates in (("wall", per_repeat), ("CPU", per_repeat_cpu)):
        print(f"per repeat, tokens per {what} second over {names[-1]}'s in the same repeat "
              f"(min / median / max):")
        for name in names[:-1]:
            ratios = sorted(a / b for a, b in zip(rates[name], rates[names[-1]]))
            print(f"  {name:32s} {ratios[0]:.2f} / {statistics.median(ratios):.2f} / "
                  f"{ratios[-1]:.2f}x  ({', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
