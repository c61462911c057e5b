"""Opening DuckDB files: the one place that calls ``duckdb.connect``.

Concurrency design (measured: while one process holds a DuckDB file for writing, another process
cannot open it at all, not even read-only). So nobody holds the file for long:

* the trainer opens the file for each step's write transaction and closes it right after
  (open + write + close measured at ~18 ms), so between steps the file is free;
* readers (the app, exports) open read-only for each query batch and close at once (~17 ms);
* whoever finds the file locked retries with a short backoff. A step's write never waits more
  than ``LOCK_TIMEOUT_S`` on readers, and a reader never waits more than that on the writer.

A step is written in one transaction, so a reader sees either the whole step or none of it, and a
trainer killed mid-write leaves the previous steps intact. Once a run ends the file is a plain
DuckDB database (CONTRACTS.md).
"""
from __future__ import annotations

import contextlib
import random
import time
from pathlib import Path
from typing import Iterator

import duckdb

LOCK_TIMEOUT_S = 10.0


class StoreError(RuntimeError):
    """A database that cannot be used: unreadable, newer schema, locked too long."""


def _is_lock_error(exc: Exception) -> bool:
    msg = str(exc)
    return "lock" in msg.lower() and ("Conflicting" in msg or "Could not set lock" in msg)


def connect(path: str | Path | None, read_only: bool = False,
            timeout_s: float = LOCK_TIMEOUT_S) -> duckdb.DuckDBPyConnection:
    """Open ``path`` (None or ':memory:' -> in-memory), retrying while another process holds it."""
    if path is None or str(path) == ":memory:":
        return duckdb.connect(":memory:")
    path = Path(path)
    if read_only and not path.exists():
        raise StoreError(f"no database at {path}")
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as exc:
            if _is_lock_error(exc) and time.monotonic() < deadline:
                time.sleep(delay + random.random() * delay)
                delay = min(delay * 2, 0.1)
                continue
            if _is_lock_error(exc):
                raise StoreError(f"{path} stayed locked by another process for {timeout_s:.0f} s") from exc
            raise StoreError(f"cannot open {path}: {exc}") from exc
        except duckdb.Error as exc:
            raise StoreError(f"cannot open {path} as a DuckDB database: {exc}") from exc


@contextlib.contextmanager
def reading(path: str | Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived read-only connection (readers never block the trainer for long)."""
    con = connect(path, read_only=True)
    try:
        yield con
    finally:
        con.close()


@contextlib.contextmanager
def writing(path: str | Path | None) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived read-write connection whose statements form one transaction."""
    con = connect(path, read_only=False)
    try:
        con.execute("BEGIN TRANSACTION")
        try:
            yield con
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    finally:
        con.close()
