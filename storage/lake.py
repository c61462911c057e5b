"""The team store: a directory on DuckLake that many processes write at once.

A store is a path. A DuckDB file is the embedded store (storage/db.py: one writer at a time,
taken in turns). A directory holding ``MARKER`` is a team store: a DuckLake catalog (a SQLite
file inside the directory, or a PostgreSQL database that several machines reach) and the Parquet
files it points to (``data/`` inside the directory unless ``--data-path`` names another place,
an object store's URL included where DuckDB can reach it). DuckLake gives each commit a snapshot
of its own: readers never wait for a writer, and two writers that append at once both land (the
one that lost the race is retried against the new snapshot by DuckLake itself, up to
``RETRIES`` times; only a logical conflict, two deletes from one data file, fails, and its error
names the store).

Why attach once per process: attaching costs 130-370 ms (the catalog read), while a query on an
attached lake costs milliseconds. So each process keeps one in-memory DuckDB connection per team
store, attached on first use, and every read or write is a cursor of it (a transaction of its
own, seeing the latest committed snapshot). A forked child attaches again.

The DuckLake, SQLite and PostgreSQL extensions come from their PyPI wheels (pinned in
constraints.txt beside DuckDB, whose version they must equal) and are loaded from those files:
nothing is downloaded when a store opens.

What differs from a file, and why it does not matter here: DuckLake keeps no PRIMARY KEY, so
storage/migrations.py leaves the key out of a lake's tables (every writer checks a run id before
it inserts one); each commit writes Parquet files of its own, so whoever appends often folds
them (``fold``) on a schedule.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Iterator

import duckdb

from storage.errors import StoreError

MARKER = "_lake.json"
ALIAS = "store"
EXTENSIONS = ("ducklake", "sqlite_scanner", "postgres_scanner")
CATALOG_FILE = "catalog.sqlite"
DATA_DIR = "data"
RETRIES = 30             # DuckLake's own commit retries (default 10): several writers at once
RETRY_WAIT_MS = 20       # the first retry's wait, growing by RETRY_BACKOFF
RETRY_BACKOFF = 1.5
OPEN_TRIES = 50          # opens of a cursor while a SQLite catalog is locked by a commit
ORPHAN_AGE_S = 3600         # a file no snapshot names, this old, was left by a killed writer
UNNEEDED_AGE_S = 3600       # a file no live snapshot needs is deleted this long after it stopped
FOLD_EVERY_S = 300.0     # how often a receiver or follow folds a team store's files
FOLD_TRIES = 20          # a fold that loses to writers' commits is run again
POSTGRES_RE = re.compile(r"^postgres:[\w=. /:@-]{1,400}$")

_lock = threading.Lock()
_open: dict[tuple[int, str], duckdb.DuckDBPyConnection] = {}
_turns: dict[str, threading.RLock] = {}
_markers: dict[tuple, dict] = {}
MARKER_MAX_BYTES = 64_000


class LakeError(StoreError):
    """A team store that cannot be made, opened or written, with the store named."""


class Conflict(LakeError):
    """A commit that lost to another writer's conflicting one (DuckLake's own retries did not
    settle it: a delete from a table another transaction inserted into). Nothing of it was
    written; the writer may run the transaction again (storage/db.py ``attempts``)."""


def is_lake(path: str | Path) -> bool:
    """Whether ``path`` is a team store (a directory holding ``MARKER``)."""
    p = Path(path)
    return p.is_dir() and (p / MARKER).is_file()


def catalog_of(spec: str, root: Path) -> str:
    """The DuckLake catalog connection for ``--catalog SPEC``: ``sqlite`` is a file inside the
    store; ``postgres:<libpq key=value pairs>`` is a PostgreSQL database."""
    if spec == "sqlite":
        return f"sqlite:{(root / CATALOG_FILE).resolve()}"
    if POSTGRES_RE.match(spec):
        return spec
    raise LakeError(f"--catalog {spec!r}: expected 'sqlite' or 'postgres:dbname=NAME host=HOST "
                    "port=PORT [user=USER]'")


def marker(path: str | Path) -> dict:
    """The store's description (catalog connection and data path), checked; read again only
    when the marker file changed (every read and write asks for it)."""
    root = Path(path)
    file = root / MARKER
    try:
        st = file.stat()
        if st.st_size > MARKER_MAX_BYTES:
            raise ValueError(f"{st.st_size} bytes, more than {MARKER_MAX_BYTES}")
        key = (str(file), st.st_size, st.st_mtime_ns)
        if key in _markers:
            return _markers[key]
        with open(file, encoding="utf-8") as f:
            desc = json.loads(f.read(MARKER_MAX_BYTES + 1))
        catalog, data = desc["catalog"], desc["data_path"]
        if not (isinstance(catalog, str) and isinstance(data, str)):
            raise ValueError("catalog and data_path must be text")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LakeError(f"{file} does not describe a team store: {exc}") from exc
    if not (catalog.startswith("sqlite:") or POSTGRES_RE.match(catalog)):
        raise LakeError(f"{file} names a catalog this project does not open "
                        f"({shown(catalog)[:80]!r}): a SQLite file or a PostgreSQL database")
    if catalog.startswith("sqlite:") and not Path(catalog[7:]).is_absolute():
        catalog = f"sqlite:{(root / catalog[7:]).resolve()}"
    if "://" not in data and not Path(data).is_absolute():
        data = str((root / data).resolve())
    _markers[key] = out = {"catalog": catalog, "data_path": data}
    return out


def _extension_file(name: str) -> Path:
    spec = importlib.util.find_spec(f"duckdb_extension_{name}")
    version = duckdb.__version__
    if spec is None or not spec.submodule_search_locations:
        raise LakeError(f"the DuckDB extension {name} is not installed: pip install "
                        f"duckdb-extension-{name.replace('_', '-')}=={version} (make setup)")
    file = (Path(list(spec.submodule_search_locations)[0]) / "extensions" / f"v{version}"
            / f"{name}.duckdb_extension")
    if not file.is_file():
        raise LakeError(f"the installed duckdb-extension-{name.replace('_', '-')} is not built "
                        f"for DuckDB {version} (no {file.name} for v{version}): install the "
                        "version constraints.txt pins")
    return file


def attach(root: Path, desc: dict) -> duckdb.DuckDBPyConnection:
    """A new connection with the extensions loaded and the store attached as ``ALIAS``."""
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False})
    try:
        con.execute("SET enable_progress_bar = false")    # no bar drawn on a terminal by a copy
        for name in EXTENSIONS:
            con.execute(f"LOAD '{_quoted(str(_extension_file(name)))}'")
        con.execute(f"SET ducklake_max_retry_count = {RETRIES}")
        con.execute(f"SET ducklake_retry_wait_ms = {RETRY_WAIT_MS}")
        con.execute(f"SET ducklake_retry_backoff = {RETRY_BACKOFF}")
        data = desc["data_path"].rstrip("/") + "/"
        # no rows inlined into the catalog: a delete of inlined rows conflicts with every
        # concurrent insert into the table (measured: 8 of 20 steps of each of 3 trainers lost)
        con.execute(f"ATTACH '{_quoted('ducklake:' + desc['catalog'])}' AS {ALIAS} "
                    f"(DATA_PATH '{_quoted(data)}', DATA_INLINING_ROW_LIMIT 0)")
        con.execute(f"USE {ALIAS}")
    except duckdb.Error as exc:
        con.close()
        raise LakeError(f"cannot open the team store {root} (catalog "
                        f"{shown(desc['catalog'])}): {exc}") from exc
    except LakeError:
        con.close()
        raise
    return con


def connection(path: str | Path) -> duckdb.DuckDBPyConnection:
    """This process's connection to the team store at ``path``, attached on first use."""
    root = Path(path).resolve()
    key = (os.getpid(), str(root))
    with _lock:
        con = _open.get(key)
        if con is None:
            desc = marker(root)
            if desc["catalog"].startswith("sqlite:") and not Path(desc["catalog"][7:]).is_file():
                raise LakeError(f"the team store {root} has lost its catalog "
                                f"({desc['catalog'][7:]} is missing): its runs cannot be read. "
                                "Restore the file from a backup; nothing was written")
            con = _open[key] = attach(root, desc)
        return con


def shares_threads(path: str | Path) -> bool:
    """Whether several threads of a process may use the store at once: yes on a PostgreSQL
    catalog; on a SQLite catalog one block at a time (``_turn``)."""
    return not marker(path)["catalog"].startswith("sqlite:")


@contextlib.contextmanager
def _turn(path) -> Iterator[None]:
    """On a SQLite catalog, one reading or writing block of this process at a time: a thread
    writing while another thread's cursor read the same catalog deadlocked inside DuckDB
    (measured: two writer threads and a reader stuck for good; readers alone, or writers in
    separate processes, are fine). A PostgreSQL catalog takes threads at once."""
    if shares_threads(path):
        yield
        return
    key = str(Path(path).resolve())
    with _lock:
        lock = _turns.setdefault(key, threading.RLock())
    with lock:
        yield


def forget(path: str | Path) -> None:
    """Detach the store from this process (a test removing it, a store that moved)."""
    root = Path(path).resolve()
    with _lock:
        con = _open.pop((os.getpid(), str(root)), None)
    if con is not None:
        con.close()


def _begin(cur, path, what: str) -> None:
    """Point a new cursor at the store (and open its transaction), again while a SQLite
    catalog is locked by another process's commit (reading its latest snapshot needs it)."""
    for attempt in range(OPEN_TRIES):
        try:
            cur.execute(f"USE {ALIAS}")
            if what == "BEGIN":
                cur.execute("BEGIN TRANSACTION")
                cur.execute(f"SELECT 1 FROM {ALIAS}._migrations LIMIT 0")  # the snapshot, now
            return
        except duckdb.Error as exc:
            with contextlib.suppress(duckdb.Error):
                cur.execute("ROLLBACK")
            if not lost_race(exc) or attempt == OPEN_TRIES - 1:
                raise LakeError(f"cannot open the team store {path}: {exc}") from exc
            time.sleep(0.02 * (attempt + 1))


@contextlib.contextmanager
def reading(path: str | Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor on the latest snapshot: never waits for a writer."""
    with _turn(path):
        cur = connection(path).cursor()
        try:
            _begin(cur, path, "USE")
            yield cur
        finally:
            cur.close()


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor whose statements commit as one snapshot (DuckLake retries a lost race)."""
    with _turn(path):
        cur = connection(path).cursor()
        try:
            _begin(cur, path, "BEGIN")
            try:
                yield cur
                try:
                    cur.execute("COMMIT")
                except duckdb.Error as exc:
                    kind = Conflict if lost_race(exc) else LakeError
                    raise kind(f"the team store {path} refused a commit: {exc}") from exc
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    cur.execute("ROLLBACK")
                raise
        finally:
            cur.close()


def snapshot(path: str | Path) -> int:
    """The store's latest snapshot id: every commit makes a new one, so a page caches what it
    read by it (what a file's size and modification time are to a file)."""
    with reading(path) as cur:
        try:
            return int(cur.execute(f"SELECT max(snapshot_id) FROM ducklake_snapshots('{ALIAS}')"
                                   ).fetchone()[0])
        except duckdb.Error as exc:
            raise LakeError(f"cannot read the snapshots of the team store {path}: {exc}") from exc


def fold(path: str | Path) -> dict:
    """Fold the small Parquet files that frequent appends leave (one per commit) into larger
    ones; delete the files no snapshot needs any more once ``UNNEEDED_AGE_S`` have passed, and
    those a killed writer left (no snapshot names them; over ``ORPHAN_AGE_S`` old, so a
    transaction still writing keeps its own). Returns the data file count before and after.

    Why the wait: a reader or writer whose transaction began at an earlier snapshot still scans
    the unneeded files; deleted at once, its next read failed with 'Cannot open file'. DuckLake
    1.5.5 keeps to the wait on a PostgreSQL catalog only. On a SQLite one it deletes them at the
    first fold (a dry run lists a file scheduled 0.1 s before for any bound up to 23 h back),
    where a reader's open transaction holds the catalog's lock, so no commit can pass it."""
    cur = connection(path).cursor()
    try:
        before = _file_count(cur)
        for step in (f"CALL ducklake_merge_adjacent_files('{ALIAS}')",
                     f"CALL ducklake_expire_snapshots('{ALIAS}', older_than => now())",
                     f"CALL ducklake_cleanup_old_files('{ALIAS}', older_than => now() - "
                     f"INTERVAL {UNNEEDED_AGE_S} SECOND)",
                     f"CALL ducklake_delete_orphaned_files('{ALIAS}', older_than => now() - "
                     f"INTERVAL {ORPHAN_AGE_S} SECOND)"):
            for attempt in range(FOLD_TRIES):    # a writer's commit came first: fold again
                try:
                    cur.execute(step)
                    break
                except duckdb.Error as exc:
                    if not lost_race(exc) or attempt == FOLD_TRIES - 1:
                        raise
                    time.sleep(0.05 * (attempt + 1))
        return {"files_before": before, "files_after": _file_count(cur)}
    except duckdb.Error as exc:
        raise LakeError(f"folding the files of the team store {path} failed: {exc}") from exc
    finally:
        cur.close()


class FoldSchedule:
    """For whoever appends often (the OTLP receiver, ``follow``): ``tick()`` in its loop folds
    a team store's files every ``every_s`` seconds (a no-op on a file store). A fold that fails
    is logged and tried at the next turn: the appends matter more than the file count."""

    def __init__(self, path, log=None, every_s: float = FOLD_EVERY_S):
        self.path, self.every_s = path, every_s
        self.log = log or (lambda m: None)
        self.on = is_lake(path)
        self.last = time.monotonic()

    def tick(self) -> None:
        if not self.on or time.monotonic() - self.last < self.every_s:
            return
        self.last = time.monotonic()
        try:
            counts = fold(self.path)
            self.log(f"folded the team store's files: {counts['files_before']} -> "
                     f"{counts['files_after']}")
        except LakeError as exc:
            self.log(f"warning: {exc}")


def _file_count(cur) -> int:
    return int(cur.execute(f"SELECT coalesce(sum(file_count), 0) "
                           f"FROM ducklake_table_info('{ALIAS}')").fetchone()[0])


def cursor(con):
    """A cursor of ``con`` pointed at the same store (a new cursor starts in DuckDB's in-memory
    database, not in the team store its connection uses)."""
    cur = con.cursor()
    if is_lake_connection(con):
        cur.execute(f"USE {ALIAS}")
    return cur


def is_lake_connection(con) -> bool:
    """Whether ``con``'s current database is a DuckLake one (migrations leave keys out)."""
    row = con.execute("SELECT type FROM duckdb_databases() "
                      "WHERE database_name = current_database()").fetchone()
    return bool(row) and row[0] == "ducklake"


def lost_race(exc: Exception) -> bool:
    """A commit refused because another writer's came first: DuckLake's transaction conflict,
    or a SQLite catalog locked by another writer's commit. An error about the data (a value
    that does not convert, a missing table) is not one, whatever its text says."""
    if isinstance(exc, (duckdb.ConversionException, duckdb.ConstraintException,
                        duckdb.BinderException, duckdb.ParserException,
                        duckdb.CatalogException, duckdb.InvalidInputException,
                        duckdb.OutOfRangeException, duckdb.TypeMismatchException)):
        return False
    text = str(exc).lower()
    return "transaction conflict" in text or "database is locked" in text


def _quoted(text: str) -> str:
    return text.replace("'", "''")


def shown(catalog: str) -> str:
    """A catalog connection without its password."""
    return re.sub(r"password=\S+", "password=***", catalog)
