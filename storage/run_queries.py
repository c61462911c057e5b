"""The run list and the keys that say when a run changed: the stores the app finds, each
store's runs and their shown status, a run's metrics and steps, and ``run_version`` (the key of
every cached page read). storage/queries.py re-exports all of it, so the app reads one API.

Each function opens the store read-only, reads, closes (storage/db.py explains why).
"""
from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pandas as pd

from storage import db, lake
from storage.migrations import check_version


STORE_DIRS = ("sample_runs", "runs")
STORE_SUFFIXES = (".duckdb", ".db")
STORE_DIRS_ENV = "AGENTRL_STORE_DIRS"
READ_TRIES = 20  # reads of a team store whose SQLite catalog another process is committing to
STALE_AFTER_S = 120
"""A 'running' run not updated for this long is shown as 'interrupted' (its trainer died)."""


def store_dirs() -> tuple[str, ...]:
    """The directories searched for stores: ``$AGENTRL_STORE_DIRS`` if set, else STORE_DIRS."""
    value = os.environ.get(STORE_DIRS_ENV, "").strip()
    if not value:
        return STORE_DIRS
    return tuple(d for d in value.split(os.pathsep) if d)


def discover_stores(dirs: tuple[str, ...] | None = None, root: str | Path = ".") -> list[str]:
    """Stores directly under each of ``dirs`` (default ``store_dirs()``), sorted per dir: DuckDB
    files, team stores (directories on DuckLake, storage/lake.py), and directories holding a
    partitioned Parquet export (``db.PARQUET_MARKER``), which open read-only."""
    found = []
    for d in dirs if dirs is not None else store_dirs():
        base = Path(root) / d
        if base.is_dir():
            found += sorted(str(p) for p in base.iterdir()
                            if (p.suffix in STORE_SUFFIXES and p.is_file())
                            or (p.is_dir() and (p / db.PARQUET_MARKER).is_file())
                            or lake.is_lake(p))
    return found


def is_team_store(path: str | Path) -> bool:
    """Whether ``path`` is a team store (a directory on DuckLake) rather than a file."""
    return lake.is_lake(path)


def team_store_snapshot(path: str | Path) -> int:
    """A team store's latest snapshot id, new with every commit (storage/lake.py)."""
    return lake.snapshot(path)


def _read(path: str | Path, sql: str, params: list | None = None) -> pd.DataFrame:
    return _read_many(path, [(sql, params)])[0]


def _read_many(path: str | Path, statements: list[tuple[str, list | None]]
               ) -> list[pd.DataFrame]:
    """Several reads in one open of the store: opening a large file read-only costs more than a
    small query on it (~15-30 ms of the bench store's 357 MB, the advisory lock included)."""
    for attempt in range(READ_TRIES if lake.is_lake(path) else 1):
        try:
            with db.reading(path) as con:
                if check_version(con, where=str(path)) == 0:
                    raise db.StoreError(f"{path} is not a store of this project (no schema "
                                        "recorded)")
                return [con.execute(sql, params or []).df() for sql, params in statements]
        except duckdb.Error as exc:  # a team store's SQLite catalog locked by a commit: again
            if not lake.lost_race(exc) or attempt == READ_TRIES - 1:
                raise
            time.sleep(0.02 * (attempt + 1))


def shown_status(status: str | None, updated_at, now: datetime | None = None,
                 stale_after_s: float = STALE_AFTER_S) -> str:
    """The status to show: a 'running' run whose trainer stopped writing is 'interrupted'."""
    if status != "running" or updated_at is None or pd.isna(updated_at):
        return status or "unknown"
    now = now or datetime.now(timezone.utc).replace(tzinfo=None)
    age = (pd.Timestamp(now) - pd.Timestamp(updated_at)).total_seconds()
    return "interrupted" if age > stale_after_s else "running"


# -- runs and metrics ------------------------------------------------------------------------------
def runs(path: str | Path) -> pd.DataFrame:
    """One row per run in the store, newest first, with its store path and the status to show."""
    df = _read(path, """
        SELECT run_id, name, created_at, updated_at, status, error, source, last_step,
               config
        FROM runs ORDER BY created_at DESC""")
    df["store"] = str(path)
    df["shown_status"] = [shown_status(s, u) for s, u in zip(df["status"], df["updated_at"])]
    return df


def all_runs(stores: list[str] | None = None, frames: list[pd.DataFrame] | None = None
             ) -> pd.DataFrame:
    """Runs of every store, newest first across stores (the app picks the first one); stores
    that cannot be read are reported in column ``error``, after every run. ``frames``: tables
    already read by earlier calls (one store each, the app caches them per store), whose
    shown status is worked out again (time passes)."""
    frames = [f.assign(shown_status=[shown_status(s, u) for s, u in
                                     zip(f["status"], f["updated_at"])])
              if "updated_at" in f else f for f in frames or []]
    for path in stores if stores is not None else discover_stores():
        try:
            frames.append(runs(path))
        except db.StoreError as exc:
            frames.append(pd.DataFrame([{"run_id": None, "store": path, "status": "unreadable",
                                         "shown_status": "unreadable", "error": str(exc)}]))
    if not frames:
        return pd.DataFrame(columns=["run_id", "name", "created_at", "status", "shown_status",
                                     "store"])
    table = pd.concat(frames, ignore_index=True)
    if "created_at" not in table:                # only unreadable stores
        return table
    return table.sort_values("created_at", ascending=False, na_position="last",
                             kind="stable").reset_index(drop=True)


def run_config(config_json) -> dict:
    """A run's config column as a dict ({} when missing or not a JSON object)."""
    if isinstance(config_json, dict):
        return config_json
    try:
        value = json.loads(config_json) if config_json else {}
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def metrics(path: str | Path, run_id: str, names: list[str] | None = None) -> pd.DataFrame:
    """Long table (step, name, value) of a run's metrics, optionally only ``names``."""
    sql = "SELECT step, name, value FROM metrics WHERE run_id = ?"
    params: list = [run_id]
    if names:
        sql += " AND name IN (SELECT unnest(?))"
        params.append(names)
    return _read(path, sql + " ORDER BY step, name", params)


def metric_names(path: str | Path, run_id: str) -> list[str]:
    """The metric names a run recorded, sorted (distinct in DuckDB: not the whole table)."""
    return _read(path, "SELECT DISTINCT name FROM metrics WHERE run_id = ? ORDER BY name",
                 [run_id])["name"].tolist()


def metric_series(path: str | Path, run_ids: list[str], names: list[str]) -> pd.DataFrame:
    """Long table (run_id, step, name, value) for several runs of one store at once."""
    return _read(path, """
        SELECT run_id, step, name, value FROM metrics
        WHERE run_id IN (SELECT unnest(?)) AND name IN (SELECT unnest(?))
        ORDER BY run_id, step, name""", [list(run_ids), list(names)])


def row_hash(*columns: str) -> str:
    """SQL for one hash of a row's ``columns``, for ``bit_xor`` to fold over rows. Not DuckDB's
    ``hash(a, b, ...)`` alone: it XORs its last column's hash into the rest, so folded over rows
    two rows whose last column changed alike (two trajectories reclassified in one write, a
    metric constant over an even number of steps taking a new value) cancelled out. Hashed
    again, each row's hash is mixed whole, about as cheap as the plain fold (a string of the
    row's values cost twice as much on the largest sample run's 2,409 metric rows)."""
    return f"hash(hash({', '.join(columns)}))"


METRICS_VERSION_SQL = ("SELECT count(*) || '.' || coalesce(bit_xor("
                       f"{row_hash('step', 'name', 'value')}), 0) FROM metrics WHERE run_id = ?")
"""A run's metric rows as ``run_version`` keys them: their count and a fingerprint of their
steps, names and values (one scan of the run's rows)."""
TRAJ_ROW_HASH = row_hash("traj_id", "num_turns", "reward", "success", "finish_reason",
                         "failure_class")
"""A trajectory as ``run_version`` fingerprints it: its id, turns, outcome and finish."""


def run_version(path: str | Path, run_id: str) -> str:
    """What changes when a run's data does, for the app's cached reads to be keyed by: the last
    step, the run's metric rows (how many, and a fingerprint of their step, name and value: an
    ``agentrl behaviours`` rerun rewrites as many rows with new values), and per trajectory its
    id, turns, outcome and finish (a fingerprint, one scan of narrow columns). A run's last step
    alone never moves on an imported or OTLP run, whose trajectories all sit at step 0 while the
    receiver or a followed import adds and rewrites them; an open OTLP trajectory's ``info``
    (its span count) is in it too, as it grows without a new turn. A few ms on the largest
    sample run (2,409 metric rows)."""
    df = _read(path, f"""
        SELECT (SELECT last_step FROM runs WHERE run_id = ?) AS last_step,
               ({METRICS_VERSION_SQL}) AS metrics, count(*) AS n,
               coalesce(bit_xor({TRAJ_ROW_HASH}), 0) AS rows,
               coalesce(bit_xor(hash(info)) FILTER (WHERE finish_reason IS NULL), 0) AS open
        FROM trajectories WHERE run_id = ?""", [run_id, run_id, run_id])
    row = df.iloc[0]
    last = row["last_step"]
    return f"{'' if pd.isna(last) else int(last)}:{row['metrics']}:{int(row['n'])}:" \
           f"{int(row['rows'])}:{int(row['open'])}"


OPEN_CLASS = "open"
"""The class shown for an OTLP trajectory whose agent still runs (``info.otel.open``): it has no
outcome yet, so neither a failure class nor a reward or success is shown for it."""
OPEN_SQL = ("(t.finish_reason IS NULL AND t.info IS NOT NULL "
            "AND coalesce(json_extract_string(t.info, '$.otel.open') = 'true', false))")
"""Whether row ``t`` is such a trajectory (storage/otlp/assemble.py writes ``info.otel.open``
and no finish reason until it closes; the JSON is only parsed for rows without one)."""
SHOWN_CLASS_SQL = (f"CASE WHEN {OPEN_SQL} THEN '{OPEN_CLASS}' ELSE coalesce(t.failure_class, "
                   "CASE WHEN t.success THEN 'success' ELSE 'unclassified' END) END")
"""The class a page shows: the stored one, 'success' / 'unclassified' for none, 'open'."""


def steps(path: str | Path, run_id: str) -> pd.DataFrame:
    """Steps of a run that recorded trajectories: (step, trajectories, groups, splits)."""
    return _read(path, """
        SELECT step, count(*) AS trajectories, count(DISTINCT group_id) AS groups,
               string_agg(DISTINCT split, ',') AS splits
        FROM trajectories WHERE run_id = ? GROUP BY step ORDER BY step""", [run_id])
