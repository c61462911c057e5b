"""How a follower (storage/ingest/follow.py) takes Inspect AI logs while an evaluation writes them
(``--format inspect``): the ``.eval`` and ``.json`` files directly in ``DIR`` (not ``logs.json``
and ``eval-set.json``, an eval set's listings, nor hidden files such as Inspect's
``.inspect_tmp_*.writing``).

Inspect writes a log by replacing it whole (a temporary file renamed over it) every few samples,
and once more when the eval ends (with ``header.json``, the results and stats). So a log is
read once it holds still for one poll (its identity, size and times the same twice), and read
again whenever it changed:

* a log still being written (``_journal/start.json`` and no ``header.json``; a ``.json`` with
  status ``started``): its samples written so far are imported, and their keys are remembered
  (with the eval id), so the next version of the log reads only the samples that are new;
* the finished log: its new samples, then the run's config (eval spec, status, results) and
  metrics as storage/ingest/inspect_import.py's ``import_log`` writes them; the keys are then
  forgotten, so memory holds only the sample keys of logs still running.

Every log lands in the run of its task and model, ``{base}-{task}-{model}-{hash}``
(``group_run_id``), where ``base`` is ``--run-id`` or the id ``import DIR`` derives, with the
trajectory ids ``import DIR`` gives (``{eval id}/{sample}:epoch{n}``): following and importing
the directory agree, and a sample already in its run is skipped, never duplicated -- also when a
log is rewritten after the eval (``inspect score``, a header edited in the viewer), which is
imported again: a sample whose scores the rewrite changed takes the new ones, the old kept in its
info (storage/ingest/import_batch.py ``_rescore``). Each import leaves an ``imports`` row ``{file}#0-{size}~{digest}`` (SHA-1 of
the whole file, storage/ingest/tail.py), so a restarted follower leaves a log whose bytes are
still the imported ones alone, and reads a changed one again (duplicates skipped).

A file that is no readable log (not a zip, no header, bad JSON) is reported by name once per
version and left alone until it changes; a sample that cannot be read fails alone, named by file,
sample and epoch (storage/ingest/inspect_log.py), and the rest import. Memory: one sample at a
time (a ``.json`` log is read whole, up to its cap), one batch of rows, and the keys above.
"""
from __future__ import annotations

import os
from pathlib import Path

from storage import db
from storage.ingest import tail
from storage.ingest.inspect_import import import_log
from storage.ingest.import_batch import record_failure
from storage.ingest.inspect_log import InspectLog, opening_error
from storage.ingest.pollers import MAX_TRIES, Tracked, stat_key
from storage.recorder import clean_text

NOT_LOGS = ("logs.json", "eval-set.json")


def is_log(path: Path) -> bool:
    """Whether a name in DIR is one a follower takes as an Inspect log."""
    return path.suffix in (".eval", ".json") and path.name not in NOT_LOGS \
        and not path.name.startswith(".")


class LogPoller:
    """``Follower``'s Inspect half; the host provides what storage/ingest/pollers.py lists, and
    ``run_ids`` (the runs its logs went into) and ``store_gone`` (the exception that stops)."""

    def _poll_log(self, path: Path, st: os.stat_result, root: str) -> int:
        name, now_seen = path.name, (tail.identity(st), stat_key(st))
        previous, self.seen[name] = self.seen.get(name), now_seen
        t = self.files.get(name)
        if t is not None and (t.ident, t.key) == now_seen:
            return 0  # taken (or reported) as it is now
        if previous != now_seen:
            return 0  # being replaced by Inspect: wait until it holds still one poll
        fd = tail.open_inside(path, root)
        try:
            if tail.identity(os.fstat(fd)) != now_seen[0]:
                return 0  # replaced between the look and the open: next poll
            size = now_seen[1][0]
            check = tail.digest(fd, size)[0]
            if t is not None and (t.offset, t.check) == (size, check):
                t.ident, t.key = now_seen  # the bytes imported before (a restart)
                return 0
            return self._take_log(path, fd, t, now_seen, (size, check))
        finally:
            os.close(fd)

    def _take_log(self, path: Path, fd: int, t: Tracked | None, now_seen: tuple,
                  mark: tuple[int, str]) -> int:
        name = path.name
        try:
            log = InspectLog(path, fp=os.fdopen(os.dup(fd), "rb"))
        except Exception as exc:  # any exception opening it (RecursionError, MemoryError)
            self._unreadable(name, tail.source_name(name, 0, *mark), opening_error(path, exc))
            self.files[name] = Tracked(*now_seen, offset=mark[0], check=mark[1])
            return 0
        with log:
            eval_id = str(log.spec.get("eval_id") or name)
            skip = t.taken[1] if t is not None and t.taken and t.taken[0] == eval_id \
                else frozenset()
            made = self._import_log(name, log, skip, tail.source_name(name, 0, *mark))
            if made or self.tries.get(f"{name}#0", 0) >= MAX_TRIES:
                taken = None if log.finished else (eval_id, frozenset(log.keys) if made else skip)
                self.files[name] = Tracked(*now_seen, offset=mark[0], check=mark[1], taken=taken)
        return made

    def _unreadable(self, name: str, source: str, message: str) -> None:
        """Say why the log ``name`` failed (once per version of the file) and record it in
        ``imports`` under the follower's base run id, so a restarted follower leaves this
        version alone too (storage/ingest/follow.py reads those rows back)."""
        self._error(name, f"not read: {message}")
        try:
            self.check_store()
            record_failure(self.db, self.run_id, "inspect", source, [clean_text(message)])
        except (db.StoreError, OSError) as exc:
            self.log(f"error: could not record the failure of {name}: {exc}")

    def _import_log(self, name: str, log: InspectLog, skip: frozenset, source: str) -> int:
        """``import_log``, with the follower's rules: a lock held too long is tried again (at
        most ``MAX_TRIES``), a store gone stops; 1 if done."""
        attempt = f"{name}#0"
        try:
            self.check_store()
            report = import_log(log, self.db, self.run_id, source, self.given_name, skip,
                                self.check_store, self.split)
        except (db.StoreError, OSError) as exc:
            self.check_store()  # the store went away under the write: that is why, stop
            self.tries[attempt] = self.tries.get(attempt, 0) + 1
            if self.tries[attempt] >= MAX_TRIES:
                self._error(name, f"given up after {MAX_TRIES} tries: {exc}")
            return 0
        except Exception as exc:  # anything else: this log fails alone, is not tried again as
            if isinstance(exc, self.store_gone):  # it is (nor after a restart), and is said
                raise
            self.check_store()
            self.tries[attempt] = MAX_TRIES
            self._unreadable(name, source, f"could not be imported: {type(exc).__name__}: "
                                           f"{exc}")
            return 0
        self.tries.pop(attempt, None)
        self.run_ids.add(report.run_id)
        self.report.files += 1
        self.report.trajectories += report.imported
        self.report.skipped += report.skipped
        self.report.rescored += report.rescored
        self.report.failed += report.failed
        for line in report.errors[:5]:
            self._error(name, line)
        state = "finished" if log.finished else "still being written"
        self.log(clean_text(f"imported {name} ({state}): {report.imported} new, "
                            f"{report.skipped} already present"
                            + (f" ({report.rescored} rescored)" if report.rescored else "")
                            + f", {report.failed} failed, "
                            f"{len(skip)} taken before -> run {report.run_id}"))
        return 1
