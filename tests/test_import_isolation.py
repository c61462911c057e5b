"""Issue 47, point 1: one bad file fails alone, named, whatever it raises, and the rest goes on.

A ``header.json`` of 100,000 nested brackets raised RecursionError when its log was opened:
``import DIR`` exited 2 with "import stopped: RecursionError" naming no file, the good log beside
it was never imported, and ``follow`` died the same way on every restart. Here, with the real
command line (``python -m storage.io``) on logs made by hand (tests/hostile_imports.py): the bad
log is named with its member, the good one imports, the follower lives on, records the failure
and leaves that version alone after a restart, and takes the log once it is fixed. A sample
member that raises anything fails that sample. An import stopped by Ctrl-C keeps what it wrote
and is marked failed, as before.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from storage import db
from tests.hostile_imports import ROOT, header, kind_deep_header, sample, write_eval
from tests.test_follow import POLL, start, stop, wait_for

DEEP = b"[" * 100_000 + b"]" * 100_000


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "storage.io", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _q(store: Path, sql: str):
    with db.reading(store) as con:
        return con.execute(sql).fetchall()


def _good(path: Path, eval_id: str = "good") -> Path:
    return write_eval(path, {"a_epoch_1": sample("a"), "b_epoch_1": sample("b", correct=False)},
                      head=header(task="arith", eval_id=eval_id))


# -- import -----------------------------------------------------------------------------------
def test_a_log_whose_header_raises_fails_alone_named_and_the_good_one_imports(tmp_path):
    logs, store = tmp_path / "logs", tmp_path / "s.duckdb"
    logs.mkdir()
    kind_deep_header(logs / "deep.eval")
    _good(logs / "good.eval")
    (logs / "deep.json").write_bytes(b'{"version": 2, "status": "success", "eval": ' + DEEP + b"}")
    proc = _cli("import", str(logs), "--db", str(store), "--format", "inspect")
    assert proc.returncode == 1, proc.stderr
    assert ("error: deep.eval: could not be read: deep.eval: no readable header.json or "
            "_journal/start.json (deep.eval: member header.json: not valid JSON (nested too "
            "deeply))") in proc.stderr
    assert "error: deep.json: could not be read: deep.json: not valid JSON (nested too deeply)" \
        in proc.stderr
    assert "stopped" not in proc.stderr and "Traceback" not in proc.stderr
    assert "2 records read, 2 imported" in proc.stdout
    assert _q(store, "SELECT split_part(traj_id, '/', 2), status FROM trajectories JOIN runs "
                     "USING (run_id) ORDER BY 1") == [("a:epoch1", "finished"),
                                                      ("b:epoch1", "finished")]


def test_the_log_given_alone_is_refused_by_file_and_member(tmp_path):
    proc = _cli("import", str(kind_deep_header(tmp_path / "deep.eval")), "--db",
                str(tmp_path / "s.duckdb"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: deep.eval: no readable header.json or _journal/start.json (deep.eval: member "
        "header.json: not valid JSON (nested too deeply))")


def test_a_sample_that_raises_anything_fails_alone_naming_its_member(tmp_path):
    log, store = tmp_path / "mixed.eval", tmp_path / "s.duckdb"
    write_eval(log, {"a_epoch_1": sample("a"),
                     "deep_epoch_1": b'{"id": "deep", "messages": ' + DEEP + b"}",
                     "costly_epoch_1": json.dumps(sample("costly", metadata=[{}] * 9_000_000)
                                                  ).encode(),
                     "b_epoch_1": sample("b")})
    proc = _cli("import", str(log), "--db", str(store))
    assert proc.returncode == 1, proc.stderr
    assert ("error: mixed.eval: sample deep epoch 1: mixed.eval: member "
            "samples/deep_epoch_1.json: not valid JSON (nested too deeply)") in proc.stderr
    assert ("error: mixed.eval: sample costly epoch 1: mixed.eval: member "
            "samples/costly_epoch_1.json: ") in proc.stderr
    assert "MiB to parse (more than the limit of 1024 MiB: mostly tiny objects or lists)" \
        in proc.stderr
    assert "4 records read, 2 imported" in proc.stdout
    assert _q(store, "SELECT traj_id FROM trajectories ORDER BY 1") == [("a:epoch1",),
                                                                       ("b:epoch1",)]


def test_ctrl_c_stops_an_import_keeping_what_it_wrote_and_marks_it_failed(tmp_path):
    source, store = tmp_path / "many.jsonl", tmp_path / "s.duckdb"
    line = json.dumps({"task_id": "q", "reward": 1.0, "prompt": "word " * 1000,
                       "turns": [{"action": "act " * 1000, "observation": "obs " * 1000}]})
    source.write_text("".join(f'{{"traj_id": "t{i}", {line[1:]}\n' for i in range(5_000)),
                      encoding="utf-8")  # ~70 MB: seconds to import, the first batch at once
    # Ctrl-C as a foreground program gets it: a parent that ignores SIGINT hands the ignoring
    # on, and the import then runs to its end ('finished'), as it did in two whole-suite runs
    # (which test left the worker so was not found)
    proc = subprocess.Popen([sys.executable, "-m", "storage.io", "import", str(source), "--db",
                             str(store), "--run-id", "cut"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for(lambda: store.exists() and _q(store, "SELECT count(*) FROM trajectories")[0][0]
                 > 0, timeout=60)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    status, error = _q(store, "SELECT status, error FROM runs WHERE run_id = 'cut'")[0]
    assert status == "failed" and error.startswith("KeyboardInterrupt")
    (lines, imported, errors), = _q(store, "SELECT lines, imported, errors FROM imports")
    kept = _q(store, "SELECT count(*) FROM trajectories")[0][0]
    assert 0 < kept == imported < 5_000 and lines >= imported
    assert "import stopped: KeyboardInterrupt" in errors


# -- follow -----------------------------------------------------------------------------------
def _said(out: str, what: str) -> int:
    return sum(what in line for line in out.splitlines())


def test_the_follower_lives_on_remembers_the_bad_log_and_takes_it_once_fixed(tmp_path):
    logs, store = tmp_path / "logs", tmp_path / "s.duckdb"
    logs.mkdir()
    kind_deep_header(logs / "deep.eval")
    _good(logs / "good.eval")
    proc = start(logs, store, "inspect")
    try:
        wait_for(lambda: store.exists() and _q(store, "SELECT count(*) FROM trajectories")[0][0]
                 == 2)
        time.sleep(POLL * 6)  # more polls: the bad log is not read again
        assert proc.poll() is None  # alive
        first = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert _said(first, "error: deep.eval: not read: deep.eval: no readable header.json") == 1
    assert _said(first, "(nested too deeply)") == 1
    failed = _q(store, "SELECT run_id, source, failed FROM imports WHERE source LIKE 'deep%'")
    assert len(failed) == 1 and failed[0][1].startswith("deep.eval#0-") and failed[0][2] == 1
    # a restart leaves that version alone: nothing said, nothing read
    proc = start(logs, store, "inspect")
    try:
        time.sleep(POLL * 10)
        again = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert "deep.eval" not in again and "0 trajectories imported" in again, again
    # fixed (rewritten as a good log of another eval): taken as any new log
    _good(logs / "deep.eval", eval_id="fixed")
    proc = start(logs, store, "inspect")
    try:
        wait_for(lambda: _q(store, "SELECT count(*) FROM trajectories")[0][0] == 4)
        fixed = stop(proc)
    finally:
        proc.kill() if proc.poll() is None else None
    assert "imported deep.eval (finished): 2 new" in fixed, fixed


# -- text: what the threat model says ----------------------------------------------------------
def test_a_lone_surrogate_is_stored_as_u_fffd_by_every_importer(tmp_path):
    """Half an emoji escaped in a string (``"\\ud83d"``, as Python's json writes a cut one):
    every importer keeps the line and stores U+FFFD (docs/threat-model.md), as the trainer does.
    It was refused by the JSONL importers and stored by the Inspect one."""
    half = "\\ud83d"  # the six characters of the escape, as they stand in the file
    generic = tmp_path / "g.jsonl"
    generic.write_text('{"traj_id": "t' + half + '", "task_id": "q", "reward": 1, "prompt": '
                       '"p' + half + '", "turns": [{"action": "a' + half + '"}]}\n')
    chat = tmp_path / "m.jsonl"
    chat.write_text('{"messages": [{"role": "user", "content": "u' + half + '"}, {"role": '
                    '"assistant", "content": "a' + half + '"}], "reward": 1}\n')
    verl = tmp_path / "3.jsonl"
    verl.write_text('{"input": "i' + half + '", "output": "<answer>o' + half + '</answer>", '
                    '"score": 1}\n')
    inspect = write_eval(tmp_path / "i.eval", {"s_epoch_1": json.dumps(sample("s")).replace(
        '"5"}]', '"5' + half + '"}]', 1).encode()})
    for source, fmt in ((generic, "jsonl"), (chat, "messages"), (verl, "verl"),
                        (inspect, "inspect")):
        store = tmp_path / f"{fmt}.duckdb"
        proc = _cli("import", str(source), "--db", str(store), "--format", fmt)
        assert proc.returncode == 0, (fmt, proc.stderr)
        texts = _q(store, "SELECT string_agg(action, '') FROM turns")[0][0]
        assert "\ufffd" in texts and "\\ud83d" not in texts, (fmt, texts)
    assert _q(tmp_path / "jsonl.duckdb", "SELECT traj_id, prompt FROM trajectories") == [
        ("t\ufffd", "p\ufffd")]
