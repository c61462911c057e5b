"""The Failures page's SQL box: users' own queries over a store, which can never change it, nor
take the app's memory with them.

Read-only by construction, in layers, so that no single check has to be perfect:

1. the store is opened with a read-only connection (``db.reading``): DuckDB itself refuses every
   write to the database;
2. external access is switched off and the configuration locked before the user's text runs, so
   ``COPY ... TO``, ``ATTACH``, ``read_csv('/any/file')`` and ``SET`` cannot reach other files
   (a partitioned-Parquet store's views read its own directory, the only one allowed);
3. the text must parse as exactly one SELECT (or EXPLAIN) statement: anything else is refused
   with a message before it runs;
4. limits: rows (only ``max_rows`` are fetched), time (the query is interrupted when
   ``timeout_s`` passes, which also bounds how long a running trainer's next write waits on the
   file), bytes of the result (``max_bytes``) and memory.

The query runs in a child process (``python -m storage.sql_box``): DuckDB's ``memory_limit``
bounds its operators (a ``string_agg`` over millions of rows is refused), but not the strings of
one vector of results (2,048 rows of 1 MB each are built at once), so the child's whole address
space is capped too (RLIMIT_AS) and the app's server never holds more than the result's capped
bytes. The child hands the rows back as an Arrow IPC stream.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from storage import db

if TYPE_CHECKING:  # the child process never needs pandas: it starts faster without it
    import pandas as pd

ALLOWED = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
MAX_ROWS = 1000
TIME_LIMIT_S = 5.0
MAX_BYTES = 16 * 2 ** 20
"""Bytes of a result (Arrow buffers) handed back; a larger result is refused with a message."""
MEMORY_LIMIT = "256MB"
"""DuckDB's own memory limit for the query (its operators; nothing spills to disk)."""
ADDRESS_SPACE = 2 * 2 ** 30
"""The child's whole address space (Python, DuckDB, Arrow): ~1 GiB of it is mapped at start."""
THREADS = 2
BATCH_ROWS = 64
START_S = 60.0
"""Time the child may take to start (import DuckDB and Arrow on a loaded machine) on top of the
query's own limit, before it is killed."""
REFUSED, UNREADABLE, SYNTAX, FAILED = 3, 4, 5, 6
"""The child's exit status for a refused query, a store that cannot be read, a query that does
not parse, and a query that parsed but failed (unknown column, wrong type, ...)."""


class SqlRefused(ValueError):
    """The text is not a single read-only query, or it ran past a limit."""


class SqlSyntaxError(SqlRefused):
    """The text does not parse as SQL (the user's typo, not the box's rule)."""


class SqlFailed(SqlRefused):
    """The query parsed and was allowed, but DuckDB could not run it (e.g. an unknown column)."""


def check_statement(sql: str) -> None:
    """Raise SqlRefused unless ``sql`` is exactly one SELECT/EXPLAIN statement."""
    if not sql or not sql.strip():
        raise SqlRefused("the query is empty")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise SqlSyntaxError(str(exc)) from exc
    if len(statements) != 1:
        raise SqlRefused(f"one statement at a time, got {len(statements)}")
    kind = statements[0].type
    if kind not in ALLOWED:
        raise SqlRefused(f"only SELECT queries are allowed here; this is a {kind.name} statement, "
                         "and the store is opened read-only")


def run_query(store: str | Path, sql: str, max_rows: int = MAX_ROWS,
              timeout_s: float = TIME_LIMIT_S, max_bytes: int = MAX_BYTES
              ) -> tuple[pd.DataFrame, bool]:
    """Run a user's query read-only; return (at most ``max_rows`` rows, truncated?).

    SqlRefused (with the reason) for a query that is not one SELECT, fails, runs past
    ``timeout_s``, needs more memory than allowed or returns more than ``max_bytes``;
    db.StoreError for a store that cannot be read."""
    check_statement(sql)
    # deferred: pyarrow (large), only on the Arrow/Parquet path
    import pyarrow as pa
    args = [sys.executable, "-m", "storage.sql_box", str(store), str(int(max_rows)),
            repr(float(timeout_s)), str(int(max_bytes))]
    root = str(Path(__file__).resolve().parent.parent)   # the child imports storage from here
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    try:
        out, err = proc.communicate(sql.encode(), timeout=timeout_s + START_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise SqlRefused(f"the query ran longer than {timeout_s:g} s and was stopped") from None
    message = err.decode(errors="replace").strip().splitlines()
    last = message[-1] if message else ""
    if proc.returncode == UNREADABLE:
        raise db.StoreError(last)
    if proc.returncode in _ERRORS:
        raise _ERRORS[proc.returncode](last)
    if proc.returncode != 0:
        raise SqlRefused(f"the query ended without a result (exit status {proc.returncode}; most "
                         f"likely it needed more than the SQL box's {ADDRESS_SPACE / 2 ** 30:g} GiB "
                         f"of memory){': ' + last if last else ''}")
    table = pa.ipc.open_stream(out).read_all()
    return table.to_pandas(), json.loads(last)["truncated"]


def _serve(store: str, sql: str, max_rows: int, timeout_s: float, max_bytes: int) -> int:
    """The child's side: run ``sql`` under the limits, write the rows as Arrow IPC to stdout."""
    # deferred: pyarrow (large), only on the Arrow/Parquet path
    import pyarrow as pa
    try:
        # deferred: POSIX-only, and only where a query's memory is capped
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    except (ImportError, ValueError, OSError):  # not POSIX, or a lower hard limit already
        pass
    result: dict = {}
    try:
        with db.reading(store, own_instance=True) as con:  # its SETs are the instance's
            _lock_down(con, Path(store))

            def work() -> None:
                try:
                    result["batches"], result["truncated"] = _fetch(con, sql, max_rows, max_bytes)
                except Exception as exc:  # reported below, in the main thread
                    result["error"] = exc

            worker = threading.Thread(target=work, daemon=True)
            worker.start()
            worker.join(timeout_s)
            if worker.is_alive():
                con.interrupt()
                worker.join(5.0)
                return _refuse(f"the query ran longer than {timeout_s:g} s and was stopped")
    except db.StoreError as exc:
        print(str(exc).replace("\n", " "), file=sys.stderr)
        return UNREADABLE
    error = result.get("error")
    if isinstance(error, SqlRefused):
        return _refuse(str(error))
    if isinstance(error, (duckdb.OutOfMemoryException, MemoryError)):
        return _refuse(f"the query needed more memory than the SQL box allows ({MEMORY_LIMIT}): "
                       "aggregate less, or select fewer or shorter columns")
    if isinstance(error, duckdb.ParserException):
        return _refuse(str(error), SYNTAX)
    if isinstance(error, duckdb.Error):
        return _refuse(str(error), FAILED)
    if error is not None:
        raise error
    batches, schema = result["batches"]
    with pa.ipc.new_stream(sys.stdout.buffer, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    print(json.dumps({"truncated": result["truncated"]}), file=sys.stderr)
    return 0


def _lock_down(con: duckdb.DuckDBPyConnection, store: Path) -> None:
    """Limits, then no file access (but a Parquet store's own directory), then no more SETs."""
    con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
    con.execute(f"SET threads = {THREADS}")
    con.execute("SET temp_directory = ''")          # nothing spills to disk: the limit holds
    if store.is_dir():                              # views over the export's Parquet files
        allowed = (str(store.resolve()) + os.sep).replace("'", "''")
        con.execute(f"SET allowed_directories = ['{allowed}']")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _fetch(con, sql: str, max_rows: int, max_bytes: int):
    """((batches, schema), truncated): at most max_rows rows; SqlRefused past max_bytes."""
    # deferred: pyarrow (large), only on the Arrow/Parquet path
    import pyarrow as pa
    rel = con.sql(sql)
    if rel is None:  # a statement that ran instead of returning rows (never passes check_statement)
        raise SqlRefused("only SELECT queries are allowed here")
    reader = rel.to_arrow_reader(BATCH_ROWS)
    batches, rows, size = [], 0, 0
    for batch in reader:
        batch = batch.slice(0, max_rows + 1 - rows)
        batches.append(batch)
        rows += batch.num_rows
        size += batch.nbytes
        if size > max_bytes:
            raise SqlRefused(f"the result is larger than {max_bytes / 2 ** 20:g} MB (the SQL box's "
                             "limit): select fewer or shorter columns (e.g. left(text, 200)) or "
                             "add a LIMIT")
        if rows > max_rows:
            break
    table = pa.Table.from_batches(batches, reader.schema)
    truncated = table.num_rows > max_rows
    return (table.slice(0, max_rows).to_batches(), reader.schema), truncated


def _refuse(message: str, status: int = REFUSED) -> int:
    print(message.replace("\n", " "), file=sys.stderr)
    return status


_ERRORS = {REFUSED: SqlRefused, SYNTAX: SqlSyntaxError, FAILED: SqlFailed}


if __name__ == "__main__":
    _store, _rows, _timeout, _bytes = sys.argv[1:5]
    sys.exit(_serve(_store, sys.stdin.read(), int(_rows), float(_timeout), int(_bytes)))
