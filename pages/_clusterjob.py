"""The failure-cluster job launched from the Failures page: its own process, never the server's.

The server starts ``python -m core.clusters --db STORE --run RUN --progress FILE`` with an
argument list (no shell); STORE and RUN are the run picked in the sidebar, so the job can only
write into a store the app already lists. The job keeps its phase and counts in FILE (JSON,
under ``<runs dir>/logs/``), which the page polls; one job per (store, run) at a time.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from pages._jobs import process_alive, runs_dir, spawn
from storage.embeddings import K_FIRST, K_LIMIT


def _stem(store: str, run_id: str) -> str:
    return "clusters-" + hashlib.sha1(f"{store}\x00{run_id}".encode()).hexdigest()[:12]


def state(store: str, run_id: str) -> dict | None:
    """The last job's state for this run (phase, done, total, summary or error, alive)."""
    path = runs_dir() / "logs" / (_stem(store, run_id) + ".json")
    meta = runs_dir() / "logs" / (_stem(store, run_id) + ".job")
    try:
        job = json.loads(meta.read_text())
    except (OSError, ValueError):
        return None
    try:
        job.update(json.loads(path.read_text()))
    except (OSError, ValueError):
        job.setdefault("phase", "starting")
    job["alive"] = process_alive(int(job.get("pid", -1)), "core.clusters")
    return job


def launch(store: str, run_id: str) -> dict:
    """Start the job for this run unless one is already running for it."""
    running = state(store, run_id)
    if running and running["alive"]:
        return running
    logs = runs_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stem = _stem(store, run_id)
    progress = logs / (stem + ".json")
    progress.unlink(missing_ok=True)
    args = [sys.executable, "-m", "core.clusters", "--db", str(Path(store).resolve()),
            "--run", str(run_id), "--progress", str(progress.resolve()), "--threads", "2"]
    child = spawn(args, logs / (stem + ".log"))
    job = {"pid": child.pid, "store": store, "run_id": run_id,
           "started_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    (logs / (stem + ".job")).write_text(json.dumps(job))
    return {**job, "phase": "starting", "alive": True}


def progress(job: dict) -> tuple[float, str]:
    """(fraction done, what the job is doing) for its progress bar. The job writes ``total`` as
    the texts it still has to embed: with every text cached it is 0, which read "0 of 0 texts
    embedded" while the job went on to cluster the cached vectors."""
    phase = str(job.get("phase") or "starting")
    total, done, cached = (int(job.get(k) or 0) for k in ("total", "done", "cached"))
    if phase == "embedding" and total:
        note = f" ({cached} more already embedded, cached)" if cached else ""
        return done / total, f"Embedding: {done} of {total} texts embedded{note}"
    if phase == "embedding":
        return 1.0, (f"All {cached} texts already embedded (cached): clustering next"
                     if cached else "Embedding: no text to embed")
    if phase == "clustering":
        return 1.0, (f"Clustering the embedded failures (k-means, k = 2..{K_FIRST} by silhouette, "
                     f"extended up to {K_LIMIT} while the best k is at the top)")
    if phase == "reading":
        return 0.0, "Reading the run's failing trajectories"
    return (1.0 if phase == "done" else 0.0), phase.capitalize()
