"""`storage.io follow` meets files that are replaced, rewritten, deleted with their directory,
and a store deleted under it: real follower processes, files changed the ways writers and
logrotate change them."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from tests.test_follow import ROOT, count, query, start, stop, verl_line, wait_for


def records(ids: list[str]) -> str:
    """Lines of equal length for equal-length ids (a rewrite can keep the file's size)."""
    return "".join(json.dumps({"traj_id": i, "task_id": "q", "prompt": "task",
                               "turns": [{"action": "act", "observation": "ok"}],
                               "reward": 1.0}) + "\n" for i in ids)


def ids(db) -> set[str]:
    return {r[0] for r in query(db, "SELECT traj_id FROM trajectories")}


def test_a_file_replaced_by_a_larger_one_is_read_from_its_start(tmp_path):
    logs, db = tmp_path / "agent", tmp_path / "s.duckdb"
    logs.mkdir()
    log = logs / "episodes.jsonl"
    log.write_text(records([f"a{k}" for k in range(4)]))
    proc = start(logs, db, "jsonl")
    try:
        wait_for(lambda: count(db) == 4)
        # a writer rewrites the whole file and renames it over the old one: two trajectories
        # already imported, thirteen new, the whole file larger than the part already read
        new = logs / "episodes.jsonl.tmp"
        new.write_text(records(["a0", "a1"] + [f"b{k:02d}" for k in range(13)]))
        os.replace(new, log)
        wait_for(lambda: count(db) == 17)
        time.sleep(1)
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert ids(db) == {f"a{k}" for k in range(4)} | {f"b{k:02d}" for k in range(13)}
    assert "is a new file" in out and "2 already present" in out
    assert query(db, "SELECT count(*) FROM trajectories")[0][0] == 17  # none twice


def test_lines_written_just_before_a_rotation_are_kept(tmp_path):
    logs, db = tmp_path / "agent", tmp_path / "s.duckdb"
    logs.mkdir()
    log = logs / "episodes.jsonl"
    log.write_text(records(["a0"]))
    proc = start(logs, db, "jsonl", "--poll", "1")
    try:
        wait_for(lambda: count(db) == 1)
        with open(log, "a") as f:  # logrotate's create mode, right after two more lines
            f.write(records(["a1", "a2"]))
        os.rename(log, logs / "episodes.jsonl.1")
        log.write_text(records(["b0"]))
        wait_for(lambda: count(db) == 4)
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert ids(db) == {"a0", "a1", "a2", "b0"} and "is a new file" in out


def test_truncated_and_rewritten_to_the_same_length_live_and_across_a_restart(tmp_path):
    logs, db = tmp_path / "agent", tmp_path / "s.duckdb"
    logs.mkdir()
    log = logs / "episodes.jsonl"
    log.write_text(records(["a0", "a1", "a2"]))
    proc = start(logs, db, "jsonl", "--poll", "2")  # the rewrite lands between two polls
    try:
        wait_for(lambda: count(db) == 3)
        with open(log, "r+") as f:  # truncate and rewrite in place: same inode, same length
            f.truncate(0)
            f.write(records(["b0", "b1", "b2"]))
        assert log.stat().st_size == len(records(["a0", "a1", "a2"]))
        wait_for(lambda: count(db) == 6)
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert "was rewritten" in out

    log.write_text(records(["c0", "c1", "c2"]))  # again, while no follower runs
    proc = start(logs, db, "jsonl")
    try:
        wait_for(lambda: count(db) == 9)
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert ids(db) == {f"{c}{k}" for c in "abc" for k in range(3)}

    proc = start(logs, db, "jsonl")  # unchanged since: resumed at its end, nothing read again
    try:
        time.sleep(1.5)
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert "imported" not in out.replace("trajectories imported", "") and count(db) == 9


def test_a_verl_step_file_rewritten_with_other_content_is_refused_loudly(tmp_path):
    dump, db = tmp_path / "rollouts", tmp_path / "s.duckdb"
    dump.mkdir()
    (dump / "1.jsonl").write_text("".join(verl_line(1, k) for k in range(3)))
    (dump / "2.jsonl").write_text("".join(verl_line(2, k) for k in range(2)))
    proc = start(dump, db, "verl")
    try:
        wait_for(lambda: count(db) == 5)
        with open(dump / "2.jsonl", "a") as f:  # appended after its import: new lines added
            f.write(verl_line(2, 7))
        (dump / "1.jsonl").write_text("".join(verl_line(1, k + 10) for k in range(3)))
        wait_for(lambda: count(db) == 6)
        wait_for(lambda: (query(db, "SELECT count(*) FROM imports WHERE errors::VARCHAR LIKE "
                                    "'%rewritten with other content%'") or [[0]])[0][0] == 1)
        time.sleep(1)
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert out.count("1.jsonl: rewritten with other content") == 1, out
    assert "2.jsonl grew after its import" in out
    prompts = {r[0] for r in query(db, "SELECT prompt FROM trajectories")}
    assert prompts == {f"question {k}?" for k in (0, 1, 2, 0, 1, 7)}  # the first content stays

    proc = start(dump, db, "verl")  # restart: the refusal is recorded, not repeated
    try:
        time.sleep(1.5)
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert "rewritten" not in out and "imported 1.jsonl" not in out and count(db) == 6
    # following and importing give the same ids: an import of the directory adds nothing new
    res = subprocess.run([sys.executable, "-m", "storage.io", "import", str(dump), "--db",
                          str(db), "--format", "verl"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert ", 0 imported, 6 already present" in res.stdout, res.stdout + res.stderr


def test_a_removed_and_recreated_dir_is_waited_for_and_its_last_lines_kept(tmp_path):
    logs, db = tmp_path / "agent", tmp_path / "s.duckdb"
    logs.mkdir()
    (logs / "e.jsonl").write_text(records(["a0", "a1", "a2"]))
    proc = start(logs, db, "jsonl", "--poll", "1")
    try:
        wait_for(lambda: count(db) == 3)
        with open(logs / "e.jsonl", "a") as f:  # two more lines, then the directory goes at once
            f.write(records(["a3", "a4"]))
        shutil.rmtree(logs)
        wait_for(lambda: count(db) == 5)  # read from the file still held open
        time.sleep(1.5)
        logs.mkdir()
        (logs / "e.jsonl").write_text(records([f"b{k}" for k in range(6)]))
        wait_for(lambda: count(db) == 11)
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert out.count("is gone (removed or renamed): waiting for it") == 1
    assert "is back: following it again" in out
    assert ids(db) == {f"a{k}" for k in range(5)} | {f"b{k}" for k in range(6)}


def test_a_follower_whose_store_was_deleted_stops_and_writes_no_new_store(tmp_path):
    logs, db = tmp_path / "agent", tmp_path / "s.duckdb"
    logs.mkdir()
    (logs / "e.jsonl").write_text(records(["a0"]))
    proc = start(logs, db, "jsonl")
    try:
        wait_for(lambda: count(db) == 1)
        time.sleep(1)  # between its writes (one queued now would open, and so create, the path)
        for path in tmp_path.glob("s.duckdb*"):
            path.unlink()
        with open(logs / "e.jsonl", "a") as f:
            f.write(records(["a1"]))
        out, _ = proc.communicate(timeout=30)  # it stops by itself
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 2, out
    assert "was deleted or replaced while following: stopped" in out
    assert not db.exists()
