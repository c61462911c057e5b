"""The training-inference mismatch table (core/learn/mismatch.py) for a model sampled in fp32 and in
bf16, the update in fp32: TRL issue 6789's table at laptop scale. A script:

    .venv/bin/python bench/mismatch.py [--models tiny,smollm2-135m] [--steps 1] [--json FILE]

For each model and rollout dtype it trains ``--steps`` RL steps of search (G=4 x 2 tasks, up to 2
turns of 24 new tokens, GRPO, no evaluation) with the real trainer into a temporary store, then
reads every trained token's d = lp_train - lp_sampler back and prints, per (model, dtype): the
trained tokens, mean / sd / p95 / max of |d|, the share whose ratio exp(d) lies outside
[0.9, 1.1], the k3 KL(sampler || trainer), and the median RL step time (the bf16 pass's cost on
this machine). Both dtypes of one model see the same tasks and seeds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def measure(model: str, dtype: str, steps: int, base: Path) -> dict:
    import torch

    from core.config import TrainConfig, validate
    from core.learn.mismatch import distribution
    from core.run.trainer import train
    from storage import queries
    from storage.recorder import Recorder
    db = base / f"{model}-{dtype}.duckdb"
    cfg = validate(TrainConfig(env="search", model=model, algo="grpo", steps=steps, group_size=4,
                               tasks_per_step=2, max_turns=2, max_new_tokens=24,
                               eval_every=0, rollout_dtype=dtype, db=str(db),
                               checkpoint_dir=str(base / f"ckpt-{model}-{dtype}")))
    t0 = time.perf_counter()
    run_id = train(cfg, Recorder(db), progress=False)
    seconds = time.perf_counter() - t0
    train_lp, sampler = [], []
    for traj in queries.trajectories(db, run_id)["traj_id"]:
        tok = queries.tokens(db, run_id, traj)
        tok = tok[tok["trained"] & tok["train_logprob"].notna() & tok["logprob"].notna()]
        train_lp += tok["train_logprob"].tolist()
        sampler += tok["logprob"].tolist()
    t, s = torch.tensor(train_lp, dtype=torch.float64), torch.tensor(sampler, dtype=torch.float64)
    row = {"model": model, "rollout_dtype": dtype,
           **distribution(t, s, torch.ones(len(t), dtype=torch.bool))}
    metrics = queries.metrics(db, run_id)
    row["kl_k3"] = float(metrics[metrics["name"] == "mismatch/kl_k3"]["value"].mean())
    step_s = metrics[metrics["name"] == "time/step_s"]["value"].tolist()
    row["step_s"] = statistics.median(step_s) if step_s else seconds
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny,smollm2-135m")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            for dtype in ("fp32", "bf16"):
                rows.append(measure(model, dtype, args.steps, Path(tmp)))
                r = rows[-1]
                print(f"{r['model']:>14} {r['rollout_dtype']:>5}  tokens {r['tokens']:>5}  "
                      f"|d| mean {r['mean']:.2e} sd {r['sd']:.2e} p95 {r['p95']:.2e} "
                      f"max {r['max']:.2e}  outside [0.9, 1.1] {100 * r['out_of_band']:.2f}%  "
                      f"k3 {r['kl_k3']:.2e}  step {r['step_s']:.1f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
