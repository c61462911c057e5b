"""The Failures page's SQL box: users' own queries over a store, which can never change it.

Read-only by construction, in layers, so that no single check has to be perfect:

1. the store is opened with a read-only connection (``db.reading``): DuckDB itself refuses every
   write to the database;
2. external access is switched off and the configuration locked before the user's text runs, so
   ``COPY ... TO``, ``ATTACH``, ``read_csv('/any/file')`` and ``SET`` cannot reach other files;
3. the text must parse as exactly one SELECT (or EXPLAIN) statement: anything else is refused
   with a message before it runs;
4. a row limit (only ``max_rows`` rows are fetched) and a time limit: the query runs in a worker
   thread and is interrupted (``con.interrupt()``) when the limit passes. The limit also bounds
   how long the file is held, which keeps a running trainer's next write from waiting on it.
"""
from __future__ import annotations

import threading
from pathlib import Path

import duckdb
import pandas as pd

from storage import db

ALLOWED = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
MAX_ROWS = 1000
TIME_LIMIT_S = 5.0


class SqlRefused(ValueError):
    """The text is not a single read-only query, or it ran past the time limit."""


def check_statement(sql: str) -> None:
    """Raise SqlRefused unless ``sql`` is exactly one SELECT/EXPLAIN statement."""
    if not sql or not sql.strip():
        raise SqlRefused("the query is empty")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise SqlRefused(f"the query does not parse: {exc}") from exc
    if len(statements) != 1:
        raise SqlRefused(f"one statement at a time, got {len(statements)}")
    kind = statements[0].type
    if kind not in ALLOWED:
        raise SqlRefused(f"only SELECT queries are allowed here; this is a {kind.name} statement, "
                         "and the store is opened read-only")


def run_query(store: str | Path, sql: str, max_rows: int = MAX_ROWS,
              timeout_s: float = TIME_LIMIT_S) -> tuple[pd.DataFrame, bool]:
    """Run a user's query read-only; return (at most ``max_rows`` rows, truncated?)."""
    check_statement(sql)
    result: dict = {}
    with db.reading(store) as con:
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")

        def work() -> None:
            try:
                cur = con.execute(sql)
                rows = cur.fetchmany(max_rows + 1)
                result["columns"] = [d[0] for d in cur.description or []]
                result["rows"] = rows
            except Exception as exc:  # reported to the user below, in the calling thread
                result["error"] = exc

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():
            con.interrupt()
            worker.join(5.0)
            raise SqlRefused(f"the query ran longer than {timeout_s:g} s and was stopped")
    if "error" in result:
        exc = result["error"]
        if isinstance(exc, duckdb.Error):
            raise SqlRefused(f"the query failed: {exc}") from exc
        raise exc
    rows = result["rows"]
    truncated = len(rows) > max_rows
    return pd.DataFrame(rows[:max_rows], columns=result["columns"]), truncated
