"""Training jobs launched from the Train page: one at a time, each its own process.

The web server never trains: it writes the form's whole configuration to a file under
``runs/logs/`` and starts ``python -m core.train --config FILE --db STORE --name NAME`` (an argument
list, no shell, so no value can become a command), its output going to a log file beside it. The
form validates the configuration (the field is named at once); the job reads its file and
validates it again, its own input. The job is remembered in ``runs/job.json`` (with its config
file) so that a page reload, another browser tab or a restarted server still sees it, and can stop
it: SIGINT, which the trainer answers by finishing the current step, recording it, and marking
the run 'stopped'.

``AGENTRL_RUNS_DIR`` replaces ``runs`` (tests point it at a temporary directory). Every run is
recorded into ``<runs dir>/store.duckdb``; the user picks no path, so a job cannot write outside it.

The form never takes a path or a module typed by the user: it offers the built-in models and
environments, installed environment plugins (entry points), and an allow-list whoever serves the
app sets (``allowed_models``, ``allowed_envs``):

* ``AGENTRL_MODEL_DIRS``: directories separated by ``os.pathsep``; each sub-directory holding a
  ``config.json`` (a Hugging Face model) and each ``*.gguf`` file in them is offered.
* ``AGENTRL_ENV_MODULES``: ``package.module:Factory`` entries separated by commas.

``allowed`` refuses anything else (the server's policy, not the configuration's validity), so a
crafted request cannot make a job read another path or import another module.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

from core.config import ENVS, MODELS, USER_ENV, TrainConfig, env_plugins, validate

ROOT = Path(__file__).resolve().parent.parent
RUNS_DIR_ENV = "AGENTRL_RUNS_DIR"
TRAIN_STORE_ENV = "AGENTRL_TRAIN_STORE"
MODEL_DIRS_ENV = "AGENTRL_MODEL_DIRS"
ENV_MODULES_ENV = "AGENTRL_ENV_MODULES"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
PROGRESS_RE = re.compile(r"progress (\d+)/(\d+)")
"""What the branch and cross-evaluation jobs print as they go: ``progress DONE/TOTAL``."""
_CHILDREN: dict[int, subprocess.Popen] = {}   # every job this server process started (training,
#                                               branch, clusters), by pid; reaped by poll


class JobError(RuntimeError):
    """A job that cannot be started or stopped; the message says why."""


def runs_dir() -> Path:
    return Path(os.environ.get(RUNS_DIR_ENV, "runs"))


def job_file() -> Path:
    return runs_dir() / "job.json"


def store_path() -> Path:
    """Where the form's jobs record: ``$AGENTRL_TRAIN_STORE`` (a DuckDB file or a team store's
    directory, docs/team-store.md) if set, else ``runs/store.duckdb``."""
    chosen = os.environ.get(TRAIN_STORE_ENV, "").strip()
    return Path(chosen) if chosen else runs_dir() / "store.duckdb"


def check_name(name: str) -> str:
    """Run names become file names of logs: letters, digits, '.', '_', '-' only, 1-64 long."""
    if not NAME_RE.fullmatch(name or ""):
        raise JobError(f"run name {name!r}: use 1-64 letters, digits, '.', '_' or '-', "
                       "starting with a letter or digit")
    return name


def allowed(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` if the launcher may train it, else JobError: only what the form offers. A model
    path or module a request made up would let a job read files or run code the person serving
    the app did not choose (the command line still takes them)."""
    if cfg.model not in MODELS and cfg.model not in allowed_models():
        raise JobError(f"model {cfg.model!r}: the launcher trains {', '.join(MODELS)} or a model "
                       f"the {MODEL_DIRS_ENV} allow-list offers")
    if cfg.env not in allowed_envs():
        raise JobError(f"env {cfg.env!r}: the launcher trains the built-in environments, "
                       f"installed plugins or one the {ENV_MODULES_ENV} allow-list names")
    if cfg.checkpoint_dir or cfg.resume or cfg.init_from:
        raise JobError("checkpoint_dir, resume and init_from are not launcher settings: "
                       "checkpoints go next to the store")
    return cfg


def write_config(cfg: TrainConfig, path: Path) -> Path:
    """``cfg``, every field, as the YAML file ``core.train --config`` reads (YAML keeps every
    float exact; a JSON ``1e-06`` would read back as text). Written aside, then renamed."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    tmp.replace(path)
    return path


def command(config_file: Path, name: str) -> list[str]:
    """The trainer's argument list: the job's config file, the fixed store and the run name
    (both in the file too; as flags, the process list says where the job records)."""
    return [sys.executable, "-m", "core.train", "--config", str(config_file),
            "--db", str(store_path()), "--name", check_name(name)]


def allowed_models() -> dict[str, str]:
    """{model path: label} of the models ``AGENTRL_MODEL_DIRS`` offers: every sub-directory
    holding a config.json and every *.gguf file of each listed directory (not deeper)."""
    offered: dict[str, str] = {}
    for entry in os.environ.get(MODEL_DIRS_ENV, "").split(os.pathsep):
        base = Path(entry.strip()).expanduser()
        if not entry.strip() or not base.is_dir():
            continue
        base = base.resolve()
        for child in sorted(base.iterdir()):
            if ((child.is_dir() and (child / "config.json").is_file())
                    or (child.suffix == ".gguf" and child.is_file())):
                offered[str(child)] = f"{child.name} ({base})"
    return offered


def allowed_envs() -> list[str]:
    """The environments the launcher trains: built-in, installed plugins (entry points), then
    the ``package.module:Factory`` entries of ``AGENTRL_ENV_MODULES`` (see ``ignored_envs``)."""
    listed = [e.strip() for e in os.environ.get(ENV_MODULES_ENV, "").split(",")]
    plugins = sorted(env_plugins.installed())
    return list(dict.fromkeys([*ENVS, *plugins, *(e for e in listed if USER_ENV.fullmatch(e))]))


def ignored_envs() -> list[str]:
    """Entries of ``AGENTRL_ENV_MODULES`` that are not ``package.module:Factory``."""
    listed = [e.strip() for e in os.environ.get(ENV_MODULES_ENV, "").split(",")]
    return [e for e in listed if e and not USER_ENV.fullmatch(e)]


PROBE = ("import json, torch; ok = torch.cuda.is_available(); n = torch.cuda.device_count() "
         "if ok else 0; print(json.dumps({'cuda': ok, 'count': n, 'names': "
         "[torch.cuda.get_device_name(i) for i in range(n)], 'torch': torch.__version__}))")
_PROBED: dict = {}


def accelerator() -> dict:
    """What the trainer's own interpreter sees: {'cuda': bool, 'count': n, 'names': [...]} (or
    {'error': ...}). Asked once per server process, in a child process: pages never import
    torch, and only torch itself can say whether its build sees a GPU (a CPU-only torch on a GPU
    machine does not)."""
    if not _PROBED:
        try:
            out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                                 timeout=120, cwd=ROOT, stdin=subprocess.DEVNULL)
            _PROBED.update(json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0
                           else {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]})
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
            _PROBED.update({"error": f"{type(exc).__name__}: {exc}"})
    return dict(_PROBED)


def job_device(requested: str = "auto") -> tuple[str, str]:
    """(device, why) the job will use for ``--device requested`` on this machine: auto is
    cuda when the trainer's torch sees a GPU, else cpu (core/model/device.py decides the same way)."""
    seen = accelerator()
    if "error" in seen:
        return "cpu", f"could not ask torch whether a GPU is present ({seen['error']})"
    gpus = ", ".join(seen.get("names") or []) or "none"
    if requested == "cpu":
        return "cpu", "asked for"
    if seen.get("cuda"):
        return ("cuda" if requested == "auto" else requested), f"GPUs: {gpus}"
    if requested == "auto":
        return "cpu", "torch sees no CUDA GPU on this machine"
    return requested, "but torch sees no CUDA GPU here: the job will refuse to start"


def process_alive(pid: int, module: str) -> bool:
    """Whether the job with ``pid`` (``python -m module``) still runs. One this server process
    started is polled (which also reaps it); one an earlier server process started is looked up
    by its command line, since its pid may since have gone to another process."""
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        proc = psutil.Process(pid)
        return module in proc.cmdline() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, ValueError):
        return False


def read_job(path: Path, module: str) -> dict | None:
    """The job remembered in ``path`` (JSON) with ``alive`` filled in; None if never started or
    unreadable. Training, branch and cluster jobs are all remembered this way."""
    try:
        job = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    job["alive"] = process_alive(int(job.get("pid", -1)), module)
    return job


def write_job(path: Path, job: dict) -> None:
    """Remember ``job`` in ``path`` whole or not at all (written aside, then renamed), so a
    reader never meets half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(job, indent=1))
    tmp.replace(path)


def spawn(args: list[str], log_path: Path) -> subprocess.Popen:
    """Start ``args`` (a list: no shell) as its own session in the project root, offline, its
    output into ``log_path``; remembered so that ``process_alive`` polls and reaps it."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:
        child = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    _CHILDREN[child.pid] = child
    return child


def current() -> dict | None:
    """The last job started (from runs/job.json) with ``alive`` filled in; None if never."""
    return read_job(job_file(), "core.train")


def launch(cfg: TrainConfig, name: str) -> dict:
    """Check ``cfg`` against the allow-list (first: a crafted path is refused before anything
    looks at it), validate it (ConfigError naming the field) and start one training job on it,
    its configuration written to a file beside its log; refuse while another one runs."""
    validate(allowed(cfg))
    check_name(name)
    running = current()
    if running and running["alive"]:
        raise JobError(f"a training job is already running (run {running['name']!r}, pid "
                       f"{running['pid']}); stop it or wait for it to finish")
    logs = runs_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stem = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"  # a name may hold '.': no with_suffix
    config_file = write_config(cfg.replace(db=str(store_path()), name=name),
                               logs / f"{stem}.yaml")
    log_path = logs / f"{stem}.log"
    args = command(config_file, name)
    child = spawn(args, log_path)
    job = {"pid": child.pid, "name": name, "db": str(store_path()), "log": str(log_path),
           "config": str(config_file), "args": args[1:], "total_steps": cfg.sft_steps + cfg.steps,
           "started_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_job(job_file(), job)
    return {**job, "alive": True}


def stop(job: dict) -> None:
    """Ask the job to stop after its current step (the trainer's SIGINT handling)."""
    if not job or not process_alive(int(job["pid"]), "core.train"):
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


def progress_of(log: str) -> tuple[int, int] | None:
    """(done, total) of the last ``progress DONE/TOTAL`` line in a job's log; None before it."""
    found = PROGRESS_RE.findall(log)
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def kill(job: dict | None, module: str, what: str) -> None:
    """Stop a job that writes its results in one transaction at its very end (a branch or
    cross-evaluation job): killed before then it has written nothing, so SIGTERM is safe."""
    if not job or not process_alive(int(job["pid"]), module):
        raise JobError(f"no {what} job is running")
    try:
        os.kill(int(job["pid"]), signal.SIGTERM)
    except ProcessLookupError:
        raise JobError(f"the {what} job has already ended") from None
