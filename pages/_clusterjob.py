"""The failure-cluster job launched from the Failures page: its own process, never the server's.

The server starts ``python -m core.clusters --db STORE --run RUN --progress FILE`` with an
argument list (no shell); STORE and RUN are the run picked in the sidebar, so the job can only
write into a store the app already lists. The job keeps its phase and counts in FILE (JSON,
under ``<runs dir>/logs/``), which the page polls; one job per (store, run) at a time.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from pages._jobs import ROOT, runs_dir

_CHILDREN: dict[int, subprocess.Popen] = {}


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
    job["alive"] = _alive(int(job.get("pid", -1)))
    return job


def _alive(pid: int) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        proc = psutil.Process(pid)
        return "core.clusters" in proc.cmdline() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, ValueError):
        return False


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
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    with open(logs / (stem + ".log"), "wb") as log:
        child = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    _CHILDREN[child.pid] = child
    job = {"pid": child.pid, "store": store, "run_id": run_id,
           "started_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    (logs / (stem + ".job")).write_text(json.dumps(job))
    return {**job, "phase": "starting", "alive": True}
