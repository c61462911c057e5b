"""Cross-evaluations in the store: a checkpoint of one run evaluated on the held-out tasks and
episode seeds another evaluation used (core/jobs/evaluation.py), so Compare can pair them task by task.

What the job reads: the run's source and configuration, and the evaluation's task set -- each
recorded eval trajectory's task id, episode seed (``info.episode_seed``) and prompt, in the order
the trainer rolled them out. What it writes, in ONE transaction: a new run (status 'finished',
its configuration linking both sides under ``cross_eval``) holding a single evaluation (split
'eval') at the checkpoint's step, with its trajectories, turns, tokens, rewards and ``eval/*``
metrics. The run id is derived from (checkpoint run, snapshot step, task run, task step, seed):
the same job again replaces its earlier result instead of adding a twin; a job killed before
its write leaves nothing.

Torch-free: the Compare page reads ``cross_evaluations`` and ``adapter_steps`` from here, and the
branch and evaluation jobs find a run's adapter snapshots with ``adapter_home``.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pandas as pd

from storage import db
from storage.migrations import check_version, prepare
from storage.recorder import insert_frame, now, to_frame, to_json

CONFIG_KEY = "cross_eval"
"""The key of ``runs.config`` that links a cross-evaluation to both sides."""
ADAPTERS = "adapters"  # core/model/checkpoint.py's ADAPTERS (pages may not import torch through it)
_GROUP = re.compile(r"-g(\d+)-r(\d+)$")


def _store_version(con, path) -> int:
    version = check_version(con, where=str(path))
    if version == 0:
        raise db.StoreError(f"{path} is not a store of this project (no schema recorded)")
    return version


def run_info(path: str | Path, run_id: str) -> dict | None:
    """{run_id, name, source, status, last_step, config (dict)} of ``run_id``, None if absent."""
    with db.reading(path) as con:
        _store_version(con, path)
        row = con.execute("SELECT run_id, name, source, status, last_step, config FROM runs "
                          "WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        return None
    config = row[5]
    config = json.loads(config) if isinstance(config, str) else (config or {})
    return {"run_id": row[0], "name": row[1] or row[0], "source": row[2] or "trainer",
            "status": row[3], "last_step": row[4], "config": config}


def task_set(path: str | Path, run_id: str, step: int) -> pd.DataFrame:
    """The evaluation (run_id, step)'s tasks as rolled out: traj_id, task_id, seed (the episode
    seed, <NA> where none was recorded), prompt; in the trainer's order (rank, then group
    index ``-gN-`` of the trajectory id, then the id). Empty when there is no such evaluation."""
    with db.reading(path) as con:
        _store_version(con, path)
        frame = con.execute("""
            SELECT traj_id, task_id,
                   TRY_CAST(json_extract_string(info, '$.episode_seed') AS BIGINT) AS seed,
                   prompt, coalesce(rank, 0) AS rank
            FROM trajectories WHERE run_id = ? AND step = ? AND split = 'eval'""",
                            [run_id, int(step)]).df()
    if frame.empty:
        return frame
    found = frame["traj_id"].astype(str).str.extract(_GROUP)
    frame["_g"] = pd.to_numeric(found[0], errors="coerce").fillna(-1)
    frame["_r"] = pd.to_numeric(found[1], errors="coerce").fillna(-1)
    frame = frame.sort_values(["rank", "_g", "_r", "traj_id"]).reset_index(drop=True)
    frame["seed"] = frame["seed"].astype("Int64")
    return frame[["traj_id", "task_id", "seed", "prompt"]]


def cross_run_id(run_id: str, step: int, tasks_run: str, tasks_step: int, seed: int) -> str:
    """The deterministic id of the cross-evaluation (one per job input)."""
    key = json.dumps([run_id, int(step), tasks_run, int(tasks_step), int(seed)])
    return "xeval-" + hashlib.sha1(key.encode()).hexdigest()[:12]


def cross_evaluations(path: str | Path) -> pd.DataFrame:
    """Every cross-evaluation of the store: run_id, step (its evaluation's), name, and the
    ``cross_eval`` link: checkpoint_run, checkpoint_step (asked), snapshot_step (loaded),
    tasks_run, tasks_step, seed. Empty when there is none."""
    cols = ["run_id", "step", "name", "checkpoint_run", "checkpoint_step", "snapshot_step",
            "tasks_run", "tasks_step", "seed"]
    with db.reading(path) as con:
        _store_version(con, path)
        rows = con.execute(
            "SELECT run_id, name, config FROM runs WHERE json_extract(config, ?) IS NOT NULL "
            "ORDER BY created_at", ["$." + CONFIG_KEY]).fetchall()
    out = []
    for run_id, name, config in rows:
        link = (json.loads(config) if isinstance(config, str) else config or {}).get(CONFIG_KEY)
        if not isinstance(link, dict):
            continue
        try:
            out.append({"run_id": run_id, "step": int(link["snapshot_step"]), "name": name,
                        **{k: link[k] for k in cols[3:]}})
        except (KeyError, TypeError, ValueError):
            continue  # a config edited by hand: not ours to show
    return pd.DataFrame(out, columns=cols)


def adapter_home(path: str | Path, run_id: str, config: dict) -> Path:
    """The folder holding ``run_id``'s ``adapters/step-N.pt`` snapshots: ``checkpoint_dir/RUN``
    when the run set a checkpoint_dir and that folder holds snapshots, else ``checkpoints/RUN``
    next to the store -- the trainer's default, and where a store shipped with its adapters keeps
    them (the sample stores do: their runs trained into a checkpoint_dir that is not committed).
    When neither holds any, the folder the run wrote to, so a refusal names where it looked."""
    beside = Path(path).resolve().parent / "checkpoints" / run_id
    if not config.get("checkpoint_dir"):
        return beside
    own = Path(config["checkpoint_dir"]) / run_id
    return beside if not _steps(own) and _steps(beside) else own


def adapter_steps(path: str | Path, run_id: str, config: dict) -> list[int]:
    """Steps with a kept adapter snapshot of ``run_id`` in ``adapter_home``, ascending.
    Torch-free, so the page can say what exists."""
    return _steps(adapter_home(path, run_id, config))


def _steps(home: Path) -> list[int]:
    adapters = home / ADAPTERS
    steps = []
    for file in adapters.glob("step-*.pt") if adapters.is_dir() else []:
        try:
            steps.append(int(file.stem.removeprefix("step-")))
        except ValueError:
            continue
    return sorted(steps)


def write(path: str | Path, run_id: str, name: str, config: dict, step: int, metrics: dict,
          tables: dict) -> None:
    """The cross-evaluation in one transaction: an earlier run with ``run_id`` (the same job
    before) and all its rows go, then the run row (finished) and the evaluation's ``tables``
    (the recorder's per-trajectory tables) and ``metrics`` at ``step``."""
    prepare(path)
    frames = {t: to_frame(t, rows) for t, rows in tables.items()}
    metric_frame = to_frame("metrics", metrics)
    with db.writing(path) as con:
        # every table with a run_id (later migrations' too), views left out
        tables_of_runs = [r[0] for r in con.execute(
            "SELECT DISTINCT c.table_name FROM duckdb_columns() c JOIN duckdb_tables() t "
            "ON t.schema_name = c.schema_name AND t.table_name = c.table_name "
            "WHERE c.column_name = 'run_id' AND c.schema_name = 'main' "
            "AND c.table_name <> 'runs' ORDER BY 1").fetchall()]
        for table in tables_of_runs:
            con.execute(f'DELETE FROM "{table}" WHERE run_id = ?', [run_id])
        con.execute("DELETE FROM runs WHERE run_id = ?", [run_id])
        con.execute(
            "INSERT INTO runs (run_id, name, created_at, status, config, updated_at, source, "
            "last_step) VALUES (?, ?, ?, 'finished', ?, ?, 'trainer', ?)",
            [run_id, name, now(), to_json(config), now(), int(step)])
        for table, frame in frames.items():
            insert_frame(con, table, frame, run_id, step)
        insert_frame(con, "metrics", metric_frame, run_id, step)
