"""``python -m core.evaluation``: one checkpoint on another evaluation's held-out tasks and
episode seeds, the command line of core/jobs/evaluation.py."""
from __future__ import annotations

import argparse
import time

from core.jobs import joblog
from core.jobs.evaluation import EvaluationError, prepare_job, record, run_job
from core.jobs.evaluation import __doc__ as _LIBRARY_DOC


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.evaluation",
                                     description=_LIBRARY_DOC.split("\n")[0])
    parser.add_argument("--db", required=True, help="the store (DuckDB file)")
    parser.add_argument("--run", required=True, help="the run whose checkpoint is evaluated")
    parser.add_argument("--step", required=True, type=int, help="its step (the nearest adapter "
                        "snapshot at or before it is loaded)")
    parser.add_argument("--tasks-from", required=True, metavar="RUN2:STEP2",
                        help="the evaluation whose tasks and episode seeds are used")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: the one "
                        "RUN2's trainer evaluated with)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present) | cpu | cuda "
                        "| cuda:N")
    args = parser.parse_args(argv)
    try:
        job = prepare_job(args.db, args.run, args.step, args.tasks_from, args.seed)
    except EvaluationError as exc:
        return joblog.fail(exc)
    nearest = "" if job.snapshot_step == job.step else \
        f" (the nearest kept at or before step {job.step})"
    print(f"evaluating {job.run['run_id']} with the adapter of step {job.snapshot_step}{nearest} "
          f"on the {len(job.tasks)} tasks and episode seeds of {job.tasks_run['run_id']}@"
          f"{job.tasks_step}, seed {job.seed}", flush=True)
    t0 = time.perf_counter()
    try:
        trajs, metrics = run_job(job, progress=joblog.progress_printer("tasks"), device=args.device)
    except EvaluationError as exc:
        return joblog.fail(exc)
    run_id = record(job, trajs, metrics)
    print(f"recorded run {run_id} ({job.name}): eval/success {metrics['eval/success']:.3f} on "
          f"{len(trajs)} tasks, step {job.snapshot_step}, in {time.perf_counter() - t0:.1f} s",
          flush=True)
    print(f"compare: a={run_id}:{job.snapshot_step} b={job.tasks_run['run_id']}:{job.tasks_step}",
          flush=True)
    return 0
