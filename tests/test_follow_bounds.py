"""`storage.io follow` stays small whatever the followed files hold (a huge unfinished line, a
sparse gigabyte, a too-long line between good ones) and never opens a file through a link out of
the directory: real follower processes, their peak memory and bytes read taken from /proc."""
from __future__ import annotations

import json
import os
import time

import pytest

from tests.test_follow import count, query, start, stop, wait_for
from tests.test_follow_identity import records

MIB = 1 << 20
pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc")


def peak_mib(proc) -> float:
    """The process's peak resident memory so far (VmHWM)."""
    with open(f"/proc/{proc.pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    return kb / 1024


def bytes_read(proc) -> int:
    with open(f"/proc/{proc.pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


def settled(proc, db) -> float:
    """Peak memory once the follower has started and created the store."""
    wait_for(lambda: db.exists())
    time.sleep(1)
    return peak_mib(proc)


def test_an_unfinished_huge_line_is_neither_held_nor_read_again(tmp_path):
    logs, db = tmp_path / "agent", tmp_path / "s.duckdb"
    logs.mkdir()
    log = logs / "episodes.jsonl"
    log.write_text(records(["a0"]))
    proc = start(logs, db, "jsonl", "--max-line-bytes", str(MIB))
    try:
        wait_for(lambda: count(db) == 1)
        base = settled(proc, db)
        with open(log, "ab") as f:  # 64 MiB of one line, no newline yet
            f.write(b'{"traj_id": "huge", "prompt": "')
            for _ in range(64):
                f.write(b"x" * MIB)
        time.sleep(1.5)
        read = bytes_read(proc)
        time.sleep(2)  # ten polls of an unchanged unfinished line
        assert bytes_read(proc) - read < MIB  # not read again
        assert peak_mib(proc) - base < 16  # never held (was: +64 MiB on each poll)
        with open(log, "ab") as f:  # the line ends; a good one follows
            f.write(b'"}\n' + records(["a1"]).encode())
        wait_for(lambda: count(db) == 2)
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert out.count(f"the line at byte {len(records(['a0']))} is longer than the limit") == 1
    assert "line longer than the limit of 1048576 bytes (--max-line-bytes)" in out
    assert query(db, "SELECT sum(failed), sum(imported) FROM imports") == [(1, 2)]


def test_a_sparse_gigabyte_file_is_not_held_or_copied(tmp_path, monkeypatch):
    logs, db = tmp_path / "agent", tmp_path / "s.duckdb"
    logs.mkdir()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    log = logs / "episodes.jsonl"
    log.touch()
    from storage.db import LOCK_DIR_ENV, lock_dir
    monkeypatch.setenv(LOCK_DIR_ENV, str(lock_dir()))  # the locks stay where this test's are
    monkeypatch.setenv("TMPDIR", str(scratch))  # where a copy of the file would go
    proc = start(logs, db, "jsonl", "--max-line-bytes", str(MIB))
    try:
        base = settled(proc, db)
        os.truncate(log, 1 << 30)  # 1 GiB of NUL bytes, no disk used
        with open(log, "ab") as f:
            f.write(b"\n" + records(["after"]).encode())
        wait_for(lambda: count(db) == 1, timeout=60)
        # was 1.2 GB; what remains is the store's first write (DuckDB 1.5.5: 22 MiB, 2.0: under
        # 16), far below the 1,024 MiB the file would cost held or copied
        assert peak_mib(proc) - base < 64
        assert not any(scratch.rglob("*")), list(scratch.rglob("*"))
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert "byte 0: line longer than the limit" in out


def test_a_too_long_line_fails_alone_between_good_ones(tmp_path):
    logs, db = tmp_path / "agent", tmp_path / "s.duckdb"
    logs.mkdir()
    long_line = json.dumps({"traj_id": "long", "task_id": "q", "prompt": "p" * (2 * MIB),
                            "turns": [], "reward": 0.0}) + "\n"
    (logs / "e.jsonl").write_text(records(["a0"]) + long_line + records(["a1"]))
    proc = start(logs, db, "jsonl", "--max-line-bytes", str(MIB))
    try:
        wait_for(lambda: count(db) == 2)
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    at = len(records(["a0"]))
    assert f"e.jsonl: byte {at}: line longer than the limit of 1048576 bytes" in out
    assert query(db, "SELECT lines, imported, failed FROM imports") == [(3, 2, 1)]


@pytest.mark.parametrize("fmt", ["jsonl", "verl"])
def test_a_link_out_of_the_directory_is_never_opened(tmp_path, fmt):
    logs, db, secrets = tmp_path / "agent", tmp_path / "s.duckdb", tmp_path / "secrets"
    logs.mkdir()
    secrets.mkdir()
    line = (records(["secret"]) if fmt == "jsonl" else json.dumps(
        {"input": "the key is hunter2", "output": "x", "score": 1.0}) + "\n")
    (secrets / "1.jsonl").write_text(line)
    (logs / "1.jsonl").symlink_to(secrets / "1.jsonl")
    good = records(["good"]) if fmt == "jsonl" else json.dumps(
        {"input": "q", "output": "a", "score": 0.0}) + "\n"
    (logs / "2.jsonl").write_text(good)
    (logs / "3.jsonl").symlink_to(logs / "2.jsonl")  # a link inside the directory is followed
    proc = start(logs, db, fmt)
    try:
        wait_for(lambda: query(db, "SELECT count(*) FROM imports") == [(2,)])
        time.sleep(1)
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert out.count("1.jsonl: links outside the followed directory: never opened") == 1
    assert "hunter2" not in str(query(db, "SELECT prompt FROM trajectories"))
    assert "secret" not in str(query(db, "SELECT traj_id FROM trajectories"))
    assert count(db) == (1 if fmt == "jsonl" else 2)
