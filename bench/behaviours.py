"""How long ``agentrl behaviours`` takes on a 100k-trajectory store. A script, not a test:

    nice -n 15 .venv/bin/python bench/behaviours.py [--store /tmp/b.duckdb] [--steps 3125]

The store (built once, reused when the file exists) is bench/queries.py's synthetic search run:
``--steps`` steps x 32 trajectories (4 tasks x G 8), 1-4 turns each of ``<search>`` actions
and ``<information>`` observations, rewards and metrics -- without its 10M token rows, which
the job reads only for trajectories with no stored advantage (these all have one). The job is
timed as a user runs it, in a child process (``python -m core.cli behaviours``): wall time, the
child's CPU time, its peak RSS. Target: <= 60 s on 2 cores.

First it measures the trainer's side: on a recorded SmolLM2 search run, each step's behaviours
computed from its rows as core/run/trainer.py does, against the step's ``time/step_s`` (target
<= 1%).
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.queries import RUN, chunk_frames  # noqa: E402
from storage import db  # noqa: E402
from storage.migrations import migrate  # noqa: E402

import numpy as np  # noqa: E402

DEFAULT_STORE = Path(tempfile.gettempdir()) / "agentrl-bench-behaviours.duckdb"
TABLES = ("trajectories", "turns", "rewards", "metrics")


def build(path: Path, steps: int, chunk: int = 100) -> None:
    t0 = time.perf_counter()
    con = db.connect(path)
    migrate(con)
    now = pd.Timestamp.now()
    con.execute("INSERT INTO runs (run_id, name, created_at, updated_at, status, config, "
                "last_step) VALUES (?, ?, ?, ?, 'finished', ?, ?)",
                [RUN, RUN, now, now, json.dumps({"env": "search", "model": "tiny"}), steps])
    rng = np.random.default_rng(0)
    for start in range(1, steps + 1, chunk):
        frames = chunk_frames(RUN, range(start, min(start + chunk, steps + 1)), rng)
        for table in TABLES:
            df = frames[table]  # noqa: F841 (DuckDB reads df by name)
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM df")
    n = con.execute("SELECT count(*) FROM trajectories").fetchone()[0]
    con.close()
    print(f"built {path}: {n:,} trajectories in {time.perf_counter() - t0:.0f} s", flush=True)


def trainer_share(store: Path, run_id: str) -> None:
    """The trainer's per-step cost (``StepBehaviours`` on a step's rows, as core/run/trainer.py
    calls it) against that step's recorded ``time/step_s``, on a real recorded run."""
    from storage.behaviours import StepBehaviours
    con = db.connect(store, read_only=True)
    steps = dict(con.execute("SELECT step, value FROM metrics WHERE run_id = ? AND "
                             "name = 'time/step_s'", [run_id]).fetchall())
    tracker, shares = StepBehaviours(), []
    for step in sorted(steps):
        tables = {t: con.execute(f"SELECT * EXCLUDE (run_id, step) FROM {t} WHERE run_id = ? "
                                 "AND step = ?", [run_id, step]).df().to_dict("list")
                  for t in ("trajectories", "turns", "turn_signals")}
        if not tables["trajectories"]["traj_id"]:
            continue
        t0 = time.perf_counter()
        tracker(step, tables)
        shares.append((time.perf_counter() - t0, steps[step], len(tables["trajectories"]["traj_id"])))
    con.close()
    cost = [c for c, _, _ in shares]
    print(f"trainer's per-step cost on {store.name} ({len(shares)} steps, "
          f"{max(n for *_, n in shares)} trajectories max): median {np.median(cost) * 1e3:.1f} ms, "
          f"max {max(cost) * 1e3:.1f} ms; share of the recorded step time: median "
          f"{np.median([c / s for c, s, _ in shares]):.3%}, max {max(c / s for c, s, _ in shares):.3%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", type=Path, default=DEFAULT_STORE)
    ap.add_argument("--steps", type=int, default=3125)
    ap.add_argument("--trainer-store", type=Path,
                    default=Path(__file__).resolve().parent.parent / "sample_runs" /
                    "search_smollm2.duckdb")
    ap.add_argument("--trainer-run", default="20261129-233052-4ded2d")
    args = ap.parse_args()
    trainer_share(args.trainer_store, args.trainer_run)
    if not args.store.exists():
        build(args.store, args.steps)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "core.cli", "behaviours", "--db",
                           str(args.store), "--run", RUN], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)
    wall = time.perf_counter() - t0
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(done.stdout.strip(), done.stderr.strip()[-2000:])
    print(f"agentrl behaviours: wall {wall:.1f} s, CPU {child.ru_utime + child.ru_stime:.1f} s, "
          f"peak RSS {child.ru_maxrss / 1024:.0f} MiB (target <= 60 s)")
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
