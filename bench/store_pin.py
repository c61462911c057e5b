"""What the DuckDB pin and the store kind cost: the embedded store on the pinned DuckDB beside
another DuckDB version, and a team store (DuckLake) beside both, in one run. A script, not a test:

    .venv/bin/python bench/store_pin.py [--other DIR] [--rounds 3] [--steps 6] [--rows 2000000]

``--other DIR``: a directory holding another DuckDB (``pip install --target DIR duckdb==2.0.1``),
put first on the child's ``sys.path``. Each figure comes from a child process of its own, the
variants taking turns round by round (the median is printed, and each ratio to the pinned
file store measured in the same rounds):

* ``record_step``: bench/storage.py's trainer step (64 trajectories x 512 tokens and their
  turns, rewards and metrics), through ``Recorder.record_step``, seconds a step;
* ``append``: ROWS token-shaped rows, one Arrow insert in one write transaction, rows/s; beside
  it the floor, ``pyarrow.parquet.write_table`` of the same rows;
* ``reads``: the Replay page's reads of a sample run (run list, trajectories of a step, one
  trajectory's turns and tokens, its metrics), milliseconds for the set, median of 20 after a
  first (which attaches a team store once per process).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_runs" / "shortcut.duckdb"


def _child(kind: str, steps: int, rows: int) -> dict:
    sys.path.insert(0, str(ROOT))
    import duckdb
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench.storage import step_tables
    from storage import db, queries, team_store
    from storage.migrations import prepare
    from storage.recorder import Recorder
    from storage.store_copy import copy

    work = Path(tempfile.mkdtemp(prefix="store-pin-"))
    out = {"duckdb": duckdb.__version__, "kind": kind}
    try:
        def store(name: str) -> Path:
            if kind == "file":
                prepare(work / f"{name}.duckdb")
                return work / f"{name}.duckdb"
            team_store.init(work / name, "sqlite")
            return work / name

        rec = Recorder(store("rec"))
        rec.start_run({"env": "bench"}, name="bench")
        times = []
        for step in range(1, steps + 1):
            tables = step_tables(step)
            t0 = time.perf_counter()
            rec.record_step(step, **tables)
            times.append(time.perf_counter() - t0)
        out["record_step_s"] = statistics.median(times[1:] or times)

        rng = np.random.default_rng(0)
        table = pa.table({"run_id": ["r"] * rows, "step": np.ones(rows, np.int32),
                          "traj_id": np.char.add("t", (np.arange(rows) // 512).astype(str)),
                          "pos": (np.arange(rows) % 512).astype(np.int32),
                          "token_id": rng.integers(0, 49152, rows, dtype=np.int32),
                          "logprob": rng.normal(-1, 0.5, rows)})
        target = store("append")
        t0 = time.perf_counter()
        with db.writing(target) as con:
            con.register("_rows", table)
            con.execute("INSERT INTO tokens BY NAME SELECT * FROM _rows")
            con.unregister("_rows")
        out["append_rows_s"] = rows / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        pq.write_table(table, work / "floor.parquet")
        out["parquet_floor_rows_s"] = rows / (time.perf_counter() - t0)

        sample = work / "sample.duckdb" if kind == "file" else store("sample")  # a copy
        if kind == "file":
            shutil.copy(SAMPLE, sample)
        else:
            copy(SAMPLE, sample)
        run = queries.runs(str(sample))["run_id"].iloc[0]

        def reads():
            queries.runs(str(sample))
            trajs = queries.trajectories(str(sample), run, step=33)
            first = trajs["traj_id"].iloc[0]
            queries.turns(str(sample), run, [first])
            queries.tokens(str(sample), run, first)
            queries.metrics(str(sample), run)
        reads()
        ms = []
        for _ in range(20):
            t0 = time.perf_counter()
            reads()
            ms.append(1000 * (time.perf_counter() - t0))
        out["reads_ms"] = statistics.median(ms)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--other", default=None, help="a directory holding another DuckDB version")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.steps, args.rows)))
        return 0
    variants = [("pinned file", "file", None), ("pinned team store", "lake", None)]
    if args.other:
        variants.insert(1, ("other file", "file", args.other))
    got: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    for r in range(args.rounds):
        for name, kind, path in variants:
            env = dict(os.environ, OMP_NUM_THREADS="1")
            if path:
                env["PYTHONPATH"] = path
            done = subprocess.run([sys.executable, __file__, "--child", kind, "--steps",
                                   str(args.steps), "--rows", str(args.rows)], env=env,
                                  capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                print(f"{name}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                return 1
            got[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}: {name} done", file=sys.stderr)
    base = got["pinned file"]
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    print(f"{'variant':20} {'duckdb':7} {'record_step s':>14} {'append rows/s':>14} "
          f"{'parquet floor':>14} {'reads ms':>9}   ratios to the pinned file (same rounds)")
    for name, runs in got.items():
        med = {k: statistics.median(r[k] for r in runs)
               for k in ("record_step_s", "append_rows_s", "parquet_floor_rows_s", "reads_ms")}
        ratio = {k: statistics.median(r[k] / b[k] for r, b in zip(runs, base))
                 for k in ("record_step_s", "append_rows_s", "reads_ms")}
        print(f"{name:20} {runs[0]['duckdb']:7} {med['record_step_s']:14.3f} "
              f"{med['append_rows_s']:14,.0f} {med['parquet_floor_rows_s']:14,.0f} "
              f"{med['reads_ms']:9.1f}   step x{ratio['record_step_s']:.2f}, append "
              f"x{ratio['append_rows_s']:.2f}, reads x{ratio['reads_ms']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
