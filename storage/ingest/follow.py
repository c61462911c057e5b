"""Follow a directory another trainer writes into and import each new complete file, live.

    python -m storage.io follow DIR --db PATH --format {verl,trl,jsonl,messages,inspect}
                                [--run-id ID] [--run-name NAME] [--poll SECONDS]
                                [--max-line-bytes N]

* ``verl``: ``DIR`` is ``trainer.rollout_data_dir``; each ``{step}.jsonl`` (storage/ingest/dumps.py's
  verl reader) is imported once it is complete.
* ``trl``: ``DIR`` is ``<output_dir>/completions`` of a run with ``log_completions=True``; each
  ``completions_*.parquet`` once complete.
* ``jsonl``: generic JSONL (storage/interchange.py) appended by any agent loop, one or more
  ``*.jsonl`` files in ``DIR``; each new *complete line* is imported as soon as it is there.
* ``messages``: OpenAI-style conversations (storage/ingest/messages.py), followed as ``jsonl``.
* ``inspect``: an Inspect AI log directory; each log's samples as Inspect writes them, one run
  per task and model (storage/ingest/follow_logs.py: its own rules, and where they differ).

Only files directly in ``DIR`` are watched, and only those whose real path is inside ``DIR``: a
link pointing out of it is never opened (said once). Everything goes into one run, by default the
run ``python -m storage.io import DIR`` would create (``default_run_id(DIR)``), with the same
trajectory ids, so following and a later import of the same directory agree.

When a file counts as complete (never a half-written one): its size and modification time are
the same on two successive polls, and it ends the way a finished file of its kind ends (a verl
file with a newline, a Parquet file with its ``PAR1`` footer). For appended JSONL only the bytes
up to the last newline are taken; the rest waits for its newline.

Which file is which (storage/ingest/tail.py): a name is tracked by its file's identity (device and
inode) and by a mark of the bytes already taken (the first and the last 4 KiB of them; for
verl/TRL files a digest of the whole file). A name whose identity changed (atomic rename,
logrotate) is a new file, read from its start; before that, the lines the old file got after the
last poll are still read from the descriptor held open on it (a JSONL file, also when it is
deleted or ``DIR`` goes). A JSONL file that shrank or whose mark changed (truncated and rewritten,
even to the same length) is read again from its start. Reading again never duplicates a
trajectory: one already in the run (same ``traj_id``) is skipped and counted as such. A verl or
TRL file that changes after its import is imported again once stable if the bytes imported are
still its start (its new lines are added); if they are not (rewritten with other content, whose
ids ``{file stem}:{line}`` are already taken) it is refused with an error naming it, and the refusal
is recorded in ``imports``. A ``DIR`` that vanishes is reported and followed again once it is
back. A store that is deleted or replaced while following stops the follower (exit 2): it never
writes into a new store at the same path (checked before every write).

Memory does not grow with what the files hold: lines are read one at a time and written in
batches of at most 200 records or 8 MiB of input (storage/ingest/feed.py); a line longer than
``--max-line-bytes`` (default 16 MiB, the limit ``import`` has, so both accept the same lines:
room for a 130k-token trajectory with every token's record) fails alone with a message and is
skipped a MiB at a time, never held; an unfinished line is not held or read again either (each
poll scans only the bytes that arrived since; one already over the limit is reported as soon as
it is). No file is copied. What a valid line costs is the importer's: its token rows are capped
and made as they are written (storage/token_rows.py), so about 20 times its size for text and 40
for JSON of tiny objects (docs/threat-model.md, Importing).

Idempotent and restartable: every import leaves a row in the store's ``imports`` table, its
source ``{file}#{start}-{end}~{mark}`` (JSONL: the byte range; verl/TRL: ``#0-{size}`` and the
digest). The follower starts from the latest row of each file: a file whose bytes still match is
resumed after ``end`` (JSONL) or left as imported (verl/TRL); one that does not is treated as
above. Rows written before marks were (``{file}#{start}-{end}``, a bare verl/TRL name) are
trusted as they are.

While it follows, the run is ``running`` (refreshed every ``HEARTBEAT_S`` so the Runs page does
not call it interrupted); Ctrl-C (SIGINT) or SIGTERM lets the import in progress finish, marks
the run ``finished`` and exits 0 with a summary.
"""
from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from storage import db, lake

from storage.ingest import feed, formats, tail
from storage.ingest.follow_logs import LogPoller, is_log
from storage.ingest.registry import Source
from storage.ingest.import_batch import (check_split, finish_import, record_failure, refuse_foreign,
                                         run_source)
from storage.interchange import MAX_LINE_BYTES
from storage.migrations import prepare
from storage.ingest.pollers import MAX_TRIES, Pollers, Tracked
from storage.ingest.report import ImportReport, default_run_id
from storage.recorder import check_run_id, clean_text, now

HEARTBEAT_S = 30.0


class StoreGone(RuntimeError):
    """The store was deleted or replaced under the follower."""


@dataclass
class FollowReport:
    run_id: str
    files: int = 0           # whole files (verl, trl) or line ranges (jsonl) imported
    trajectories: int = 0
    skipped: int = 0         # trajectories already in the run
    rescored: int = 0        # of those, Inspect samples whose rewritten log scored them anew
    failed: int = 0          # records that could not be imported (see the imports table)
    errors: list[str] = field(default_factory=list)
    stopped: str | None = None  # why it stopped by itself (the store went away)

    def summary(self, seconds: float) -> str:
        return (f"followed for {seconds:.0f} s: {self.files} imports, {self.trajectories} "
                f"trajectories imported, {self.skipped} already present"
                + (f" ({self.rescored} rescored)" if self.rescored else "")
                + f", {self.failed} failed "
                f"-> run {self.run_id}")


def _latest_sources(db_path, run_id: str, fmt: str) -> list[tuple[str, str]]:
    """(run, source) of the run's imports, oldest first; for ``inspect`` those of every run of
    the directory (``{base}-{task}-{model}-{hash}``, storage/ingest/inspect_import.py)."""
    multi = formats.get(fmt).multi_run
    where = "run_id = ?" if not multi else \
        "(starts_with(run_id, ? || '-') OR run_id = ?) AND format = ?"
    base = [run_id] if not multi else [run_id[:70], run_id, fmt]  # run_id: logs that failed
    with db.reading(db_path) as con:                                 # before naming their run
        return con.execute(f"SELECT run_id, source FROM imports WHERE {where} "
                           "ORDER BY imported_at, rowid", base).fetchall()


def _set_running(db_path, run_id: str, status: str = "running") -> None:
    with db.writing(db_path) as con:
        con.execute("UPDATE runs SET status = ?, error = NULL, updated_at = ? "
                    "WHERE run_id = ? AND source LIKE 'import%'", [status, now(), run_id])


class Follower(Pollers, LogPoller):
    """Polls ``directory`` and imports what is complete; ``poll_once`` does one round."""

    store_gone = StoreGone

    def __init__(self, directory, db_path, fmt: str, run_id: str | None = None,
                 run_name: str | None = None, log: Callable[[str], None] = print,
                 max_line_bytes: int = MAX_LINE_BYTES,
                 should_stop: Callable[[], bool] = lambda: False, split: str | None = None,
                 tokenizer=None):
        self.format = formats.get(fmt)  # ValueError naming the formats for an unknown one
        if not max_line_bytes > 0:
            raise ValueError(f"--max-line-bytes must be a positive number, got {max_line_bytes}")
        self.dir = Path(directory)
        if not self.dir.is_dir():
            raise FileNotFoundError(f"no such directory: {self.dir}")
        self.db, self.fmt, self.log, self.max_line = db_path, fmt, log, max_line_bytes
        self.should_stop = should_stop
        self.run_id = check_run_id(run_id) if run_id else default_run_id(self.dir)
        self.run_name = run_name or self.dir.resolve().name
        self.given_name = run_name  # Inspect: else each run is named by its task and model
        self.split = check_split(split)  # else the records' own (the format's rule)
        self.tokenizer = tokenizer  # verifiers: token ids decoded into their text
        multi = self.format.multi_run
        self.run_ids = {self.run_id} if not multi else set()  # marked finished at the end
        self.report = FollowReport(self.run_id)
        self.seen: dict[str, tuple] = {}       # name -> (identity, key) at the last poll
        self.tries: dict[str, int] = {}
        self.told: set[str] = set()            # names already reported (links out of DIR)
        self.dir_gone = False
        prepare(db_path)
        self.store = tail.identity(os.stat(db_path))
        refuse_foreign(self.run_id, run_source(db_path, self.run_id))  # never a trainer's run
        self.files: dict[str, Tracked] = {}
        for rid, source in _latest_sources(db_path, self.run_id, fmt):  # a file's latest row
            parsed = tail.parse_source(source)                           # wins
            if parsed:
                name, _, end, check = parsed
                self.files[name] = Tracked(offset=end, check=check, scanned=end)
                if not multi or rid != self.run_id:  # (an Inspect log that failed)
                    self.run_ids.add(rid)
            elif self.format.followed == "whole":
                self.files[source] = Tracked(offset=None)

    def close(self) -> None:
        for t in self.files.values():
            if t.fd is not None:
                os.close(t.fd)
                t.fd = None

    def check_store(self) -> None:
        """StoreGone unless the store file is still the one the follower started with."""
        try:
            same = tail.identity(os.stat(self.db)) == self.store
        except FileNotFoundError:
            same = False
        if not same:
            raise StoreGone(f"the store {self.db} was deleted or replaced while following: "
                            "stopped (a follower never writes into a new store at that path)")

    def _root(self) -> str | None:
        """DIR's real path, or None while it is gone (reported once, and once when back)."""
        if self.dir.is_dir():
            if self.dir_gone:
                self.dir_gone = False
                self.log(f"{self.dir} is back: following it again")
            return os.path.realpath(self.dir)
        if not self.dir_gone:
            self.dir_gone = True
            self._error(None, f"{self.dir} is gone (removed or renamed): waiting for it to come "
                              "back")
        return None

    def poll_once(self) -> int:
        """One look at the directory; the number of imports made."""
        self.check_store()
        root, made, present = self._root(), 0, set()
        try:
            paths = sorted(self._listing(), key=_order) if root else []
        except OSError:
            paths = []  # DIR went while it was listed: said at the next poll
        for path in paths:
            if self.should_stop():
                break
            try:
                if not tail.inside(path, root):
                    self._tell_once(path.name, "links outside the followed directory: never "
                                               "opened")
                    continue
                st = path.stat()
            except OSError:
                continue  # removed between the listing and now
            if not stat.S_ISREG(st.st_mode):
                continue
            present.add(path.name)
            try:
                made += self.pollers[self.format.followed](path, st, root)
            except StoreGone:
                raise
            except OSError as exc:  # an unreadable file (EIO, a permission) does not stop the rest
                self._tell_once(path.name, f"not read: {exc}")
            except Exception as exc:  # whatever else one file raises: it fails alone, said once
                self._tell_once(path.name, f"not read: {type(exc).__name__}: {exc}")
        for name, t in self.files.items():  # rotated away, deleted, or DIR gone: its last lines
            if t.fd is not None and name not in present and not self.should_stop():
                made += self._drain(name, t)
        return made

    # -- one import ----------------------------------------------------------------------------
    def _import(self, name: str, items, where: Callable[[], tuple[int, str]], start: int) -> int:
        """Write ``items``, then the imports row ``{name}#{start}-{end}~{check}``; 1 if done."""
        report = ImportReport(self.run_id, name, self.fmt)
        run = {"name": self.run_name, "config": None, "created": False, "split": self.split}
        attempt = f"{name}#{start}"
        try:
            feed.write_records(items, self.db, self.fmt, self.run_id, run, report,
                               self.check_store)
            end, check = where()
            report.source = tail.source_name(name, start, end, check)
            self.check_store()
            finish_import(self.db, self.run_id, self.fmt, run, report, live=True)
        except StoreGone:
            raise
        except (db.StoreError, OSError) as exc:
            self.check_store()  # the store went away under the write: that is why, stop
            self.tries[attempt] = self.tries.get(attempt, 0) + 1  # a lock held too long: again
            if self.tries[attempt] >= MAX_TRIES:
                self._error(name, f"given up after {MAX_TRIES} tries: {exc}")
            return 0
        except Exception as exc:  # anything else reading it: this file fails alone, is
            self.check_store()    # remembered (never tried again as it is) and said once
            self.tries[attempt] = MAX_TRIES
            self._failed_file(name, start, report, run, f"could not be imported: "
                                                       f"{type(exc).__name__}: {exc}", where)
            return 0
        self.tries.pop(attempt, None)
        self.report.files += 1
        self.report.trajectories += report.imported
        self.report.skipped += report.skipped
        self.report.failed += report.failed
        for line in report.errors[:5]:
            self._error(name, line)
        appended = self.format.followed == "appended"
        if report.lines == 0 and not appended:  # (a range of blank lines is no error)
            self._error(name, "no records in it")
        label = f"{name} bytes {start}-{end}" if appended else name
        self.log(clean_text(f"imported {label}: {report.imported} new, {report.skipped} "
                            f"already present, {report.failed} failed"))
        return 1

    def _failed_file(self, name: str, start: int, report: ImportReport, run: dict,
                     message: str, where: Callable[[], tuple[int, str]]) -> None:
        """Say why ``name`` failed, and record it in ``imports`` (its source marked as far as
        it was read), so a restarted follower does not read that version again."""
        self._error(name, message)
        report.fail(name, message)
        try:
            report.source = tail.source_name(name, start, *where())
            if run_source(self.db, self.run_id) is None:  # nothing of it written: no run yet
                record_failure(self.db, self.run_id, self.fmt, report.source, report.errors)
            else:
                finish_import(self.db, self.run_id, self.fmt, run, report, live=True)
        except Exception as exc:  # the failure is said; a restart would read the file again
            self.log(f"error: could not record the failure of {name}: {exc}")

    def _tell_once(self, name: str, message: str) -> None:
        if name not in self.told:
            self.told.add(name)
            self._error(name, message)

    def _error(self, name: str | None, message: str) -> None:
        text = clean_text(f"{name}: {message}" if name else message)
        if len(self.report.errors) < 100:
            self.report.errors.append(text)
        self.log(f"error: {text}")

    def _listing(self) -> list[Path]:
        found = {p for pattern in self.format.patterns for p in self.dir.glob(pattern)}
        return [p for p in found if self.format.followed != "log" or is_log(p)]

    @property
    def pollers(self) -> dict[str, Callable]:
        """How each kind of followed file is polled (``Format.followed``)."""
        return {"appended": self._poll_appended, "whole": self._poll_whole,
                "log": self._poll_log}

    def source(self, name: str) -> Source:
        """What the format's records know of a file of DIR (follow reads DIR alone)."""
        return Source(name, Path(name).stem, (self.dir.resolve().name,), self.tokenizer)

    def mark_runs(self, status: str) -> None:
        """Every run this follower writes into (Inspect: one per task and model) ``status``."""
        for run_id in sorted(self.run_ids):
            _set_running(self.db, run_id, status)

    def finish(self) -> None:
        try:
            self.check_store()
            self.mark_runs("finished")
        except (db.StoreError, StoreGone) as exc:
            self.log(f"error: could not mark the run(s) {', '.join(sorted(self.run_ids))} "
                     f"finished: {exc}")


def _order(path: Path) -> tuple:
    """Steps in numeric order (``9.jsonl`` before ``10.jsonl``), then by name."""
    digits = "".join(c for c in path.stem if c.isdigit())
    return (int(digits) if digits else -1, path.name)


def follow(directory, db_path, fmt: str, run_id: str | None = None, run_name: str | None = None,
           poll_s: float = 1.0, log: Callable[[str], None] = print,
           should_stop: Callable[[], bool] = lambda: False,
           max_line_bytes: int = MAX_LINE_BYTES, split: str | None = None,
           tokenizer=None) -> FollowReport:
    """Poll until ``should_stop()`` or the store goes away; see the module docstring.
    ``split``: every trajectory's split (default: the format's own); ``tokenizer``: verifiers'
    token ids decoded into their text."""
    if not poll_s > 0:
        raise ValueError(f"--poll must be a positive number of seconds, got {poll_s}")
    follower = Follower(directory, db_path, fmt, run_id, run_name, log, max_line_bytes,
                        should_stop, split, tokenizer)
    runs = "runs under" if follower.format.multi_run else "run"
    log(f"following {follower.dir} ({fmt}: {' '.join(follower.format.patterns)}) into "
        f"{db_path}, {runs} {follower.run_id}; Ctrl-C to stop")
    beat = time.monotonic()
    folds = lake.FoldSchedule(db_path, log)   # a team store's small files, every few minutes
    try:
        while not should_stop():
            follower.poll_once()
            folds.tick()
            if time.monotonic() - beat > HEARTBEAT_S and follower.report.files:
                follower.check_store()
                follower.mark_runs("running")
                beat = time.monotonic()
            deadline = time.monotonic() + poll_s
            while not should_stop() and time.monotonic() < deadline:
                time.sleep(min(0.05, poll_s))
    except StoreGone as exc:
        follower.report.stopped = str(exc)
        follower._error(None, str(exc))
    finally:
        if not follower.report.stopped and (follower.report.files or follower.files):
            follower.finish()
        follower.close()
    if follower.format.multi_run and follower.run_ids:  # the summary names the runs of its logs
        follower.report.run_id = ", ".join(sorted(follower.run_ids))
    return follower.report
