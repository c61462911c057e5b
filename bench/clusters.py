"""Failure clusters at scale: 10,000 failing trajectories embedded and clustered, and the page.

    nice -n 10 .venv/bin/python bench/clusters.py [--n 10000] [--threads 2] [--encoder static]
        [--cold] [--page] [--repeats 3]

1. Builds a store (tmp/bench-clusters.duckdb) holding one run of ``--n`` failing trajectories
   from core.jobs.clusters.constructed_failures (5 known failure modes, names and lengths varied),
   written as ordinary trajectories and turns rows.
2. Runs the job exactly as the Failures page's button does -- ``python -m core.clusters --db ...
   --run ... --threads N`` in its own process -- and times it end to end (start-up and imports,
   reading the store, building texts, embedding, storing the vectors, k-means with the silhouette
   choice of k, c-TF-IDF, storing the clusters). ``--cold`` first empties the static encoder's
   token-vector cache (a private AGENTRL_CACHE), so the distillation of the tokens these texts use
   is included. A second run shows the cached path (no embedding).
3. Reports the adjusted Rand index of the stored clusters against the known modes.
4. ``--page``: serves the app on that store and times the Failures page in headless Chromium,
   before the job (no clusters) and after it (clusters drawn): one cold load, then ``--repeats``
   warm loads each (bench/pages.py's definition of a load). Target: <= 2 s warm.
Target for 2: <= 60 s on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from core.jobs.clusters import constructed_failures  # noqa: E402
from storage import db, queries  # noqa: E402
from storage.migrations import prepare  # noqa: E402

RUN = "bench-clusters"


def build(path: Path, n: int) -> list[int]:
    """A store with one run of ``n`` failing trajectories; returns each trajectory's mode."""
    path.unlink(missing_ok=True)
    prepare(path)
    trajs, modes = constructed_failures(n, seed=0)
    steps = 50
    rows, turn_rows = [], []
    for i, (turns, mode) in enumerate(zip(trajs, modes)):
        traj_id, step = f"s{i % steps}-t{i}", i % steps
        rows.append({"run_id": RUN, "step": step, "traj_id": traj_id, "group_id": f"g{i // 8}",
                     "task_id": f"task{i // 8}", "reward": 0.0, "advantage": 0.0,
                     "success": False, "num_turns": len(turns), "finish_reason": "max_turns",
                     "split": "train", "failure_class": "unsolved"})
        for k, t in enumerate(turns):
            turn_rows.append({"run_id": RUN, "step": step, "traj_id": traj_id, "turn": k,
                              "action": t["action"], "observation": t.get("observation"),
                              "error": t.get("error")})
    traj, turns = pd.DataFrame(rows), pd.DataFrame(turn_rows)
    with db.writing(path) as con:
        con.execute("INSERT INTO runs (run_id, name, created_at, status, config, last_step) "
                    "VALUES (?, 'bench clusters', now(), 'finished', '{}', ?)", [RUN, steps - 1])
        con.register("t", traj)
        con.execute(f"INSERT INTO trajectories ({', '.join(traj.columns)}) SELECT * FROM t")
        con.register("u", turns)
        con.execute(f"INSERT INTO turns ({', '.join(turns.columns)}) SELECT * FROM u")
    return modes


def job(path: Path, threads: int, encoder: str, env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one job process, start-up included."""
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "core.clusters", "--db", str(path), "--run", RUN,
                          "--threads", str(threads), "--encoder", encoder], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if out.returncode:
        raise SystemExit(f"the job failed:\n{out.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print("   ", out.stdout.strip().splitlines()[-1][:400])
    return elapsed, cpu


def page_times(path: Path, repeats: int, clusters: bool = True) -> list[float]:
    from bench.pages import load
    from tests.browser_harness import launched_browser, new_page, served_app
    base = Path("tmp") / f"bench-clusters-app-{os.getpid()}"
    (ROOT / base).mkdir(parents=True, exist_ok=True)
    stores = base / "stores"
    (ROOT / stores).mkdir()
    os.symlink(path.resolve(), ROOT / stores / path.name)
    url_store = str(stores / path.name)
    times = []
    with served_app(base, [stores], base / "runs") as url, launched_browser() as browser, \
            new_page(browser, 1280, 900) as page:
        link = f"{url}/failures?store={url_store}&run={RUN}"
        for _ in range(1 + repeats):
            times.append(load(page, link, "Failures", 300))
            drawn = page.get_by_text("failing trajectories in").count() > 0
            if drawn != clusters:
                raise SystemExit(f"the Failures page {'did not draw' if clusters else 'drew'} "
                                 "the clusters")
    return times


def _report(what: str, times: list[float]) -> None:
    warm = sorted(times[1:])
    print(f"{what}: cold {times[0]:.2f} s, warm " + ", ".join(f"{t:.2f}" for t in times[1:])
          + f" s (median {warm[len(warm) // 2]:.2f} s; target <= 2 s warm); load average "
          f"{os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--encoder", default="static", choices=("static", "minilm"))
    ap.add_argument("--cold", action="store_true", help="start with an empty token-vector cache")
    ap.add_argument("--page", action="store_true", help="also time the Failures page")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    path = ROOT / "tmp" / "bench-clusters.duckdb"
    path.parent.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    modes = build(path, args.n)
    print(f"store with {args.n} failing trajectories built in {time.perf_counter() - t0:.1f} s")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if args.page:
        _report("Failures page before clustering", page_times(path, args.repeats, False))
    cache = None
    if args.cold:
        cache = tempfile.mkdtemp(prefix="bench-clusters-cache-")
        env["AGENTRL_CACHE"] = cache
    try:
        wall, cpu = job(path, args.threads, args.encoder, env)
        print(f"job, {'cold token cache' if args.cold else 'warm token cache'}: {wall:.1f} s "
              f"wall, {cpu:.1f} s CPU for {args.n} trajectories (target <= 60 s on 2 cores)")
        wall, cpu = job(path, args.threads, args.encoder, env)
        print(f"job again (every vector cached in the store): {wall:.1f} s wall, {cpu:.1f} s CPU")
    finally:
        if cache:
            shutil.rmtree(cache, ignore_errors=True)
    from sklearn.metrics import adjusted_rand_score
    members = queries.failure_clusters(path, RUN)["members"]
    index = {f"s{i % 50}-t{i}": m for i, m in enumerate(modes)}
    ari = adjusted_rand_score([index[t] for t in members["traj_id"]], members["cluster"])
    print(f"clusters: k={members['cluster'].nunique()}, adjusted Rand index vs the 5 known "
          f"modes {ari:.3f}")
    if args.page:
        _report("Failures page with clusters", page_times(path, args.repeats))
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
