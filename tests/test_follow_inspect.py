"""`storage.io follow --format inspect|messages`: a real Inspect evaluation writing its log while
a real follower process watches the directory (tests/inspect_live.py), logs rewritten and
restarted on, hostile logs beside good ones, and messages JSONL appended in pieces."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile

import pytest

from storage import ingest
from storage.ingest.follow import Follower
from storage.ingest.inspect_log import InspectLog
from storage.ingest.zip_members import Archive
from tests.test_follow import POLL, ROOT, count, query, start, stop, wait_for
from tests.test_import_inspect import NEEDS, _one, _rewrite, logs  # noqa: F401 (a fixture)

RUN_CONFIG = "SELECT config->>'$.inspect.status' FROM runs"


def _eval(log_dir, gate, fmt: str) -> subprocess.Popen:
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(log_dir.parent / "empty-cache"),
           "INSPECT_DISPLAY": "none"}
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "inspect_live.py"),
                             str(log_dir), str(gate), fmt], cwd=log_dir.parent, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _samples(db) -> list[tuple]:
    return query(db, "SELECT split_part(traj_id, '/', 2), success, finish_reason "
                     "FROM trajectories ORDER BY 1") or []


@pytest.mark.parametrize("fmt", ["eval", "json"])
def test_a_live_eval_is_followed_sample_by_sample_while_it_writes(tmp_path, fmt):
    pytest.importorskip("inspect_ai", reason=NEEDS)
    log_dir, gate, db = tmp_path / "logs", tmp_path / "gate", tmp_path / "live.duckdb"
    log_dir.mkdir()
    follower = start(log_dir, db, "inspect")
    evaluation = _eval(log_dir, gate, fmt)
    try:
        # the quick sample is in the log while the gated one waits: imported before the eval ends
        wait_for(lambda: count(db) == 1, timeout=90)
        assert _samples(db) == [("quick:epoch1", True, "answered")]
        assert query(db, RUN_CONFIG) == [("started",)] and evaluation.poll() is None
        assert query(db, "SELECT status FROM runs") == [("running",)]
        gate.touch()
        assert evaluation.wait(timeout=90) == 0, evaluation.stdout.read()
        wait_for(lambda: query(db, RUN_CONFIG) == [("success",)], timeout=30)
        out = stop(follower)
    finally:
        for proc in (follower, evaluation):
            proc.kill() if proc.poll() is None else None
    assert _samples(db) == [("gated:epoch1", True, "answered"), ("quick:epoch1", True, "answered")]
    assert "(still being written): 1 new" in out and "(finished): 1 new" in out
    assert "1 taken before" in out  # the finished log's quick sample was not read again
    (run_id, status, name), = query(db, "SELECT run_id, status, name FROM runs")
    assert status == "finished" and name == "live · mockllm/model"
    assert run_id.startswith(ingest.default_run_id(log_dir) + "-live-mockllm-model-")
    assert query(db, "SELECT value FROM metrics WHERE name = 'inspect/includes/accuracy'") \
        == [(1.0,)]  # Inspect's own results, from the finished log's header
    res = subprocess.run([sys.executable, "-m", "storage.io", "import", str(log_dir), "--db",
                          str(db)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "2 records read, 0 imported, 2 already present" in res.stdout, res.stdout + res.stderr

    follower = start(log_dir, db, "inspect")  # a restart: the log is as imported, left alone
    try:
        time.sleep(POLL * 8)
        out = stop(follower)
    finally:
        follower.kill() if follower.poll() is None else None
    assert "imported" not in out.split("Ctrl-C to stop", 1)[1].split("followed for")[0]
    assert query(db, "SELECT status FROM runs") == [("finished",)] and count(db) == 2


def _follower(directory, db, messages: list[str], fmt: str = "inspect") -> Follower:
    return Follower(directory, db, fmt, log=messages.append)


def _polls(follower: Follower, n: int = 2) -> int:
    return sum(follower.poll_once() for _ in range(n))  # the first look only sees it hold still


def _with_eval_id(src, dst, eval_id: str, changes: dict | None = None) -> None:
    """``src`` as another eval's log (its eval id changed), with members replaced."""
    with InspectLog(src) as log:
        archive = log.archive
        edited = {}
        for name in ("header.json", "_journal/start.json"):
            if name in archive.members:
                obj = json.loads(archive.read(name))
                obj["eval"]["eval_id"] = eval_id
                edited[name] = json.dumps(obj).encode()
    _rewrite(src, dst, {**edited, **(changes or {})})


def test_hostile_logs_fail_alone_naming_the_sample_and_the_rest_import(logs, tmp_path):
    out, _ = logs
    good, d, db = _one(out / "eval"), tmp_path / "logs", tmp_path / "s.duckdb"
    d.mkdir()
    ingest.import_file(_one(out / "json"), db, run_id="recorded-before")  # kept whatever follows
    huge = json.dumps({"id": "limited", "epoch": 2, "messages": [
        {"role": "user", "content": "x" * 5_000_000}]}).encode()
    _with_eval_id(good, d / "hostile.eval", "hostile", {
        "samples/failed_epoch_1.json": b'{"id": "failed", "epoch": 1, "messages": [',
        "samples/limited_epoch_2.json": huge,
        "samples/solved_epoch_2.json": json.dumps({"id": "solved", "epoch": 2, "scores": {
            "includes": {"value": {"nested": {"deep": 1}}}}}).encode()})
    (d / "junk.eval").write_bytes(b"PK\x03\x04 and then nothing")
    (d / "other.json").write_text('{"not": "an inspect log"}')
    for listing in ("logs.json", "eval-set.json", ".inspect_tmp_x.eval"):
        (d / listing).write_text("{ an eval set's listing, never read")
    (tmp_path / "outside.eval").write_bytes(good.read_bytes())
    (d / "link.eval").symlink_to(tmp_path / "outside.eval")
    said: list[str] = []
    follower = _follower(d, db, said)
    assert _polls(follower) == 1
    errors = [m for m in said if m.startswith("error:")]
    assert any("hostile.eval: sample failed epoch 1: " in e and "not valid JSON" in e
               for e in errors)
    assert any("hostile.eval: sample limited epoch 2: message 0 (user) holds 5000000 "
               "characters" in e for e in errors)
    assert any("hostile.eval: sample solved epoch 2: score 'includes' has a value Inspect does "
               "not allow" in e for e in errors)
    assert any("junk.eval: not read: junk.eval: " in e for e in errors)
    assert any("other.json: not read: other.json: not an Inspect log" in e for e in errors)
    assert any("link.eval: links outside the followed directory" in e for e in errors)
    assert not any(n in e for e in errors for n in ("logs.json", "eval-set.json", "inspect_tmp"))
    assert follower.report.trajectories == 5 and follower.report.failed == 3
    said.clear()
    assert _polls(follower) == 0 and said == []  # each said once per version of the file
    # the junk is replaced by a good version of the same eval: its three failed samples import
    _with_eval_id(good, d / "junk.eval", "hostile")
    assert _polls(follower) == 1
    assert follower.report.trajectories == 8 and follower.report.skipped == 5
    follower.finish()
    follower.close()
    assert query(db, "SELECT count(*) FROM trajectories WHERE run_id = 'recorded-before'") \
        == [(8,)]
    assert query(db, "SELECT count(*), count(DISTINCT traj_id) FROM trajectories WHERE "
                     "run_id <> 'recorded-before'") == [(8, 8)]
    assert ("hostile.eval", 8, 5, 3) in [(s.split("#")[0], *r) for s, *r in query(
        db, "SELECT source, lines, imported, failed FROM imports")]


def test_a_log_written_in_versions_reads_only_new_samples_and_restarts(logs, tmp_path):
    out, _ = logs
    good, d, db = _one(out / "eval"), tmp_path / "logs", tmp_path / "s.duckdb"
    d.mkdir()
    with InspectLog(good) as log:
        members = list(log.archive.members)
    later = [m for m in members if m.startswith("samples/")][3:]
    target = d / good.name
    _rewrite_without(good, target, {"header.json", *later})  # mid-run: no header, 3 samples
    said: list[str] = []
    follower = _follower(d, db, said)
    assert _polls(follower) == 1 and follower.report.trajectories == 3
    tracked = follower.files[good.name]
    assert tracked.taken is not None and len(tracked.taken[1]) == 3
    assert query(db, RUN_CONFIG) == [("started",)]
    tmp = d / ".inspect_tmp_1.writing"  # the finished log, renamed over the running one
    tmp.write_bytes(good.read_bytes())
    os.replace(tmp, target)
    assert _polls(follower) == 1 and follower.report.trajectories == 8
    assert follower.report.skipped == 0 and "3 taken before" in said[-1]
    assert follower.files[good.name].taken is None  # finished: its sample keys are forgotten
    assert query(db, RUN_CONFIG) == [("success",)]
    follower.finish()
    follower.close()
    said.clear()
    again = _follower(d, db, said)  # a restart: the digest matches, nothing is read
    assert _polls(again, 3) == 0 and again.report.trajectories == 0
    _rewrite(good, target, {})  # rewritten after the eval (deflate now): read, nothing doubled
    assert _polls(again) == 1 and (again.report.trajectories, again.report.skipped) == (0, 8)
    assert again.report.rescored == 0                   # the same scores: nothing rescored
    # `inspect score` rewrites the log with new scores: each sample takes them, the old kept
    tmp = d / ".inspect_tmp_2.writing"
    tmp.write_bytes(_one(out / "rescored").read_bytes())
    os.replace(tmp, target)
    assert _polls(again) == 1 and (again.report.skipped, again.report.rescored) == (16, 8)
    assert "(8 rescored)" in said[-1]
    assert query(db, "SELECT count(*) FROM trajectories WHERE success") == [(8,)]
    assert query(db, "SELECT count(*) FROM trajectories WHERE (info->'$.rescored') IS NOT NULL") \
        == [(8,)]
    again.finish()
    again.close()
    assert query(db, "SELECT count(*), count(DISTINCT traj_id) FROM trajectories") == [(8, 8)]
    assert query(db, "SELECT DISTINCT status FROM runs") == [("finished",)]


def _rewrite_without(src, dst, dropped: set[str]) -> None:
    """``src`` without the members named in ``dropped``."""
    with Archive(src) as archive, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as out:
        for name in archive.members:
            if name not in dropped:
                out.writestr(name, archive.read(name))


def _conversation(k: int) -> str:
    return json.dumps({"messages": [
        {"role": "user", "content": f"What is {k}+1?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "add", "arguments": json.dumps({"x": k, "y": 1})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": str(k + 1)},
        {"role": "assistant", "content": str(k + 1)}], "reward": 1.0, "task_id": f"add{k}"}) + "\n"


def test_messages_followed_line_by_line_with_the_ids_import_gives(tmp_path):
    d, db, whole = tmp_path / "traces", tmp_path / "live.duckdb", tmp_path / "whole.duckdb"
    d.mkdir()
    trace = d / "agent.jsonl"
    proc = start(d, db, "messages")
    try:
        with open(trace, "a") as f:
            f.write(_conversation(0) + _conversation(1))
            f.flush()
            wait_for(lambda: count(db) == 2)
            third = _conversation(2)
            f.write(third[:30])  # the agent is mid-write
            f.flush()
            wait_for(lambda: "agent.jsonl" in str(query(db, "SELECT source FROM imports")))
            f.write(third[30:] + '{"messages": "not a list"}\n')
            f.flush()
            wait_for(lambda: count(db) == 3)
        out = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert "error: agent.jsonl: byte " in out and "'messages' must be a non-empty list" in out
    ingest.import_file(trace, whole, "messages", run_id=query(db, "SELECT run_id FROM runs")[0][0])
    sql = ("SELECT traj_id, task_id, finish_reason, answer, num_turns FROM trajectories "
           "ORDER BY traj_id")
    assert query(db, sql) == query(whole, sql)  # following and importing agree
    assert query(db, "SELECT action FROM turns ORDER BY traj_id, turn LIMIT 1") == [
        ("add(x=0, y=1)",)]
