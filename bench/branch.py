"""Cost of a branch-from-turn job against a training rollout of as many trajectories. A script:

    nice -n 10 .venv/bin/python bench/branch.py --model tiny --k 8 --repeats 3

It records one RL step of ``--model`` on FrozenLake (max_turns 4, adapter snapshots kept) into a
temporary store, picks a trajectory with 4 turns, and times, interleaved ``--repeats`` times:

* ``branch``: every continuation of that trajectory, K resample + K keep per turn (2 x K x 4
  trajectories), as ``core.jobs.branch`` runs them: replay each start, then one batched rollout
  (``starts`` + ``continue_all``), then rewards;
* ``rollout``: ``core.rollout.engine.rollout`` of the same number of trajectories (``tasks x G`` with
  G = 8) from the first turn, then rewards: what a training step's rollout costs.

The ratio branch / rollout is the figure (issue #18's target: <= 1.5). Model load, store reads
and the write are left out of both (a job does each once).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.jobs import branch  # noqa: E402

from core.model import checkpoint

from core.commands import train
from core.model.policy import policy_from_config  # noqa: E402
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling
from core.credit.scoring import score_all  # noqa: E402
from storage import db  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "bench.duckdb")
        rc = train.main(["--env", "frozenlake", "--model", args.model, "--algo", "grpo",
                         "--steps", "1", "--group-size", "8", "--tasks-per-step", "1",
                         "--max-turns", "4", "--max-new-tokens", str(args.max_new_tokens),
                         "--eval-every", "0", "--seed", "0", "--lora-targets", "q_proj,v_proj",
                         "--threads", str(args.threads), "--db", store, "--quiet"])
        assert rc == 0
        with db.reading(store) as con:
            run_id, traj = con.execute(
                "SELECT run_id, traj_id FROM trajectories WHERE num_turns = 4 "
                "ORDER BY traj_id LIMIT 1").fetchone()
        job = branch.prepare_job(store, run_id, traj, "all", args.k, seed=1)
        policy = policy_from_config(job.cfg)
        checkpoint.put_adapter(checkpoint.load_adapter(job.ckpt_dir, job.snapshot_step), policy)
        sampling = Sampling.from_config(job.cfg)
        n = 2 * args.k * len(job.turns)
        tasks = job.env.tasks("train", n // 8, 0)

        def run_branch():
            items = branch.starts(job, policy.tokenizer)
            kids = branch.continue_all(policy, job.env, items, sampling, seed=1)
            score_all(kids, job.cfg)
            return sum(t.response_tokens for t in kids)

        def run_rollout():
            trajs = rollout(policy, job.env, tasks, group_size=8, sampling=sampling, seed=1)
            score_all(trajs, job.cfg)
            return sum(t.response_tokens for t in trajs)

        times = {"branch": [], "rollout": []}
        for rep in range(args.repeats):
            order = [("branch", run_branch), ("rollout", run_rollout)]
            for name, fn in (order if rep % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        b, r = statistics.median(times["branch"]), statistics.median(times["rollout"])
        print(f"model {args.model}, {n} trajectories each (K = {args.k}, 4 turns), "
              f"{args.threads} threads, median of {args.repeats}")
        print(f"branch  {b:7.2f} s   ({', '.join(f'{x:.2f}' for x in times['branch'])})")
        print(f"rollout {r:7.2f} s   ({', '.join(f'{x:.2f}' for x in times['rollout'])})")
        print(f"ratio branch / rollout: {b / r:.2f}")


if __name__ == "__main__":
    main()
