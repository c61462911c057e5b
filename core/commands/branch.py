"""``python -m core.branch``: branch-from-turn rollouts of one recorded trajectory, the
command line of core/jobs/branch.py (exit 0 with the estimates recorded, 2 for bad input)."""
from __future__ import annotations

import argparse
from pathlib import Path

from core.jobs import joblog
from core.jobs.branch import MAX_K, prepare_job, record, run_job
from core.jobs.branch_estimates import candidates
from core.jobs.branch_export import export
from core.jobs.branch_replay import KEEP_MODES, BranchError
from core.jobs.branch import __doc__ as _LIBRARY_DOC


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.branch", description=_LIBRARY_DOC.split("\n")[0])
    parser.add_argument("--db", required=True, help="the store (DuckDB file)")
    parser.add_argument("--run", required=True, help="run id")
    parser.add_argument("--traj", required=True, help="trajectory id")
    parser.add_argument("--turns", default="all", help="all | comma-separated turns (0-based)")
    parser.add_argument("--k", type=int, default=8, help=f"continuations per turn and kind (1..{MAX_K})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto (CUDA when present) | cpu | cuda | "
                        "cuda:N")
    parser.add_argument("--export", metavar="FILE", help="also write (state, action, Q, V, A) per "
                        "turn to FILE (.jsonl or .parquet)")
    parser.add_argument("--keep-transition", choices=KEEP_MODES, default="fresh",
                        help="keep continuations execute the recorded action with a fresh "
                        "transition (fresh: Q(s_t, a_t)) or replay its recorded one (recorded: "
                        "r_t + V(recorded next state); for deterministic debugging)")
    args = parser.parse_args(argv)
    if args.export and Path(args.export).suffix not in (".jsonl", ".parquet"):
        return joblog.fail("--export must end in .jsonl or .parquet")
    try:
        job = prepare_job(args.db, args.run, args.traj, args.turns, args.k, args.seed,
                          keep=args.keep_transition)
    except BranchError as exc:
        return joblog.fail(exc)
    exact = "" if job.snapshot_step == job.sampled_by else \
        f" (nearest kept at or before step {job.sampled_by}, which sampled it)"
    print(f"branching {job.traj_id} (step {job.step}, {job.split}) at turns "
          f"{','.join(map(str, job.turns))}: {2 * job.k * len(job.turns)} continuations, "
          f"adapter of step {job.snapshot_step}{exact}"
          + ("; keep continuations replay the recorded transition" if job.keep == "recorded"
             else ""), flush=True)
    try:
        result = run_job(job, progress=joblog.progress_printer("continuations"), device=args.device)
    except BranchError as exc:
        return joblog.fail(exc)
    record(result)
    print(f"{'turn':>4} {'V':>7} {'Q':>7} {'A':>7}  A 95% interval")
    maybe = {r["turn"]: r for r in candidates(result.rows)}
    for r in result.rows:
        mark = ("  <- lost the most" if r["turn"] == result.worst else
                f"  <- may have lost value (~{r['k_needed']:.0f} per kind to tell)"
                if r["turn"] in maybe else "")
        print(f"{r['turn']:>4} {r['v']:7.3f} {r['q']:7.3f} {r['a']:7.3f}  "
              f"[{r['a_lo']:.3f}, {r['a_hi']:.3f}]{mark}")
    verdict = (f"worst turn {result.worst}" if result.worst is not None else
               "no turn's interval excludes 0" + (f" (candidates: {', '.join(map(str, maybe))})"
                                                  if maybe else ""))
    print(f"recorded job {job.job_id}: {len(result.children)} continuations in "
          f"{result.seconds:.1f} s; {verdict}", flush=True)
    if args.export:
        print(f"exported {export(job, result.rows, args.export)}")
    return 0
