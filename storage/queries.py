"""Every read the app does. Each function opens the store read-only, reads, closes (storage/db.py
explains why) and returns a pandas DataFrame (or a plain value).

A *store* is one DuckDB file. The app shows every store under ``sample_runs/`` and the user's
``runs/`` directory; a run is addressed by (store path, run_id).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from storage import db
from storage.migrations import check_version

STORE_DIRS = ("sample_runs", "runs")
STORE_SUFFIXES = (".duckdb", ".db")


def discover_stores(dirs: tuple[str, ...] = STORE_DIRS, root: str | Path = ".") -> list[str]:
    """DuckDB files directly under each of ``dirs`` (relative to ``root``), sorted."""
    found = []
    for d in dirs:
        base = Path(root) / d
        if base.is_dir():
            found += sorted(str(p) for p in base.iterdir() if p.suffix in STORE_SUFFIXES)
    return found


def _read(path: str | Path, sql: str, params: list | None = None) -> pd.DataFrame:
    with db.reading(path) as con:
        check_version(con, where=str(path))
        return con.execute(sql, params or []).df()


def runs(path: str | Path) -> pd.DataFrame:
    """One row per run in the store, newest first, with its store path."""
    df = _read(path, """
        SELECT run_id, name, created_at, updated_at, status, error, source, last_step,
               config
        FROM runs ORDER BY created_at DESC""")
    df["store"] = str(path)
    return df


def all_runs(stores: list[str] | None = None) -> pd.DataFrame:
    """Runs of every store; stores that cannot be read are reported in column ``error``."""
    frames = []
    for path in stores if stores is not None else discover_stores():
        try:
            frames.append(runs(path))
        except db.StoreError as exc:
            frames.append(pd.DataFrame([{"run_id": None, "store": path, "status": "unreadable",
                                         "error": str(exc)}]))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["run_id", "name", "created_at", "status", "store"])


def metrics(path: str | Path, run_id: str, names: list[str] | None = None) -> pd.DataFrame:
    """Long table (step, name, value) of a run's metrics, optionally only ``names``."""
    sql = "SELECT step, name, value FROM metrics WHERE run_id = ?"
    params: list = [run_id]
    if names:
        sql += " AND name IN (SELECT unnest(?))"
        params.append(names)
    return _read(path, sql + " ORDER BY step, name", params)
