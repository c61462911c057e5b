"""Opening DuckDB files: the one place that calls ``duckdb.connect``.

Concurrency design. Measured: while one process holds a DuckDB file for writing, another process
cannot open it at all, not even read-only. So nobody holds the file for long:

* the trainer opens the file for each step's write transaction and closes it right after
  (open + write 16 x 256 tokens + close: ~50 ms), so between steps the file is free;
* readers (the app, exports) open read-only for each query batch and close at once (~1 ms
  attached to an instance kept open, ``_attached``);
* access is *fair*. Retrying on DuckDB's lock error alone starves readers of a trainer that
  writes back to back (measured: readers waited up to 3.6 s behind a continuous writer, because
  the writer re-took the file before a polling reader noticed it was free). So every open first
  takes two advisory ``flock`` locks: a *turnstile* (``KEY.turn``, exclusive, held only while
  queueing) and a readers-writer lock (``KEY.lock``, shared for readers, exclusive for the
  writer). Whoever holds the turnstile is next: a reader
  waiting behind a write gets in before the writer's next step, and a writer waiting behind
  readers keeps new readers out until it has written. Each side therefore waits at most one
  transaction of the other (tests/test_live_reading.py: two processes, a writer recording steps
  back to back and a reader every 100 ms, both sides' worst wait well under 1 s).
* DuckDB's own lock stays the last word: clients that skip the protocol (a plain ``duckdb``
  shell) are met with a short retry with backoff, and nobody waits more than ``LOCK_TIMEOUT_S``.
  Where the lock files cannot be created (a read-only directory, no ``fcntl``) the protocol is
  skipped and only that retry remains. ``flock`` locks die with their process, so a killed
  trainer never leaves the store locked.
* the lock files are *not* next to the store: stores live in the checkout (sample_runs/, runs/),
  and files created and touched there on every read woke every file watcher of the checkout
  (Streamlit's, an editor's). They live in ``lock_dir()`` (``$AGENTRL_LOCK_DIR``, else a private
  per-user directory in the temp dir), named ``KEY`` = a hash of the store's resolved path, so
  every process of the user that opens the same file -- by any relative path or symlink -- meets
  the same locks.

Per-step Parquet segments folded in at the end were the alternative; they would make every read
a union of the database and the segments and leave ``--db PATH`` incomplete until the fold, so
the open-per-transaction design was kept. A step is written in one transaction, so a reader sees
either the whole step or none of it, and a trainer killed mid-write leaves the previous steps
intact. Once a run ends the file is a plain DuckDB database (CONTRACTS.md).

A *directory* exported by ``python -m storage.io export --format parquet --partitioned`` can be
opened with ``reading`` too: it is served read-only as views over its Parquet files.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import os
import random
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import duckdb

from storage import lake
from storage.errors import StoreError  # noqa: F401  the name callers catch, db.StoreError

try:  # POSIX only; elsewhere the DuckDB retry alone arbitrates
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

LOCK_TIMEOUT_S = 10.0
POLL_S = 0.002          # how often a queued opener looks at the advisory locks
PARQUET_MARKER = "_store.json"  # present in a directory written by storage.io's partitioned export
LOCK_DIR_ENV = "AGENTRL_LOCK_DIR"


def _is_lock_error(exc: Exception) -> bool:
    msg = str(exc)
    return "lock" in msg.lower() and ("Conflicting" in msg or "Could not set lock" in msg)


# -- fair advisory locking ----------------------------------------------------------------------
def lock_dir() -> Path | None:
    """Where the advisory lock files live: ``$AGENTRL_LOCK_DIR``, else ``agentrl-locks-UID`` in
    the temp dir. None (protocol skipped) when it cannot be made or is not this user's own
    private directory: a directory another user prepared could hold links to plant our files."""
    chosen = os.environ.get(LOCK_DIR_ENV, "").strip()
    uid = os.getuid() if hasattr(os, "getuid") else 0
    base = Path(chosen) if chosen else Path(tempfile.gettempdir()) / f"agentrl-locks-{uid}"
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(base)
    except OSError:
        return None
    if chosen:
        return base
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or info.st_mode & 0o022:
        return None
    return base


def lock_paths(path: str | Path) -> tuple[Path, Path] | None:
    """(turnstile, readers-writer lock) files of the store at ``path``, or None without a lock
    directory. Keyed on the resolved path: ``runs/a.duckdb``, ``./runs/a.duckdb`` and a symlink
    to it share one pair."""
    base = lock_dir()
    if base is None:
        return None
    resolved = Path(os.path.realpath(path))
    key = hashlib.sha256(str(resolved).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    stem = f"{resolved.name[:40]}-{key}"
    return base / f"{stem}.turn", base / f"{stem}.lock"


def _open_lock_file(path: Path) -> int | None:
    if fcntl is None:
        return None
    for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):
        try:
            return os.open(path, flags, 0o644)
        except OSError:
            continue
    return None


def _flock(fd: int, kind: int, deadline: float, path: Path) -> None:
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise StoreError(f"{path} stayed locked by another process for "
                                 f"{LOCK_TIMEOUT_S:.0f} s") from None
            time.sleep(POLL_S)


@contextlib.contextmanager
def _turn(path: Path, exclusive: bool, deadline: float) -> Iterator[None]:
    """Hold the store's readers-writer lock, queueing fairly through its turnstile."""
    files = lock_paths(path)
    turn = _open_lock_file(files[0]) if files is not None else None
    rw = _open_lock_file(files[1]) if turn is not None else None
    if turn is None or rw is None:
        if turn is not None:
            os.close(turn)
        yield
        return
    try:
        _flock(turn, fcntl.LOCK_EX, deadline, path)
        try:
            _flock(rw, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, deadline, path)
        finally:
            fcntl.flock(turn, fcntl.LOCK_UN)
        yield
    finally:
        os.close(rw)  # closing the descriptor releases its flock
        os.close(turn)


# -- connections --------------------------------------------------------------------------------
def _connect_file(path: Path, read_only: bool, deadline: float, open_=None):
    """``duckdb.connect`` (or ``open_()``: the same open another way, an ATTACH), retried while
    DuckDB's own lock refuses it, its errors named."""
    delay = 0.005
    while True:
        try:
            return open_() if open_ is not None else duckdb.connect(str(path),
                                                                     read_only=read_only)
        except duckdb.IOException as exc:
            if _is_lock_error(exc) and time.monotonic() < deadline:
                time.sleep(delay + random.random() * delay)
                delay = min(delay * 2, 0.05)
                continue
            if _is_lock_error(exc):
                raise StoreError(f"{path} stayed locked by another process for "
                                 f"{LOCK_TIMEOUT_S:.0f} s") from exc
            if "newer version of duckdb" in str(exc).lower():
                raise StoreError(
                    f"{path} was written by a newer DuckDB than this project's "
                    f"{duckdb.__version__}, which cannot read its storage format. Convert it "
                    "with the DuckDB that wrote it: python tools/convert_store.py "
                    f"{path} NEW.duckdb (its docstring says how); the file was not "
                    "modified") from exc
            raise StoreError(f"cannot open {path}: not a readable DuckDB database ({exc})") from exc
        except duckdb.Error as exc:
            raise StoreError(f"cannot open {path} as a DuckDB database: {exc}") from exc


# A new DuckDB database instance costs ~11 ms to make and ~4 ms to close here, whatever the
# file (DuckDB 1.5.5, 2 cores; an in-memory one too): the price of every short-lived read, and
# a page's rerun makes a dozen. ATTACHing the file READ_ONLY to an instance that stays open
# costs ~1 ms, and holds and releases DuckDB's file lock as a read-only connection does (a
# writing process is refused while it is attached, let in once it is detached; measured). So
# ``reading`` attaches a store to an in-memory instance taken from a pool, under a name of its
# own, gives each reading a cursor whose default database it is (``USE``: the queries'
# unqualified names are the store's), and detaches it when the last reading of it ends.
# * One attachment per file at a time in a process, shared by the readings that overlap: DuckDB
#   locks a file with fcntl locks, which are the process's, so closing any second handle on the
#   file would drop the lock the first one holds (as one instance per file did before, through
#   DuckDB's own instance cache).
# * One store per instance: what is attached is visible to every cursor of the instance
#   (``information_schema`` lists it), so another store takes another instance.
# * A reading must not change settings (``SET``): they are the instance's and would outlive it.
#   ``reading(..., own_instance=True)`` gives a caller that does an instance of its own.
# * An instance spills to a private temp directory (a file connection spilled next to its file).
# * Idle instances are closed before a fork (a forked child that exited normally crashed in a
#   parent's instance's destructor) and at exit, before the interpreter's teardown.
MAX_IDLE_INSTANCES = 4
_idle: list[duckdb.DuckDBPyConnection] = []
_shared: dict[str, "_Attachment"] = {}
_pool_lock = threading.Lock()      # _idle and _shared (each attachment has a lock of its own)
_names = itertools.count()


class _Attachment:
    """A store attached to an instance of the pool, and the readings using it."""
    __slots__ = ("key", "base", "name", "users", "lock")

    def __init__(self, key: str):
        self.key, self.base, self.name, self.users = key, None, None, 0
        self.lock = threading.Lock()   # held while it is attached or detached


def _spill_dir() -> str:
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return str(Path(tempfile.gettempdir()) / f"agentrl-duckdb-spill-{uid}")


def _instance() -> duckdb.DuckDBPyConnection:
    with _pool_lock:
        if _idle:
            return _idle.pop()
    return duckdb.connect(":memory:", config={"temp_directory": _spill_dir()})


def _put_back(base: duckdb.DuckDBPyConnection) -> None:
    with _pool_lock:
        if len(_idle) < MAX_IDLE_INSTANCES:
            _idle.append(base)
            return
    base.close()


def _close_idle() -> None:
    with _pool_lock:
        idle, _idle[:] = list(_idle), []
    for base in idle:
        base.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_close_idle)
atexit.register(_close_idle)


def _release(base: duckdb.DuckDBPyConnection, name: str) -> None:
    """Detach ``name`` from ``base`` if attached, and put ``base`` back in the pool; closed
    (which detaches everything) if the DETACH failed."""
    try:
        base.execute(f"DETACH DATABASE IF EXISTS {name}")
    except BaseException:
        base.close()
        raise
    _put_back(base)


def _detach(entry: _Attachment) -> None:
    """Detach ``entry``'s store (call with ``entry.lock``)."""
    base, name = entry.base, entry.name
    entry.base = entry.name = None
    _release(base, name)


def _attach(entry: _Attachment, path: Path, deadline: float) -> None:
    """Attach ``path`` read-only to an instance of the pool (call with ``entry.lock``)."""
    base, name = _instance(), f"store_{next(_names)}"
    quoted = str(path).replace("'", "''")
    try:
        _connect_file(path, True, deadline,
                      lambda: base.execute(f"ATTACH '{quoted}' AS {name} (READ_ONLY)"))
    except BaseException:
        _release(base, name)           # an interrupt may land after the ATTACH took effect
        raise
    entry.base, entry.name = base, name


def _leave(entry: _Attachment) -> None:
    with _pool_lock:
        entry.users -= 1
        if entry.users:
            return
    with entry.lock:
        with _pool_lock:
            last = entry.users == 0
        if last and entry.base is not None:
            _detach(entry)
    with _pool_lock:
        if entry.users == 0 and entry.base is None and _shared.get(entry.key) is entry:
            del _shared[entry.key]


@contextlib.contextmanager
def _attached(path: Path, deadline: float) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor whose default database is ``path``, attached read-only (see above)."""
    key = os.path.realpath(path)
    with _pool_lock:
        entry = _shared.get(key)
        if entry is None:
            entry = _shared[key] = _Attachment(key)
        entry.users += 1
    try:
        with entry.lock:
            if entry.base is None:
                _attach(entry, path, deadline)
            cur = entry.base.cursor()
        try:
            cur.execute(f"USE {entry.name}")
            yield cur
        finally:
            cur.close()
    finally:
        _leave(entry)


def connect(path: str | Path | None, read_only: bool = False,
            timeout_s: float = LOCK_TIMEOUT_S) -> duckdb.DuckDBPyConnection:
    """Open ``path`` (None or ':memory:' -> in-memory), retrying while another process holds it.

    Prefer ``reading``/``writing``: they also take the fair advisory lock for as long as the
    connection is open. A bare ``connect`` only retries on DuckDB's own lock.
    """
    if path is None or str(path) == ":memory:":
        return duckdb.connect(":memory:")
    path = Path(path)
    if read_only and not path.exists():
        raise StoreError(f"no database at {path}")
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a DuckDB database file")
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    return _connect_file(path, read_only, time.monotonic() + timeout_s)


@contextlib.contextmanager
def reading(path: str | Path, timeout_s: float = LOCK_TIMEOUT_S, own_instance: bool = False
            ) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived read-only connection (readers never block the trainer for long). A file
    store is attached to a pooled instance (see ``_attached``); ``own_instance``: a DuckDB
    instance of its own instead, for a caller that changes instance-wide settings (``SET``)."""
    path = Path(path)
    if lake.is_lake(path):
        with _lake_turn(path, False, timeout_s), lake.reading(path) as con:
            yield con
        return
    if path.is_dir():
        con = _parquet_store(path)
        try:
            yield con
        finally:
            con.close()
        return
    if not path.exists():
        raise StoreError(f"no database at {path}")
    deadline = time.monotonic() + timeout_s
    with _turn(path, exclusive=False, deadline=deadline):
        if own_instance:
            con = _connect_file(path, True, deadline)
            try:
                yield con
            finally:
                con.close()
            return
        with _attached(path, deadline) as con:
            yield con


@contextlib.contextmanager
def writing(path: str | Path | None, timeout_s: float = LOCK_TIMEOUT_S
            ) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived read-write connection whose statements form one transaction."""
    if path is None or str(path) == ":memory:":
        raise StoreError("an in-memory store cannot be reopened; keep its connection instead")
    path = Path(path)
    if lake.is_lake(path):
        with _lake_turn(path, True, timeout_s), lake.writing(path) as con:
            yield con
        return
    if path.is_dir():
        raise StoreError(f"{path} is a directory (a Parquet export is read-only)")
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with _turn(path, exclusive=True, deadline=deadline):
        con = _connect_file(path, False, deadline)
        try:
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
                con.execute("COMMIT")
            except BaseException:
                try:
                    con.execute("ROLLBACK")
                except duckdb.Error:  # a failed COMMIT (disk full) already ended it: keep its error
                    pass
                raise
        finally:
            con.close()


def _lake_turn(path: Path, exclusive: bool, timeout_s: float):
    """A team store on a SQLite catalog takes turns as a file does (this module's readers-writer
    lock, on the store's directory): SQLite takes one writer, and a commit that met a reader's
    open transaction failed and left its process holding the catalog's lock until it exited,
    every other process locked out meanwhile. A PostgreSQL catalog takes everyone at once."""
    if lake.shares_threads(path):
        return contextlib.nullcontext()
    return _turn(path, exclusive=exclusive, deadline=time.monotonic() + timeout_s)


ATTEMPTS = 40           # transactions a writer runs before a lost commit is its error


class _Attempt:
    """One try of a write transaction (``attempts``)."""

    def __init__(self, path, timeout_s: float, last: bool):
        self.path, self.timeout_s, self.last = path, timeout_s, last
        self.done = False

    def __enter__(self) -> duckdb.DuckDBPyConnection:
        self._cm = writing(self.path, self.timeout_s)
        return self._cm.__enter__()

    def __exit__(self, kind, exc, tb) -> bool:
        try:
            suppressed = self._cm.__exit__(kind, exc, tb)
        except lake.Conflict:
            if self.last:
                raise
            return True                      # rolled back: the caller's loop runs it again
        if kind is None:
            self.done = True
        elif (isinstance(exc, duckdb.Error) and lake.lost_race(exc) and not self.last
              and lake.is_lake(self.path)):
            return True                      # a statement met another writer's commit
        return bool(suppressed)


def attempts(path: str | Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[_Attempt]:
    """A write transaction that is run again when a team store refuses its commit for a
    conflict with another writer's (storage/lake.py ``Conflict``; nothing of it was written)::

        for attempt in db.attempts(path):
            with attempt as con:
                ...  # writes only: values are computed before the loop

    A file store's transaction runs once (its writers take turns, so it never conflicts). The
    waits between tries grow from 10 ms, with jitter so that two writers that met do not meet
    again; after ``ATTEMPTS`` the conflict is the caller's error."""
    tries = ATTEMPTS if lake.is_lake(path) else 1
    wait = 0.01
    for i in range(tries):
        attempt = _Attempt(path, timeout_s, last=i == tries - 1)
        yield attempt
        if attempt.done:
            return
        time.sleep(wait * (0.5 + random.random()))
        wait = min(wait * 1.6, 1.0)


def _parquet_store(root: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory connection with one read-only view per table of a partitioned export."""
    if not (root / PARQUET_MARKER).exists():
        raise StoreError(f"{root} is a directory but not a Parquet export of a store "
                         f"(no {PARQUET_MARKER})")
    con = duckdb.connect(":memory:")
    try:
        for schema_file in sorted((root / "_schema").glob("*.parquet")):
            table = schema_file.stem
            parts = root / table
            if any(parts.rglob("*.parquet")):
                glob = str(parts / "**" / "*.parquet").replace("'", "''")
                source = (f"read_parquet('{glob}', hive_partitioning = true, "
                          "union_by_name = true)")
            else:
                source = f"read_parquet('{str(schema_file).replace(chr(39), chr(39) * 2)}')"
            # Partition keys come back as strings/BIGINT from the directory names: restore types.
            cols = con.execute("DESCRIBE SELECT * FROM read_parquet(?)",
                               [str(schema_file)]).fetchall()
            select = ", ".join(f'CAST("{c[0]}" AS {c[1]}) AS "{c[0]}"' for c in cols)
            con.execute(f'CREATE VIEW "{table}" AS SELECT {select} FROM {source}')
    except duckdb.Error as exc:
        con.close()
        raise StoreError(f"cannot read the Parquet export at {root}: {exc}") from exc
    return con
