"""`python -m storage.io follow` as a user runs it: a real follower process, files written in
pieces by this test (the other trainer), the store read while it follows, Ctrl-C, a restart."""
from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
POLL = 0.2


READY = "Ctrl-C to stop"


def start(directory: Path, db: Path, fmt: str, *extra: str) -> subprocess.Popen:
    """The follower, once it says it follows: its Ctrl-C handler is in place from that line on
    (a SIGINT sent while it is still importing its modules would be Python's KeyboardInterrupt,
    which is not what the tests mean to send). What it said so far is kept in ``proc.said``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "storage.io", "follow", str(directory), "--db", str(db),
         "--format", fmt, "--poll", str(POLL), *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # read the raw pipe a byte at a time: nothing may wait in a Python buffer that the
    # descriptor-level reads of communicate() would then never see
    said, fd = b"", proc.stdout.fileno()
    deadline = time.monotonic() + 120
    while READY.encode() not in said and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            byte = os.read(fd, 1)
            if not byte:  # it ended: its output says why
                break
            said += byte
        elif proc.poll() is not None:
            break
    proc.said = said.decode("utf-8", "replace")
    return proc


def stop(proc: subprocess.Popen) -> str:
    """Ctrl-C, then the follower's output; it must exit 0 by itself."""
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    out = getattr(proc, "said", "") + out
    assert proc.returncode == 0, out
    assert "followed for" in out, out
    return out


def query(db: Path, sql: str):
    if not db.exists():
        return None
    from storage import db as store
    with store.reading(db) as con:  # the app's way: fair with the follower's writes
        return con.execute(sql).fetchall()


def count(db: Path) -> int:
    rows = query(db, "SELECT count(*) FROM trajectories")
    return rows[0][0] if rows else 0


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting")


def verl_line(step: int, k: int) -> str:
    return json.dumps({"input": f"question {k}?", "output": f"<answer>a{k}</answer>",
                       "gts": [f"a{k}"], "score": float(k % 2), "step": step}) + "\n"


def test_verl_dir_followed_live_never_half_files_restart_and_ctrl_c(tmp_path):
    dump, db = tmp_path / "rollouts", tmp_path / "live.duckdb"
    dump.mkdir()
    proc = start(dump, db, "verl")
    try:
        # step 1 written in two pieces, the first ending mid-line: not imported until complete
        text = "".join(verl_line(1, k) for k in range(4))
        (dump / "1.jsonl").write_text(text[:len(text) // 2 + 5])
        time.sleep(POLL * 6)
        assert count(db) == 0
        with open(dump / "1.jsonl", "a") as f:
            f.write(text[len(text) // 2 + 5:])
        wait_for(lambda: count(db) == 4)
        assert query(db, "SELECT status FROM runs") == [("running",)]
        (dump / "2.jsonl").write_text("".join(verl_line(2, k) for k in range(3)))
        wait_for(lambda: count(db) == 7)
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert "imported 1.jsonl: 4 new" in out and "7 trajectories imported" in out
    assert query(db, "SELECT status, source FROM runs") == [("finished", "import:verl")]
    assert query(db, "SELECT step, count(*) FROM trajectories GROUP BY step ORDER BY step") \
        == [(1, 4), (2, 3)]
    assert query(db, "SELECT count(*) FROM metrics WHERE name = 'reward/mean'")[0][0] == 2

    # restart: the imports table says what was done; nothing twice, the new file only
    (dump / "10.jsonl").write_text(verl_line(10, 1))
    proc = start(dump, db, "verl")
    try:
        wait_for(lambda: count(db) == 8)
        time.sleep(POLL * 5)
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert "imported 1.jsonl" not in out and "imported 10.jsonl: 1 new" in out
    assert query(db, "SELECT count(*), count(DISTINCT traj_id) FROM trajectories") == [(8, 8)]
    sources = sorted(r[0] for r in query(db, "SELECT source FROM imports"))
    assert [s.split("#")[0] for s in sources] == ["1.jsonl", "10.jsonl", "2.jsonl"]
    assert all(re.fullmatch(r".+#0-\d+~[0-9a-f]{16}", s) for s in sources)  # size and digest


def record(k: int, step: int) -> str:
    return json.dumps({"traj_id": f"t{k}", "task_id": f"q{k % 2}", "step": step,
                       "prompt": f"task {k}", "turns": [{"action": f"act {k}",
                                                         "observation": "ok"}],
                       "reward": 1.0, "rewards": {"outcome": 1.0}}) + "\n"


def test_appended_jsonl_complete_lines_only_and_resume_after_restart(tmp_path):
    logs, db = tmp_path / "agent", tmp_path / "agent.duckdb"
    logs.mkdir()
    log = logs / "episodes.jsonl"
    proc = start(logs, db, "jsonl", "--run-id", "agent-live", "--run-name", "my agent")
    try:
        with open(log, "a") as f:
            f.write(record(0, 0) + record(1, 0))
            f.flush()
            wait_for(lambda: count(db) == 2)
            half = record(2, 1)
            f.write(half[:20])  # the agent loop is mid-write
            f.flush()
            time.sleep(POLL * 6)
            assert count(db) == 2
            f.write(half[20:])
            f.flush()
            wait_for(lambda: count(db) == 3)
        stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    with open(log, "a") as f:  # written while no follower ran
        f.write(record(3, 1))
    proc = start(logs, db, "jsonl", "--run-id", "agent-live")
    try:
        wait_for(lambda: count(db) == 4)
        with open(log, "a") as f:
            f.write(record(4, 2))
        wait_for(lambda: count(db) == 5)
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert "0 already present" in out  # it resumed after the last imported byte
    assert query(db, "SELECT run_id, name, status FROM runs") == [
        ("agent-live", "my agent", "finished")]
    assert query(db, "SELECT count(DISTINCT traj_id) FROM trajectories")[0][0] == 5
    spans = sorted(r[0] for r in query(db, "SELECT source FROM imports"))
    assert all(s.startswith("episodes.jsonl#") for s in spans) and len(spans) >= 4


def test_trl_parquet_imported_only_once_complete(tmp_path):
    out_dir, db = tmp_path / "completions", tmp_path / "trl.duckdb"
    out_dir.mkdir()
    table = pa.table({"step": [3] * 4, "prompt": ["Name a colour."] * 4,
                      "completion": ["red", "blue", "12", "green"],
                      "format_reward": [1.0, 1.0, 0.0, 1.0], "advantage": [0.5, 0.5, -1.5, 0.5]})
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    data = buf.getvalue().to_pybytes()
    proc = start(out_dir, db, "trl")
    try:
        target = out_dir / "completions_00003.parquet"
        with open(target, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            time.sleep(POLL * 6)
            assert count(db) == 0  # stable for many polls, but no Parquet footer yet
            f.write(data[len(data) // 2:])
        wait_for(lambda: count(db) == 4)
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert "imported completions_00003.parquet: 4 new" in out
    res = subprocess.run([sys.executable, "-m", "storage.io", "import", str(out_dir), "--db",
                          str(db), "--format", "trl"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)  # the same ids as an import of the directory gives
    assert ", 0 imported, 4 already present" in res.stdout, res.stdout + res.stderr
    assert query(db, "SELECT group_id, count(*), min(step) FROM trajectories GROUP BY ALL") \
        == [(query(db, "SELECT any_value(group_id) FROM trajectories")[0][0], 4, 3)]


def test_bad_input_is_a_clear_error(tmp_path):
    res = subprocess.run([sys.executable, "-m", "storage.io", "follow", str(tmp_path / "nope"),
                          "--db", str(tmp_path / "x.duckdb"), "--format", "verl"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "no such directory" in res.stderr
    res = subprocess.run([sys.executable, "-m", "storage.io", "follow", str(tmp_path),
                          "--db", str(tmp_path / "x.duckdb"), "--format", "csv"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "invalid choice" in res.stderr
