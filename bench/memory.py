"""Peak memory (RSS) of one recorded RL training step. A script:

    nice -n 15 .venv/bin/python bench/memory.py [--model smollm2-135m] [--tasks 1] [--group-size 8]

Runs ``python -m core.train`` as a child for one GRPO step on the search env (``--tasks`` tasks x
G trajectories, 4 turns of up to 96 new tokens, recorded into a store in a temporary directory,
no evaluation) and reports the child's peak resident set size as the kernel counted it
(``getrusage(RUSAGE_CHILDREN).ru_maxrss``, what ``/usr/bin/time -v`` prints), plus the largest RSS
seen by sampling it every 0.2 s with psutil and the run's own step timings. Target: fits in 8 GB.
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tasks", type=int, default=1)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "memory.duckdb"
        cmd = [sys.executable, "-m", "core.train", "--env", "search", "--model", args.model,
               "--algo", "grpo", "--steps", "1", "--sft-steps", "0", "--eval-every", "0",
               "--group-size", str(args.group_size), "--tasks-per-step", str(args.tasks),
               "--max-turns", str(args.max_turns), "--max-new-tokens", str(args.max_new_tokens),
               "--threads", str(args.threads), "--db", str(store),
               "--checkpoint-dir", str(Path(tmp) / "ckpt"), "--quiet"]
        t0 = time.perf_counter()
        child = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        proc, sampled = psutil.Process(child.pid), 0
        while child.poll() is None:
            try:
                sampled = max(sampled, proc.memory_info().rss)
            except psutil.Error:
                break
            time.sleep(0.2)
        output = child.stdout.read()
        wall = time.perf_counter() - t0
        if child.returncode != 0:
            sys.exit(f"core.train failed ({child.returncode}):\n{output[-2000:]}")
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        from storage import queries
        run = queries.runs(store).iloc[0]["run_id"]
        m = queries.metrics(store, run).set_index("name")["value"]
        n_tok = len(queries.tokens(store, run, queries.trajectories(store, run)["traj_id"][0]))
    print(f"one GRPO step, {args.model}, search env, {args.tasks} task(s) x G={args.group_size}, "
          f"{args.max_turns} turns x <= {args.max_new_tokens} new tokens, {args.threads} thread(s), "
          f"recorded")
    print(f"{'peak RSS (getrusage, whole child)':40s} {peak / 2**30:8.2f} GiB  (target <= 8 GiB)")
    print(f"{'largest RSS sampled every 0.2 s':40s} {sampled / 2**30:8.2f} GiB")
    for name in ("time/rollout_s", "time/update_s", "time/record_s", "time/step_s",
                 "perf/generated_tokens", "env/turns_mean"):
        if name in m:
            print(f"{name:40s} {m[name]:8.1f}")
    print(f"{'tokens of the first trajectory':40s} {n_tok:8d}")
    print(f"{'process wall time (load + step + exit)':40s} {wall:8.1f} s")


if __name__ == "__main__":
    main()
