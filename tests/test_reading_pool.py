"""storage/db.py ``reading``: a file store attached to a pooled in-memory DuckDB instance keeps
the guarantees a read-only connection of its own gave: DuckDB's file lock is held for as long as
any reading of the file is open in the process (a writer that skips the advisory locks is
refused), released when the last one ends, even after an error or an interrupt between the
ATTACH and the first query; a reading sees its own store only; a forked child exits cleanly."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import duckdb
import pytest

from storage import db

PLAIN_WRITER = ("import duckdb, sys; c = duckdb.connect(sys.argv[1]); "
                "c.execute('CREATE TABLE IF NOT EXISTS zz (a INTEGER)'); c.close()")


def plain_write(path) -> str:
    """A writer in another process that skips the advisory locks: 'ok' or DuckDB's refusal."""
    done = subprocess.run([sys.executable, "-c", PLAIN_WRITER, str(path)], capture_output=True,
                          text=True, timeout=60)
    return "ok" if done.returncode == 0 else done.stderr.strip().splitlines()[-1]


def make(path, rows: int = 100) -> str:
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE runs AS SELECT range AS i FROM range(?)", [rows])
    con.close()
    return str(path)


def attached_anywhere() -> list[str]:
    """Stores attached to the pool's idle instances (none should be)."""
    return [name for base in db._idle for (name,) in base.execute(
        "SELECT database_name FROM duckdb_databases() WHERE NOT internal "
        "AND database_name <> 'memory'").fetchall()]


def test_the_lock_is_held_while_any_reading_of_the_file_is_open(tmp_path):
    a, b = make(tmp_path / "a.duckdb"), make(tmp_path / "b.duckdb")
    with db.reading(a) as outer:
        assert "Could not set lock" in plain_write(a)
        with db.reading(a) as inner:          # the same file: the same attachment
            assert inner.execute("SELECT count(*) FROM runs").fetchone() == (100,)
        assert "Could not set lock" in plain_write(a)   # still held after the inner one
        with db.reading(b) as other:          # another store: another instance, its own only
            assert other.execute("SELECT current_database()").fetchone()[0] != \
                outer.execute("SELECT current_database()").fetchone()[0]
            tables = other.execute("SELECT count(*) FROM information_schema.tables "
                                   "WHERE table_name = 'runs'").fetchone()[0]
            assert tables == 1
        assert outer.execute("SELECT count(*) FROM runs").fetchone() == (100,)
    assert plain_write(a) == "ok"
    assert attached_anywhere() == []


def test_an_error_or_an_interrupt_after_the_attach_leaves_nothing_attached(tmp_path, monkeypatch):
    a = make(tmp_path / "a.duckdb")
    with pytest.raises(duckdb.CatalogException):
        with db.reading(a) as con:
            con.execute("SELECT * FROM no_such_table")
    assert plain_write(a) == "ok"
    real = db._connect_file

    def interrupted(path, read_only, deadline, open_=None):
        real(path, read_only, deadline, open_)   # the ATTACH happens, then Ctrl-C lands
        raise KeyboardInterrupt

    monkeypatch.setattr(db, "_connect_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with db.reading(a):
            pass
    monkeypatch.setattr(db, "_connect_file", real)
    assert attached_anywhere() == [] and db._shared == {}
    assert plain_write(a) == "ok"
    with db.reading(a) as con:                  # and the next reading works
        assert con.execute("SELECT count(*) FROM zz").fetchone() == (0,)


def test_threads_reading_at_once_leave_the_pool_clean(tmp_path):
    stores = [make(tmp_path / f"s{i}.duckdb", 50 * (i + 1)) for i in range(3)]
    errors: list[BaseException] = []

    def reader(k: int) -> None:
        try:
            for j in range(20):
                path = stores[(k + j) % 3]
                with db.reading(path) as con:
                    n = con.execute("SELECT count(*) FROM runs").fetchone()[0]
                    assert n == 50 * (stores.index(path) + 1)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(6)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == []
    assert db._shared == {} and attached_anywhere() == []
    assert len(db._idle) <= db.MAX_IDLE_INSTANCES
    assert [plain_write(p) for p in stores] == ["ok"] * 3


FORK = """
import os, sys
sys.path.insert(0, sys.argv[3])
from storage import db
a, b = sys.argv[1], sys.argv[2]
with db.reading(a), db.reading(b):       # two instances made, then idle in the pool
    pass
pid = os.fork()
if pid == 0:                              # the child (which leaves DuckDB alone) exits normally
    sys.exit(0)
_, status = os.waitpid(pid, 0)
print("child", status)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_forked_child_exits_cleanly(tmp_path):
    """A forked child that exited normally ran the destructors of the parent's idle instances and
    crashed (SIGSEGV): the pool's idle instances are closed before a fork. (DuckDB 1.5.5 itself
    aborts a forked child that uses DuckDB and exits normally, with or without the pool.)"""
    a, b = make(tmp_path / "a.duckdb"), make(tmp_path / "b.duckdb")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", FORK, a, b, root], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "child 0", done.stdout + done.stderr
