"""The receiver's writes: raw spans and log records into ``spans`` / ``span_logs``, and each
conversation's trajectory through the import batch writer (storage/ingest/import_batch.py,
``replace``: a running agent's trajectory is rewritten as it grows), so an OTLP run is an
ordinary imported run (``runs.source`` = ``import:otlp``) to every page.

``Writer.flush`` runs on one thread every ``Bounds.flush_s``: it takes what the assembler holds
(storage/otlp/assemble.py ``take``), writes the new raw records and the trajectories of every
conversation that changed, all in one transaction (one open of the store: opening and closing
it is most of a small write's cost) with one DELETE and one INSERT per table for every run
(``write_runs``); every few seconds, in the same transaction, it refreshes each run's derived
metrics. A trajectory the store refuses rolls that back and each run is then written alone,
the refused trajectory reported. A write that fails
(the store locked past its timeout, gone) puts the records back and marks the writer
``behind``, which the receiver answers with 503 and ``Retry-After`` until a write succeeds.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import replace
from typing import Any

import duckdb
import pyarrow as pa

from storage import db
from storage.ingest.import_batch import (WRITE_ERRORS, count, rederive_metrics,
                                         finish_import, write_batch, write_runs)
from storage.ingest.report import ImportReport
from storage.interchange import LineError, to_rows, validate
from storage.failures import classify
from storage.migrations import prepare
from storage.otlp.assemble import Assembler, OpenTrace, build_record
from storage.otlp.decode import LogRecord, Span
from storage.recorder import clean_column, clean_text, now, to_json

FORMAT = "otlp"
METRICS_EVERY_S = 5.0


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return to_json(value, ensure_ascii=False)


SPAN_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("traj_id", pa.string()), ("trace_id", pa.string()),
    ("span_id", pa.string()), ("parent_span_id", pa.string()), ("name", pa.string()),
    ("kind", pa.int32()), ("start_ns", pa.int64()), ("end_ns", pa.int64()),
    ("status_code", pa.int32()), ("status_message", pa.string()), ("attributes", pa.string()),
    ("resource", pa.string()), ("scope", pa.string()), ("events", pa.string()),
    ("received_at", pa.timestamp("us"))])
LOG_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("traj_id", pa.string()), ("trace_id", pa.string()),
    ("span_id", pa.string()), ("time_ns", pa.int64()), ("event_name", pa.string()),
    ("body", pa.string()), ("attributes", pa.string()), ("resource", pa.string()),
    ("received_at", pa.timestamp("us"))])


def _span_row(t: OpenTrace, s: Span, at) -> dict:
    return {"run_id": t.run_id, "traj_id": t.traj_id, "trace_id": s.trace_id,
            "span_id": s.span_id, "parent_span_id": s.parent_span_id, "name": s.name,
            "kind": s.kind, "start_ns": min(s.start_ns, 2**63 - 1),
            "end_ns": min(s.end_ns, 2**63 - 1), "status_code": s.status_code,
            "status_message": s.status_message, "attributes": _dumps(s.attributes),
            "resource": _dumps(s.resource), "scope": s.scope,
            "events": _dumps(s.events) if s.events else None, "received_at": at}


def _log_row(t: OpenTrace, r: LogRecord, at) -> dict:
    return {"run_id": t.run_id, "traj_id": t.traj_id, "trace_id": r.trace_id,
            "span_id": r.span_id, "time_ns": min(r.time_ns, 2**63 - 1),
            "event_name": r.event_name, "body": _dumps(r.body),
            "attributes": _dumps(r.attributes), "resource": _dumps(r.resource),
            "received_at": at}


def _insert(con, table: str, rows: list[dict], schema: pa.Schema) -> None:
    if not rows:
        return
    columns = {f.name: clean_column([r[f.name] for r in rows]) if f.type == pa.string()
               else [r[f.name] for r in rows] for f in schema}
    con.register("_otlp_rows", pa.Table.from_pydict(columns, schema=schema))
    con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _otlp_rows")
    con.unregister("_otlp_rows")


def stored_records(db_path, run_id: str, traj_id: str) -> tuple[list[Span], list[LogRecord]]:
    """A conversation's spans and log records as stored (a reopened one is assembled again)."""
    with db.reading(db_path) as con:
        spans = con.execute(
            "SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, attributes, "
            "resource, scope, status_code, status_message, events FROM spans WHERE run_id = ? "
            "AND traj_id = ?", [run_id, traj_id]).fetchall()
        logs = con.execute(
            "SELECT trace_id, span_id, time_ns, event_name, body, attributes, resource "
            "FROM span_logs WHERE run_id = ? AND traj_id = ?", [run_id, traj_id]).fetchall()
    load = lambda text: json.loads(text) if text else {}  # noqa: E731
    return ([Span(r[0], r[1], r[2], r[3], r[4], r[5], r[6], load(r[7]), load(r[8]), r[9],
                  r[10] or 0, r[11] or "", load(r[12]) or []) for r in spans],
            [LogRecord(r[0], r[1], r[2], r[3], load(r[4]) if r[4] else None, load(r[5]),
                       load(r[6])) for r in logs])


class Writer:
    """Writes what the assembler holds into the store at ``db_path`` (see the module docstring)."""

    def __init__(self, db_path, assembler: Assembler, log=None):
        self.db_path, self.assembler = db_path, assembler
        self.log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        self.runs: dict[str, dict] = {}
        self.reports: dict[str, ImportReport] = {}
        self.behind = False
        self.written_spans = 0
        self.metrics_at = 0.0
        self.lock = threading.Lock()  # one flush at a time (the writer thread, then SIGINT)
        prepare(db_path)

    def _run(self, run_id: str, rec: dict) -> dict:
        if run_id not in self.runs:
            service = ((rec.get("info") or {}).get("otel") or {}).get("service") or run_id
            self.runs[run_id] = {"name": f"otlp {service}", "config": rec.get("run"),
                                 "created": False, "refresh_config": False}
            self.reports[run_id] = ImportReport(run_id, "otlp receiver", FORMAT)
        return self.runs[run_id]

    def flush(self, final: bool = False) -> int:
        """Write everything due; returns how many trajectories were written."""
        with self.lock:
            dirty, closing = self.assembler.take(final)
            todo = [(t, False) for t in dirty] + [(t, True) for t in closing]
            if not todo:
                self._metrics(final)
                return 0
            with self.assembler.lock:
                fresh = {id(t): Assembler.drain_new(t) for t, _ in todo}
            try:
                self._reload([t for t, _ in todo if t.reload], fresh)
            except (db.StoreError, duckdb.Error, OSError) as exc:
                self._put_back(todo, fresh, exc)
                return 0
            batches, lines = self._records(todo)
            metrics = not final and self._metrics_due()
            try:  # one transaction (one open of the store) for all of it: see the docstring
                with db.writing(self.db_path) as con:
                    spans = self._write_raw(con, todo, fresh)
                    counts = write_runs(con, FORMAT, [(run_id, self.runs[run_id], batch)
                                                      for run_id, batch in batches.items()])
                    if metrics:
                        self._write_metrics(con)
            except (db.StoreError, OSError) as exc:
                self._put_back(todo, fresh, exc)
                return 0
            except WRITE_ERRORS as exc:  # a trajectory the store refuses: find it, keep the rest
                try:
                    with db.writing(self.db_path) as con:
                        spans = self._write_raw(con, todo, fresh)
                except (db.StoreError, duckdb.Error, OSError):
                    self._put_back(todo, fresh, exc)
                    return 0
                self.written_spans += spans
                written = self._write_each_run(batches, lines)
            else:
                self.written_spans += spans
                written = 0
                for run_id, c in counts.items():
                    count(self.reports[run_id], c)
                    self.reports[run_id].lines += lines.get(run_id, 0)
                    written += c[0] + c[1]
                if metrics:
                    self._metrics_written()
            self.behind = False
            self._metrics(final)
            return written

    def _reload(self, reopened: list[OpenTrace], fresh: dict) -> None:
        for t in reopened:
            spans, logs = stored_records(self.db_path, t.run_id, t.traj_id)
            with self.assembler.lock:
                for s in spans:
                    t.spans.setdefault(s.span_id, s)
                t.logs = logs + t.logs
                stored = {s.span_id for s in spans}
                new_spans, new_logs = fresh[id(t)]
                fresh[id(t)] = ([s for s in new_spans if s.span_id not in stored], new_logs)
                t.reload = False

    def _write_raw(self, con, todo, fresh) -> int:
        """The new spans and log records, inside the flush's transaction; how many spans."""
        at = now()
        span_rows = [_span_row(t, s, at) for t, _ in todo for s in fresh[id(t)][0]]
        log_rows = [_log_row(t, r, at) for t, _ in todo for r in fresh[id(t)][1]]
        _insert(con, "spans", span_rows, SPAN_SCHEMA)
        _insert(con, "span_logs", log_rows, LOG_SCHEMA)
        return len(span_rows)

    def _put_back(self, todo, fresh, exc) -> None:
        """A failed write: the records go back to be written by a later flush."""
        self.behind = True
        self.log(f"error: could not write to the store ({type(exc).__name__}: "
                 f"{clean_text(str(exc))[:300]}); holding {len(todo)} trajectories and retrying")
        with self.assembler.lock:
            for t, closed in todo:
                spans, logs = fresh[id(t)]
                t.new_spans[:0], t.new_logs[:0] = spans, logs
                t.dirty = True
                if closed and t.key not in self.assembler.open:
                    self.assembler.open[t.key] = t
                    self.assembler.closed.pop(t.key, None)
                    self.assembler.held += t.held

    def _records(self, todo) -> tuple[dict[str, list], dict[str, int]]:
        """Each trajectory's rows, by run (a record that does not validate is reported and
        left out), and how many closed per run."""
        batches: dict[str, list] = {}
        lines: dict[str, int] = {}
        for t, closed in todo:
            with self.assembler.lock:  # a snapshot: receiving goes on while it is assembled
                snapshot = replace(t, spans=dict(t.spans), logs=list(t.logs))
            rec = build_record(snapshot, closed)
            turn_info = rec.pop("_turn_info")
            run = self._run(t.run_id, rec)
            report = self.reports[t.run_id]
            try:
                rows = to_rows(validate(rec), classify)
            except LineError as exc:
                report.fail(f"trace {t.traj_id}", str(exc))
                self.log(f"error: trace {clean_text(t.traj_id)}: {clean_text(str(exc))}")
                continue
            for row, info in zip(rows["turns"], turn_info):
                row["info"] = to_json(info)
            if run["config"] is None or run["config"].get("model") == "unknown":
                run["config"], run["refresh_config"] = rec["run"], True
            batches.setdefault(t.run_id, []).append((f"trace {t.traj_id}", rows))
            lines[t.run_id] = lines.get(t.run_id, 0) + closed
        return batches, lines

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
                finish_import(self.db_path, run_id, FORMAT, run, self.reports[run_id])
            return
        if not self.runs or not self._metrics_due():
            return
        with db.writing(self.db_path) as con:
            self._write_metrics(con)
        self._metrics_written()

    def _metrics_written(self) -> None:
        self.metrics_at = time.monotonic()
        for run in self.runs.values():
            run["refresh_config"] = False
