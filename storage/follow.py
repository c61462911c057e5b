"""Follow a directory another trainer writes into and import each new complete file, live.

    python -m storage.io follow DIR --db PATH --format {verl,trl,jsonl} [--run-id ID]
                                [--run-name NAME] [--poll SECONDS]

* ``verl``: ``DIR`` is ``trainer.rollout_data_dir``; each ``{step}.jsonl`` (storage/dumps.py's
  verl reader) is imported once it is complete.
* ``trl``: ``DIR`` is ``<output_dir>/completions`` of a run with ``log_completions=True``; each
  ``completions_*.parquet`` once complete.
* ``jsonl``: generic JSONL (storage/interchange.py) appended by any agent loop, one or more
  ``*.jsonl`` files in ``DIR``; each new *complete line* is imported as soon as it is there.

Only files directly in ``DIR`` are watched. Everything goes into one run, by default the run
``python -m storage.io import DIR`` would create (``default_run_id(DIR)``), so following and a
later import of the same directory agree.

When a file counts as complete (never a half-written one): its size and modification time are
the same on two successive polls, and it ends the way a finished file of its kind ends (a verl
file with a newline, a Parquet file with its ``PAR1`` footer). For appended JSONL only the bytes
up to the last newline are taken; the rest waits for its newline.

Idempotent and restartable: every import leaves a row in the store's ``imports`` table (the
importer, storage/io.py), and the follower starts by reading them: a verl/TRL file whose name is
there is not imported again (unless it changes afterwards: then its new records are added once
it is stable again), and a JSONL file resumes after the last byte range recorded for it
(sources named ``{file}#{start}-{end}``). Trajectories already in the run are skipped anyway
(same ``traj_id``). A JSONL file that shrinks (rotated, rewritten) is read again from its start.

While it follows, the run is ``running`` (refreshed every ``HEARTBEAT_S`` so the Runs page does
not call it interrupted); Ctrl-C (SIGINT) or SIGTERM lets the import in progress finish, marks
the run ``finished`` and exits 0 with a summary.
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from storage import db
from storage.migrations import prepare
from storage.recorder import check_run_id, clean_text, now

PATTERNS = {"verl": "*.jsonl", "trl": "completions_*.parquet", "jsonl": "*.jsonl"}
HEARTBEAT_S = 30.0
MAX_TRIES = 3


@dataclass
class FollowReport:
    run_id: str
    files: int = 0           # whole files (verl, trl) or line ranges (jsonl) imported
    trajectories: int = 0
    skipped: int = 0         # trajectories already in the run
    failed: int = 0          # records that could not be imported (see the imports table)
    errors: list[str] = field(default_factory=list)

    def summary(self, seconds: float) -> str:
        return (f"followed for {seconds:.0f} s: {self.files} imports, {self.trajectories} "
                f"trajectories imported, {self.skipped} already present, {self.failed} failed "
                f"-> run {self.run_id}")


def complete_end(path: Path, fmt: str) -> bool:
    """Whether a stable file also ends as a finished file of ``fmt`` ends."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return False
        f.seek(max(size - 4, 0))
        tail = f.read()
    return tail == b"PAR1" if fmt == "trl" else tail.endswith(b"\n")


def _done_sources(db_path, run_id: str) -> list[str]:
    with db.reading(db_path) as con:
        return [r[0] for r in con.execute("SELECT source FROM imports WHERE run_id = ?",
                                          [run_id]).fetchall()]


def _set_running(db_path, run_id: str, status: str = "running") -> None:
    with db.writing(db_path) as con:
        con.execute("UPDATE runs SET status = ?, error = NULL, updated_at = ? "
                    "WHERE run_id = ? AND source LIKE 'import%'", [status, now(), run_id])


class Follower:
    """Polls ``directory`` and imports what is complete; ``poll_once`` does one round."""

    def __init__(self, directory, db_path, fmt: str, run_id: str | None = None,
                 run_name: str | None = None, log: Callable[[str], None] = print):
        from storage.io import default_run_id
        if fmt not in PATTERNS:
            raise ValueError(f"unknown format {fmt!r}; expected one of {tuple(PATTERNS)}")
        self.dir = Path(directory)
        if not self.dir.is_dir():
            raise FileNotFoundError(f"no such directory: {self.dir}")
        self.db, self.fmt, self.log = db_path, fmt, log
        self.run_id = check_run_id(run_id) if run_id else default_run_id(self.dir)
        self.run_name = run_name or self.dir.resolve().name
        self.report = FollowReport(self.run_id)
        self.seen: dict[str, tuple[int, int]] = {}    # name -> (size, mtime) at the last poll
        self.tries: dict[str, int] = {}
        self._scratch = tempfile.TemporaryDirectory(prefix="follow-")
        prepare(db_path)
        from storage.import_batch import refuse_foreign, run_source
        refuse_foreign(self.run_id, run_source(db_path, self.run_id))  # never a trainer's run
        # verl/trl: name -> (size, mtime) when imported; None = imported before a restart
        # (taken as complete at its size when first seen). A file that changes after its import
        # (a writer that paused longer than two polls) is imported again once stable: its new
        # records are added, those already in the run skipped.
        self.done: dict[str, tuple[int, int] | None] = {}
        self.offset: dict[str, int] = {}               # jsonl: bytes already imported
        for source in _done_sources(db_path, self.run_id):
            name, _, span = source.rpartition("#")
            if fmt == "jsonl" and name and "-" in span:
                end = span.split("-", 1)[1]
                if end.isdigit():
                    self.offset[name] = max(self.offset.get(name, 0), int(end))
            else:
                self.done[source] = None

    def close(self) -> None:
        self._scratch.cleanup()

    def _stable(self, path: Path, stat: os.stat_result) -> bool:
        key = (stat.st_size, stat.st_mtime_ns)
        previous, self.seen[path.name] = self.seen.get(path.name), key
        return previous == key

    def poll_once(self) -> int:
        """One look at the directory; the number of imports made."""
        made = 0
        for path in sorted(self.dir.glob(PATTERNS[self.fmt]), key=_order):
            if not path.is_file():
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue  # removed between the listing and now
            key = (stat.st_size, stat.st_mtime_ns)
            if self.fmt == "jsonl":
                made += self._poll_appended(path, stat)
            elif path.name in self.done and self.done[path.name] in (None, key):
                self.done[path.name] = key
            elif self._stable(path, stat) and complete_end(path, self.fmt):
                made += self._import(path, path.name, key)
        return made

    def _poll_appended(self, path: Path, stat: os.stat_result) -> int:
        start = self.offset.get(path.name, 0)
        if stat.st_size < start:
            self.log(f"{path.name} shrank ({stat.st_size} < {start} bytes): reading it again "
                     "from the start (trajectories already imported are skipped)")
            start = self.offset[path.name] = 0
        if stat.st_size == start:
            return 0
        with open(path, "rb") as f:
            f.seek(start)
            chunk = f.read(stat.st_size - start)
        end = chunk.rfind(b"\n") + 1
        if end == 0:
            return 0  # no complete line yet
        span = f"{path.name}#{start}-{start + end}"
        piece = Path(self._scratch.name) / span
        piece.write_bytes(chunk[:end])
        try:
            made = self._import(piece, span, None)
        finally:
            piece.unlink(missing_ok=True)
        if made or self.tries.get(span, 0) >= MAX_TRIES:
            self.offset[path.name] = start + end
        return made

    def _import(self, path: Path, name: str, key: tuple[int, int] | None) -> int:
        from storage.io import import_file
        try:
            rep = import_file(path, self.db, self.fmt, run_name=self.run_name, run_id=self.run_id,
                              live=True)
        except (db.StoreError, OSError) as exc:  # a lock held too long, a file gone: try again
            self.tries[name] = self.tries.get(name, 0) + 1
            if self.tries[name] >= MAX_TRIES:
                self._error(name, f"given up after {MAX_TRIES} tries: {exc}")
                self.done[name] = key
            return 0
        except ValueError as exc:  # nothing in it to import (e.g. only blank lines)
            self._error(name, str(exc))
            self.done[name] = key
            self.tries[name] = MAX_TRIES
            return 0
        self.done[name] = key
        self.report.files += 1
        self.report.trajectories += rep.imported
        self.report.skipped += rep.skipped
        self.report.failed += rep.failed
        for line in rep.errors[:5]:  # a whole file's errors name it already, a line range's not
            self._error(name, line) if "#" in name else self._error(None, line)
        self.log(clean_text(f"imported {name}: {rep.imported} new, {rep.skipped} already "
                            f"present, {rep.failed} failed"))
        return 1

    def _error(self, name: str | None, message: str) -> None:
        text = clean_text(f"{name}: {message}" if name else message)
        if len(self.report.errors) < 100:
            self.report.errors.append(text)
        self.log(f"error: {text}")

    def finish(self) -> None:
        try:
            _set_running(self.db, self.run_id, "finished")
        except db.StoreError as exc:
            self.log(f"error: could not mark run {self.run_id} finished: {exc}")


def _order(path: Path) -> tuple:
    """Steps in numeric order (``9.jsonl`` before ``10.jsonl``), then by name."""
    digits = "".join(c for c in path.stem if c.isdigit())
    return (int(digits) if digits else -1, path.name)


def follow(directory, db_path, fmt: str, run_id: str | None = None, run_name: str | None = None,
           poll_s: float = 1.0, log: Callable[[str], None] = print,
           should_stop: Callable[[], bool] = lambda: False) -> FollowReport:
    """Poll until ``should_stop()``; see the module docstring."""
    if not poll_s > 0:
        raise ValueError(f"--poll must be a positive number of seconds, got {poll_s}")
    follower = Follower(directory, db_path, fmt, run_id, run_name, log)
    log(f"following {follower.dir} ({fmt}: {PATTERNS[fmt]}) into {db_path}, run "
        f"{follower.run_id}; Ctrl-C to stop")
    beat = time.monotonic()
    try:
        while not should_stop():
            follower.poll_once()
            if time.monotonic() - beat > HEARTBEAT_S and follower.report.files:
                _set_running(db_path, follower.run_id)
                beat = time.monotonic()
            deadline = time.monotonic() + poll_s
            while not should_stop() and time.monotonic() < deadline:
                time.sleep(min(0.05, poll_s))
    finally:
        if follower.report.files or follower.done or follower.offset:
            follower.finish()
        follower.close()
    return follower.report


def main(args) -> int:
    """``python -m storage.io follow``: exit 0 on Ctrl-C/SIGTERM with a summary."""
    stop = {"now": False}

    def ask_stop(signum, frame):
        stop["now"] = True

    previous = {s: signal.signal(s, ask_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    try:
        report = follow(args.dir, args.db, args.format, args.run_id, args.run_name, args.poll,
                        log=lambda m: print(m, flush=True), should_stop=lambda: stop["now"])
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    print(clean_text(report.summary(time.monotonic() - started)), flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover - use python -m storage.io follow
    sys.exit(2)
