"""How a follower (storage/ingest/follow.py) reads each kind of file: appended JSONL (generic or
``messages``) a range of new complete lines at a time, verl/TRL files whole once stable, each
checked against what was taken from it before (identity, mark or digest:
storage/ingest/tail.py); Inspect logs are storage/ingest/follow_logs.py's. The follower's rules
are in its module docstring; these are its methods, kept apart to keep each module short.

The host class provides ``dir``, ``fmt`` (its name), ``format`` (storage/ingest/registry.py),
``source(name)``, ``max_line``, ``files`` (name -> ``Tracked``), ``seen``
(name -> (identity, key) at the last poll), ``tries``, ``log``, ``should_stop``, and the methods
``_import`` (write records, then the ``imports`` row; 1 if done), ``_error``, ``_tell_once``,
``check_store``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from storage import db

from storage.ingest import feed, tail
from storage.ingest.import_batch import finish_import
from storage.ingest.report import ImportReport

PIECE_BYTES = 16 << 20  # a JSONL file's new bytes are imported in ranges of about this size
MAX_HELD = 64           # JSONL files kept open (to drain after a rotation); others reopened
MAX_TRIES = 3


@dataclass
class Tracked:
    """What the follower knows of one name in DIR."""
    ident: tuple[int, int] | None = None  # (st_dev, st_ino); None: known only from the store
    key: tuple | None = None              # (size, mtime_ns, ctime_ns) when last handled
    offset: int | None = 0                # bytes taken (None: an unmarked row of an old version)
    check: str | None = None              # mark (JSONL) or digest (verl/TRL) of [0, offset)
    scanned: int = 0                      # JSONL: no newline in [offset, scanned)
    told_long: bool = False               # JSONL: the unfinished line was reported too long
    fd: int | None = None                 # JSONL: held open, to drain after a rotation
    taken: tuple[str, frozenset] | None = None  # Inspect: (eval id, samples taken) of a log
                                                # still being written


def stat_key(st: os.stat_result) -> tuple:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


class Pollers:
    """The per-format halves of ``Follower``."""

    # -- appended JSONL ----------------------------------------------------------------------
    def _poll_appended(self, path: Path, st: os.stat_result, root: str) -> int:
        name, ident, made = path.name, tail.identity(st), 0
        t = self.files.setdefault(name, Tracked())
        if t.ident is not None and t.ident != ident:
            made += self._drain(name, t)
            self.log(f"{name} is a new file (replaced or rotated): reading it from the start")
            t = self.files[name] = Tracked()
        if t.ident == ident and t.key == stat_key(st):
            return made  # unchanged since the last look
        fd = t.fd
        if fd is None:
            try:
                fd = tail.open_inside(path, root)
            except OSError as exc:
                self._tell_once(name, f"not read: {exc}")
                return made
            if tail.identity(os.fstat(fd)) != ident:
                os.close(fd)
                return made  # replaced between the look and the open: next poll
            if sum(x.fd is not None for x in self.files.values()) < MAX_HELD:
                t.fd = fd
        try:
            t.ident, t.key = ident, stat_key(st)  # the stat before reading: later bytes, next poll
            made += self._read_new(name, t, fd)
        finally:
            if t.fd != fd:
                os.close(fd)
        return made

    def _read_new(self, name: str, t: Tracked, fd: int) -> int:
        """Import the complete lines after ``t.offset``, if the bytes before it are still there."""
        size = os.fstat(fd).st_size
        if t.offset and (size < t.offset or (t.check and tail.mark(fd, t.offset) != t.check)):
            why = "shrank" if size < t.offset else "was rewritten"
            self.log(f"{name} {why} since byte {t.offset}: reading it again from the start "
                     "(trajectories already imported are skipped)")
            t.offset, t.check, t.scanned, t.told_long = 0, None, 0, False
        t.offset = t.offset or 0
        stop = tail.complete_end(fd, max(t.offset, t.scanned), size)
        if stop is None:
            t.scanned = size
            if size - t.offset > self.max_line and not t.told_long:
                t.told_long = True
                self._error(name, f"the line at byte {t.offset} is longer than the limit of "
                                  f"{self.max_line} bytes (--max-line-bytes) and not finished: "
                                  "it will fail alone; the lines after it are read once it ends")
            return 0
        made = 0
        while t.offset < stop and not self.should_stop():
            start = t.offset
            made += self._import_range(name, t, fd, stop)
            if t.offset == start:
                break  # failed (tried again next poll) or the file changed under us
        if t.offset < stop:
            t.key = None  # not all taken: look again next poll even if the file is unchanged
        t.scanned = max(t.scanned, t.offset)
        t.told_long = t.told_long and t.offset < stop
        return made

    def _import_range(self, name: str, t: Tracked, fd: int, stop: int) -> int:
        start, progress = t.offset, [t.offset, t.check]
        items = feed.appended_items(self.format, fd, self.source(name), start, stop,
                                    self.max_line, start + PIECE_BYTES, progress)
        made = self._import(name, items, lambda: tuple(progress), start)
        if made or self.tries.get(f"{name}#{start}", 0) >= MAX_TRIES:
            t.offset, t.check = progress
        return made

    def _drain(self, name: str, t: Tracked) -> int:
        """The complete lines a file got before it was rotated away or replaced; then close it."""
        if t.fd is None:
            return 0
        try:
            return self._read_new(name, t, t.fd)
        finally:
            os.close(t.fd)
            t.fd = None

    # -- whole files (verl, TRL) ---------------------------------------------------------------
    def _poll_whole(self, path: Path, st: os.stat_result, root: str) -> int:
        name, now_seen = path.name, (tail.identity(st), stat_key(st))
        previous, self.seen[name] = self.seen.get(name), now_seen
        t = self.files.get(name)
        if t is not None and (t.ident, t.key) == now_seen:
            return 0  # imported (or refused) as it is now
        if t is not None and t.offset is None and t.ident is None:
            t.ident, t.key = now_seen  # imported by an older follower: taken as it is now
            return 0
        if previous != now_seen:
            return 0  # not stable yet
        try:
            fd = tail.open_inside(path, root)
        except OSError as exc:
            self._tell_once(name, f"not read: {exc}")
            return 0
        try:
            if tail.identity(os.fstat(fd)) != now_seen[0] or not self.format.complete(fd):
                return 0
            size = now_seen[1][0]
            if t is not None and t.offset:
                same = size >= t.offset and tail.digest(fd, t.offset)[0] == t.check
                if not same:
                    return self._refuse(name, fd, size, now_seen)
                if size == t.offset:
                    t.ident, t.key = now_seen
                    return 0
                self.log(f"{name} grew after its import: importing its new lines")
            check = tail.digest(fd, size)[0]
            items = feed.whole_items(self.format, fd, self.source(name), size, self.max_line)
            made = self._import(name, items, lambda: (size, check), 0)
            if made or self.tries.get(f"{name}#0", 0) >= MAX_TRIES:
                self.files[name] = Tracked(*now_seen, offset=size, check=check)
            return made
        finally:
            os.close(fd)

    def _refuse(self, name: str, fd: int, size: int, now_seen: tuple) -> int:
        """A verl/TRL file rewritten with other content after its import: said and recorded
        (its rows keep the first content's ids; importing it here would drop it silently)."""
        check, lines = tail.digest(fd, size)
        message = (f"rewritten with other content after it was imported into run {self.run_id}: "
                   "not imported again (its trajectory ids are taken by the first content); "
                   "import this file into a run of its own with python -m storage.io import "
                   "FILE --run-id NEW")
        self._error(name, message)
        report = ImportReport(self.run_id, tail.source_name(name, 0, size, check), self.fmt,
                              lines=lines, failed=lines, errors=[message])
        try:
            self.check_store()
            finish_import(self.db, self.run_id, self.fmt, {"name": self.run_name,
                          "config": None, "created": False}, report, live=True)
        except (db.StoreError, OSError) as exc:
            self.log(f"error: could not record the refusal of {name}: {exc}")
        self.files[name] = Tracked(*now_seen, offset=size, check=check)
        return 0
