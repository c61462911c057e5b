"""Training jobs launched from the Train page: one at a time, each its own process.

The web server never trains: it starts ``python -m core.train`` with an argument list (no shell,
so no value can become a command), its output going to a log file under ``runs/logs/``. The job
is remembered in ``runs/job.json`` so that a page reload, another browser tab or a restarted
server still sees it, and can stop it: SIGINT, which the trainer answers by finishing the current
step, recording it, and marking the run 'stopped'.

``AGENTRL_RUNS_DIR`` replaces ``runs`` (tests point it at a temporary directory). Every run is
recorded into ``<runs dir>/store.duckdb``; the user picks no path, so a job cannot write outside it.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import psutil

from core.config import MODELS, TrainConfig, validate

ROOT = Path(__file__).resolve().parent.parent
RUNS_DIR_ENV = "AGENTRL_RUNS_DIR"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_CHILDREN: dict[int, subprocess.Popen] = {}   # jobs this server process started (reaped by poll)


class JobError(RuntimeError):
    """A job that cannot be started or stopped; the message says why."""


def runs_dir() -> Path:
    return Path(os.environ.get(RUNS_DIR_ENV, "runs"))


def job_file() -> Path:
    return runs_dir() / "job.json"


def store_path() -> Path:
    return runs_dir() / "store.duckdb"


def check_name(name: str) -> str:
    """Run names become file names of logs: letters, digits, '.', '_', '-' only, 1-64 long."""
    if not NAME_RE.fullmatch(name or ""):
        raise JobError(f"run name {name!r}: use 1-64 letters, digits, '.', '_' or '-', "
                       "starting with a letter or digit")
    return name


def command(cfg: TrainConfig, name: str) -> list[str]:
    """The trainer's argument list: every field that differs from the defaults, plus the
    contract's flags always, the fixed store and the run name."""
    # The form offers named models only; a model directory or checkpoint_dir would let a job
    # read or write outside the store, so the launcher refuses them (the CLI still takes them).
    if cfg.model not in MODELS:
        raise JobError(f"model {cfg.model!r}: the launcher trains one of {', '.join(MODELS)}")
    if cfg.checkpoint_dir or cfg.resume:
        raise JobError("checkpoint_dir and resume are not launcher settings: checkpoints go "
                       "next to the store")
    defaults = TrainConfig()
    always = {"env", "model", "algo", "steps", "group_size", "tasks_per_step", "max_turns",
              "seed", "sft_steps"}
    args = [sys.executable, "-m", "core.train"]
    for f in fields(TrainConfig):
        if f.name in ("db", "name", "resume"):
            continue
        value = getattr(cfg, f.name)
        if f.name in always or value != getattr(defaults, f.name):
            args += ["--" + f.name.replace("_", "-"), str(value)]
    return args + ["--db", str(store_path()), "--name", check_name(name)]


def _alive(pid: int) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    try:  # started by an earlier server process: check the pid is still our trainer
        proc = psutil.Process(pid)
        return "core.train" in proc.cmdline() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, ValueError):
        return False


def current() -> dict | None:
    """The last job started (from runs/job.json) with ``alive`` filled in; None if never."""
    try:
        job = json.loads(job_file().read_text())
    except (OSError, ValueError):
        return None
    job["alive"] = _alive(int(job.get("pid", -1)))
    return job


def launch(cfg: TrainConfig, name: str) -> dict:
    """Validate and start one training job; refuse while another one runs."""
    validate(cfg)
    running = current()
    if running and running["alive"]:
        raise JobError(f"a training job is already running (run {running['name']!r}, pid "
                       f"{running['pid']}); stop it or wait for it to finish")
    args = command(cfg, name)
    logs = runs_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:
        child = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    _CHILDREN[child.pid] = child
    job = {"pid": child.pid, "name": name, "db": str(store_path()), "log": str(log_path),
           "args": args[1:], "total_steps": cfg.sft_steps + cfg.steps,
           "started_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    tmp = job_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(job, indent=1))
    tmp.replace(job_file())
    return {**job, "alive": True}


def stop(job: dict) -> None:
    """Ask the job to stop after its current step (the trainer's SIGINT handling)."""
    if not job or not _alive(int(job["pid"])):
        raise JobError("no training job is running")
    try:
        os.kill(int(job["pid"]), signal.SIGINT)
    except ProcessLookupError:  # it ended after the check above
        raise JobError("the training job has already ended") from None


def exit_code(job: dict) -> int | None:
    child = _CHILDREN.get(int(job["pid"]))
    return None if child is None else child.poll()


def log_tail(job: dict, lines: int = 30, max_bytes: int = 64_000) -> str:
    """The end of the job's log; progress-bar redraws (carriage returns) keep their last state."""
    try:
        with open(job["log"], "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    text = text.replace(str(ROOT) + os.sep, "")  # paths inside the project, shown relative
    shown = [line.rstrip().split("\r")[-1] for line in text.split("\n")]
    return "\n".join(shown[-lines:])
