"""Each advantage estimator on the same seed and budget: one table users can compare.

    nice -n 10 .venv/bin/python bench/estimators.py --db runs/estimators.duckdb

runs ``python -m core.train --preset workshop-demo --algo ALGO`` (plus any extra flags after
``--``) for every algorithm in turn, into one DuckDB store, then prints per algorithm:

    first eval / last eval  eval/success on the held-out tasks after SFT and after RL
    final group std         reward/group_std_mean at the last RL step (in-group reward spread)
    zero-std groups         reward/frac_zero_std at the last RL step
    grad-norm max           the largest pre-clipping gradient norm over the RL steps
    wall s                  the run's wall time

The algorithms' own defaults apply (StarPO-S: clip-higher 0.28, no KL), as on the command line.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.config import ALGOS, PRESETS  # noqa: E402


def run_one(algo: str, db: str, preset: str, extra: list[str]) -> tuple[str, float]:
    cmd = [sys.executable, "-m", "core.train", "--preset", preset, "--algo", algo, "--db", db,
           "--name", f"{preset} {algo}", "--quiet", *extra]
    print("$", " ".join(cmd[1:]), flush=True)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{algo} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    run_id = out.stdout.strip().split()[1]  # "run RUN_ID recorded in DB"
    return run_id, time.perf_counter() - t0


def summary(db: str, run_id: str, sft_steps: int) -> dict:
    from storage import queries
    m = queries.metrics(db, run_id)
    wide = m.pivot_table(index="step", columns="name", values="value")
    rl = wide[wide.index > sft_steps]
    evals = wide["eval/success"].dropna() if "eval/success" in wide else wide.iloc[0:0, 0]
    last_rl = rl.iloc[-1] if len(rl) else {}
    return {"first_eval": evals.iloc[0] if len(evals) else float("nan"),
            "last_eval": evals.iloc[-1] if len(evals) else float("nan"),
            "eval_n": int(wide["eval/tasks"].dropna().iloc[-1]) if "eval/tasks" in wide else 0,
            "group_std": last_rl.get("reward/group_std_mean", float("nan")),
            "zero_std": last_rl.get("reward/frac_zero_std", float("nan")),
            "grad_max": rl["grad/norm_max"].max() if "grad/norm_max" in rl else float("nan")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="runs/estimators.duckdb")
    parser.add_argument("--preset", default="workshop-demo", choices=sorted(PRESETS))
    parser.add_argument("--algos", default=",".join(ALGOS))
    parser.add_argument("extra", nargs="*", help="flags passed to core.train (after --)")
    args = parser.parse_args()
    sft_steps = dict(PRESETS[args.preset]).get("sft_steps", 0)
    for i, flag in enumerate(args.extra):
        if flag == "--sft-steps":
            sft_steps = int(args.extra[i + 1])
    rows = []
    for algo in args.algos.split(","):
        run_id, wall = run_one(algo, args.db, args.preset, args.extra)
        rows.append((algo, summary(args.db, run_id, sft_steps), wall))
    print(f"\n| algo | first eval | last eval | n | final group std | zero-std groups "
          f"| grad-norm max | wall s |\n|---|---|---|---|---|---|---|---|")
    for algo, s, wall in rows:
        print(f"| {algo} | {s['first_eval']:.3f} | {s['last_eval']:.3f} | {s['eval_n']} "
              f"| {s['group_std']:.3f} | {s['zero_std']:.2f} | {s['grad_max']:.3g} | {wall:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
