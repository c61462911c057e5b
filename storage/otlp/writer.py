"""The receiver's deriving step: trajectories from the spans already stored.

The raw spans and log records are in the store before the client was answered
(storage/otlp/store.py). ``Writer.flush`` runs on one thread every ``Bounds.flush_s`` after that:
it takes the conversations that changed or close (storage/otlp/assemble.py ``take``), reads back
the stored records of any that were in the store before (``reload``: a late span, a restart),
and writes their trajectories through the import batch writer (storage/ingest/import_batch.py,
``replace``: a running agent's trajectory is rewritten as it grows), all in one transaction with
one DELETE and one INSERT per table for every run (``write_runs``), so an OTLP run is an
ordinary imported run (``runs.source`` = ``import:otlp``) to every page; it bumps each written
run's ``updated_at``, and every ``METRICS_EVERY_S``, in the same transaction, refreshes the
derived metrics of each run that changed.

A trajectory whose spans raise anywhere in its assembly fails alone: it is named in the run's
import report and the log, its raw spans stay stored, and the rest are written. A trajectory
the store refuses rolls the transaction back and each run is then written alone, the refused
trajectory reported. A write that fails (the store locked past its timeout, gone) puts the
conversations back to be derived at the next flush; nothing is lost, since the spans are
stored.

On start (``recover``) every trajectory whose stored spans were not all derived, or were derived
while open (a receiver killed before it closed them), is derived again from all its stored
records at the first flush, and closed.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from storage import db
from storage.failures import classify
from storage.ingest.import_batch import (TRAJ_TABLES, WRITE_ERRORS, count, finish_import,
                                         write_batch, write_runs)
from storage.ingest.report import ImportReport
from storage.ingest.step_metrics import rederive_metrics
from storage.interchange import LineError, to_rows, validate
from storage.migrations import prepare
from storage.otlp.assemble import Assembler, OpenTrace, key_of, log_key
from storage.otlp.record import build_record
from storage.otlp.store import StoreDown, errors_of
from storage.otlp.stored import known_rows, move, pending, read_records, stored_records
from storage.recorder import clean_text, now, to_json

FORMAT = "otlp"
METRICS_EVERY_S = 10.0  # a run's metrics (a statement or two per run, on the one writer)


def derive(t: OpenTrace, closed: bool) -> tuple[dict, dict]:
    """(the trajectory's rows, its record) as ``to_rows`` makes them; raises what the
    assembly or the validation raises."""
    rec = build_record(t, closed, given=(t.scored or {}).get("given"))
    if t.scored:
        rec["info"]["otel"]["scored"] = t.scored["scored"]
    return to_rows(validate(rec), classify), rec


def scored_facts(con, keys: list[tuple[str, str]]) -> dict[tuple[str, str], dict]:
    """The facts a scores file gave each stored trajectory of ``keys`` that has them
    (``info.otel.scored``): its reward, success, reward source and, if the file named it, task;
    a re-derivation (a late span, a restart) applies them again over the spans' own."""
    out: dict[tuple[str, str], dict] = {}
    for run_id in {k[0] for k in keys}:
        ids = [k[1] for k in keys if k[0] == run_id]
        for traj_id, reward, success, task_id, info in con.execute(
                "SELECT traj_id, reward, success, task_id, info FROM trajectories WHERE run_id = ? "
                "AND traj_id IN (SELECT unnest(?))", [run_id, ids]).fetchall():
            otel = (json.loads(info or "{}") or {}).get("otel") or {}
            mark = otel.get("scored")
            if not isinstance(mark, dict):
                continue
            given = {"reward": reward, "success": success, "source": otel.get("reward_source")}
            if mark.get("task_id"):
                given["task_id"] = task_id
            out[(run_id, traj_id)] = {"given": given, "scored": mark}
    return out


def derive_all(items: list[tuple[OpenTrace, bool]]) -> list[tuple[bool, object, object]]:
    """``derive`` of each: (True, rows, record), or (False, why, None) for one that raises
    (what a worker process sends back: its exceptions need not survive pickling)."""
    out = []
    for t, closed in items:
        try:
            out.append((True, *derive(t, closed)))
        except Exception as exc:  # noqa: BLE001 (a span no convention expects: it alone)
            out.append((False, str(exc) if isinstance(exc, LineError) else
                        f"could not be assembled: {type(exc).__name__}: {exc}", None))
    return out


def _ready() -> bool:
    return True


def _follow_parent(parent: int) -> None:
    """In the worker: end with the receiver, even one killed with SIGKILL."""
    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)
    threading.Thread(target=watch, daemon=True).start()


class Writer:
    """Derives the assembler's conversations into the store at ``db_path`` (module docstring)."""

    def __init__(self, db_path, assembler: Assembler, log=None, recover: bool = True,
                 process: bool = False):
        self.db_path, self.assembler = db_path, assembler
        self.pool = None
        if process:  # one worker process derives; started now (its imports take ~1-2 s)
            self.pool = ProcessPoolExecutor(1, multiprocessing.get_context("spawn"),
                                            _follow_parent, (os.getpid(),))
            self.pool.submit(_ready).result()
        self.log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        self.runs: dict[str, dict] = {}
        self.reports: dict[str, ImportReport] = {}
        self.behind = False
        self.derived = 0
        self.failed = 0
        self.metrics_at = 0.0
        self.lock = threading.Lock()  # one flush at a time (the deriver thread, then SIGINT)
        self.appender = None          # set by the receiver once it serves (storage/otlp/store.py)
        prepare(db_path)
        assembler.remember(known_rows(db_path))
        self.recovered = self._recover() if recover else 0

    def _recover(self) -> int:
        """Trajectories left pending by an earlier receiver: derived and closed at once."""
        a = self.assembler
        stale = a.clock() - a.bounds.idle_s
        rows = pending(self.db_path)
        with a.lock:
            for run_id, traj_id, trace_id in rows:
                key = key_of(trace_id, traj_id)
                a.open.setdefault(key, OpenTrace(key, run_id, traj_id, last_seen=stale,
                                                 reload=True, dirty=True))
        if rows:
            self.log(f"deriving {len(rows)} trajectory(ies) whose stored spans an earlier "
                     "receiver had not all derived or left open")
        return len(rows)

    def _run(self, run_id: str, rec: dict | None) -> dict:
        if run_id not in self.runs:
            service = (((rec or {}).get("info") or {}).get("otel") or {}).get("service") \
                or run_id
            self.runs[run_id] = {"name": f"otlp {service}", "config": (rec or {}).get("run"),
                                 "created": False, "refresh_config": False}
            self.reports[run_id] = ImportReport(run_id, "otlp receiver", FORMAT)
        return self.runs[run_id]

    def flush(self, final: bool = False) -> int:
        """Derive everything due; returns how many trajectories were written."""
        with self.lock:
            dirty, closing = self.assembler.take(final)
            # a trace whose root came closes within ``grace_s``: derived once then, not twice
            dirty = [t for t in dirty if t.root_seen_at is None]
            todo = [(t, False) for t in dirty] + [(t, True) for t in closing]
            if not todo:
                self._metrics(final)
                return 0
            try:
                self._reload([t for t, _ in todo if t.reload])
            except Exception as exc:  # noqa: BLE001 (the store: derived again next flush)
                self._put_back(todo, exc)
                return 0
            batches, lines = self._records(todo)
            moves = [(t.run_id, list(t.absorbed), t.traj_id) for t, _ in todo if t.absorbed]
            metrics = not final and self._metrics_due()
            def write(con):
                self._moves(con, moves)
                done = write_runs(con, FORMAT, [(run_id, self.runs[run_id], batch)
                                                for run_id, batch in batches.items()])
                if batches:  # what a page keys its cached reads on, at every write
                    con.execute("UPDATE runs SET status = 'running', updated_at = ? WHERE run_id "
                                "IN (SELECT unnest(?))", [now(), list(batches)])
                if metrics:
                    self._write_metrics(con)
                return done

            try:  # one transaction for all of it: see the docstring
                counts = self._write(write)
            except (db.StoreError, OSError, StoreDown) as exc:
                self._put_back(todo, exc)
                return 0
            except WRITE_ERRORS as exc:  # a trajectory the store refuses: find it, keep the rest
                try:
                    self._write(lambda con: self._moves(con, moves))
                except Exception as exc2:  # noqa: BLE001
                    self._put_back(todo, exc2)
                    return 0
                self.log(f"error: a trajectory was refused ({type(exc).__name__}: "
                         f"{clean_text(str(exc))[:200]}); writing each alone")
                written = self._write_each_run(batches, lines)
            else:
                written = 0
                for run_id, c in counts.items():
                    count(self.reports[run_id], c)
                    self.reports[run_id].lines += lines.get(run_id, 0)
                    written += c[0] + c[1]
                if metrics:
                    self._metrics_written()
            for t, _ in todo:
                t.absorbed = []
            self.derived += written
            self.behind = False
            self._metrics(final)
            return written

    def _write(self, fn):
        """``fn(con)`` in one transaction: on a cursor of the appender's connection while it
        runs (one open of the store, beside the group commits: storage/otlp/store.py), else
        on a connection of its own."""
        if self.appender is not None and not self.appender.stopping:
            return self.appender.run(fn)
        with db.writing(self.db_path) as con:
            return fn(con)

    def _read(self, keys):
        """``stored_records`` of ``keys``, on the appender's connection while it runs."""
        if not keys:
            return {}
        if self.appender is not None and not self.appender.stopping:
            return self.appender.run(lambda con: read_records(con, keys))
        return stored_records(self.db_path, keys)

    def _moves(self, con, moves) -> None:
        for run_id, absorbed, into in moves:
            move(con, run_id, absorbed, into)
            for table in TRAJ_TABLES:
                con.execute(f"DELETE FROM {table} WHERE run_id = ? AND traj_id IN "
                            "(SELECT unnest(?))", [run_id, absorbed])

    def _reload(self, reopened: list[OpenTrace]) -> None:
        """Read back every stored record of conversations the store held before."""
        keys = {t.key: [(t.run_id, x) for x in [t.traj_id, *t.absorbed]] for t in reopened}
        stored = self._read([k for ks in keys.values() for k in ks])
        scored = self._scored([k for ks in keys.values() for k in ks])
        with self.assembler.lock:
            for t in reopened:
                for k in keys[t.key]:
                    spans, logs = stored[k]
                    for s in spans:
                        t.spans.setdefault(s.span_id, s)
                        t.ids.add(s.span_id)
                    for r in logs:
                        if log_key(r) not in t.log_keys:
                            t.log_keys.add(log_key(r))
                            t.logs.append(r)
                t.scored = t.scored or next((scored[k] for k in keys[t.key] if k in scored),
                                            None)
                t.reload = False

    def _scored(self, keys) -> dict:
        """``scored_facts`` of ``keys``, on the appender's connection while it runs."""
        if not keys:
            return {}
        if self.appender is not None and not self.appender.stopping:
            return self.appender.run(lambda con: scored_facts(con, keys))
        with db.reading(self.db_path) as con:
            return scored_facts(con, keys)

    def _put_back(self, todo, exc) -> None:
        """A failed derivation: the conversations are derived again at a later flush."""
        self.behind = True
        self.log(f"error: could not write to the store ({type(exc).__name__}: "
                 f"{clean_text(str(exc))[:300]}); deriving {len(todo)} trajectories again later")
        self.assembler.put_back(todo)

    def _records(self, todo) -> tuple[dict[str, list], dict[str, int]]:
        """Each trajectory's rows, by run (one that raises or does not validate is reported and
        left out), and how many closed per run."""
        batches: dict[str, list] = {}
        lines: dict[str, int] = {}
        items = []
        for t, closed in todo:
            with self.assembler.lock:  # a snapshot: receiving goes on while it is assembled
                snapshot = replace(t, spans=dict(t.spans), logs=list(t.logs), ids=set(),
                                   log_keys=set())
            if snapshot.spans or snapshot.logs:
                items.append((snapshot, closed))
        for (t, closed), (ok, rows, rec) in zip(items, self._derive_all(items)):
            where = f"trace {t.traj_id}"
            if not ok:
                self._run(t.run_id, None)
                self.reports[t.run_id].fail(where, clean_text(rows)[:500])
                self.failed += 1
                self.log(f"error: {clean_text(where)}: {clean_text(rows)[:300]} (its spans are "
                         "stored; the other trajectories are written)")
                continue
            run = self._run(t.run_id, rec)
            if run["config"] is None or run["config"].get("model") == "unknown":
                run["config"], run["refresh_config"] = rec["run"], True
            run["changed"] = True
            batches.setdefault(t.run_id, []).append((where, rows))
            lines[t.run_id] = lines.get(t.run_id, 0) + closed
        return batches, lines

    def _derive_all(self, items):
        """``derive_all`` in the worker process when there is one (the derivation's CPU off
        the interpreter the acknowledgements need), else here; a worker that fails is given
        up for the rest of the run (logged) and its items derived here."""
        if self.pool is not None and items:
            try:
                return self.pool.submit(derive_all, items).result()
            except Exception as exc:  # noqa: BLE001 (a broken or unpicklable worker: here)
                self.log(f"error: the deriving process failed ({type(exc).__name__}: "
                          f"{clean_text(str(exc))[:200]}); deriving in the receiver's process")
                self.close()
        return derive_all(items)

    def close(self) -> None:
        """Stop the worker process (if any)."""
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _write_each_run(self, batches: dict[str, list], lines: dict[str, int]) -> int:
        """The slow path after a combined write failed: each run's batch in its own
        transaction, and within it each trajectory alone if need be (``write_batch``)."""
        written = 0
        for run_id, batch in batches.items():
            report = self.reports[run_id]
            report.lines += lines.get(run_id, 0)
            before = report.imported + report.replaced
            try:
                write_batch(self.db_path, run_id, FORMAT, self.runs[run_id], batch, True, report)
            except WRITE_ERRORS + (db.StoreError,) as exc:
                report.fail(f"run {run_id}", f"{type(exc).__name__}: {exc}")
                self.log(f"error: run {run_id}: {clean_text(str(exc))[:300]}")
            written += report.imported + report.replaced - before
        return written

    def _metrics_due(self) -> bool:
        return time.monotonic() - self.metrics_at >= METRICS_EVERY_S

    def _write_metrics(self, con) -> None:
        """Every run's derived metrics, config and status, inside the caller's transaction."""
        for run_id, run in self.runs.items():
            if not run.get("changed", True):  # nothing derived since its last refresh
                continue
            if run.get("refresh_config") and run["config"]:
                config = {"env": "otel", "model": "unknown", "algo": "none", **run["config"]}
                con.execute("UPDATE runs SET config = ? WHERE run_id = ?",
                            [to_json(config), run_id])
            rederive_metrics(con, run_id)
            con.execute("UPDATE runs SET status = 'running', updated_at = ?, last_step = "
                        "(SELECT max(step) FROM trajectories WHERE run_id = ?) "
                        "WHERE run_id = ?", [now(), run_id, run_id])

    def _metrics(self, final: bool) -> None:
        """Derived metrics and status of each run, every ``METRICS_EVERY_S`` (one transaction
        for all runs) and at the end (``finish_import``, each run)."""
        if final:
            self.metrics_at = time.monotonic()
            for run_id, run in self.runs.items():
                try:
                    finish_import(self.db_path, run_id, FORMAT, run, self.reports[run_id])
                except Exception as exc:  # noqa: BLE001 (one run's end must not stop the rest)
                    self.log(f"error: run {run_id} could not be finished: "
                             f"{type(exc).__name__}: {clean_text(str(exc))[:300]}")
            return
        if not any(r.get("changed", True) for r in self.runs.values()) \
                or not self._metrics_due():
            return
        try:
            self._write(self._write_metrics)
        except Exception as exc:  # noqa: BLE001 (metrics are refreshed again later)
            if not errors_of(exc):
                self.log(f"error: metrics: {type(exc).__name__}: {clean_text(str(exc))[:300]}")
            return
        self._metrics_written()

    def _metrics_written(self) -> None:
        self.metrics_at = time.monotonic()
        for run in self.runs.values():
            run["refresh_config"] = run["changed"] = False
