"""The receiver's durable write path: what it acknowledges is stored.

A request's spans and log records are routed (storage/otlp/assemble.py ``Assembler.admit``) and
appended raw to ``spans`` / ``span_logs`` in one transaction, and only then is the client
answered 200 (``Appender.submit`` returns). Requests that arrive while a transaction runs are
written together in the next one (a group commit: one open, insert and commit for all of them,
each still answered only once its records are committed). Trajectories are derived from the
stored records afterwards (storage/otlp/writer.py), so a receiver killed at any moment loses
nothing it acknowledged: on the next start ``pending`` finds every trajectory whose stored
spans it has not derived (or derived while still open) and it is derived again from all of
them.

Idempotence: a span is keyed by (trace id, span id). One the assembler knows is held drops at
``admit`` (a retried export); one whose trajectory is in the store but not read back yet
(``suspect``) is inserted only if the store does not hold it. A log record is keyed by (trace
id, span id, time, event name). When the store cannot be written the request is answered 503
and nothing of it is remembered (the exporter retries).
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any

import duckdb
import pyarrow as pa

from storage import db
from storage.otlp.assemble import Admission, Assembler
from storage.otlp.decode import LogRecord, Span
from storage.recorder import clean_column, now, to_json

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
I64 = 2**63 - 1
LEASE_S = 1.0    # the appender holds the store at most this long per open
LINGER_S = 0.1   # and waits this long for the next group before closing it
GATHER, GATHER_S = 16, 0.004  # a group waits this long for this many requests at most
BEHIND_S = 2.0   # after the store refused a write, requests are answered 503 this long


class StoreDown(RuntimeError):
    """The store could not be written; nothing of the request was kept (answer 503)."""


def dumps(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, RecursionError):  # Infinity, NaN: to_json's own rule
        return to_json(value, ensure_ascii=False)


def _columns(rows: list[tuple], schema: pa.Schema) -> pa.Table:
    cols = list(zip(*rows)) if rows else [[] for _ in schema]
    return pa.Table.from_pydict(
        {f.name: clean_column(list(c)) if f.type == pa.string() else list(c)
         for f, c in zip(schema, cols)}, schema=schema)


def span_rows(spans: list[tuple[str, str, Span]], at) -> list[tuple]:
    resources: dict[int, str] = {}  # one request's spans share their resource object
    out = []
    for run_id, traj_id, s in spans:
        res = resources.get(id(s.resource))
        if res is None:
            res = resources[id(s.resource)] = dumps(s.resource)
        out.append((run_id, traj_id, s.trace_id, s.span_id, s.parent_span_id, s.name, s.kind,
                    min(s.start_ns, I64), min(s.end_ns, I64), s.status_code, s.status_message,
                    dumps(s.attributes), res, s.scope, dumps(s.events) if s.events else None,
                    at))
    return out


def log_rows(logs: list[tuple[str, str, LogRecord]], at) -> list[tuple]:
    return [(run_id, traj_id, r.trace_id, r.span_id, min(r.time_ns, I64), r.event_name,
             dumps(r.body), dumps(r.attributes), dumps(r.resource), at)
            for run_id, traj_id, r in logs]


def insert(con, spans: list[tuple], logs: list[tuple], suspect: list[tuple]) -> None:
    """Append rows inside the caller's transaction; ``suspect`` span rows only where the store
    holds no span of that (trace id, span id)."""
    if spans:  # the schemas' columns are the tables' own, in order (storage/migrations.py)
        con.from_arrow(_columns(spans, SPAN_SCHEMA)).insert_into("spans")
    if suspect:
        con.register("_otlp_maybe", _columns(suspect, SPAN_SCHEMA))
        con.execute("INSERT INTO spans BY NAME SELECT * FROM _otlp_maybe m WHERE NOT EXISTS "
                    "(SELECT 1 FROM spans s WHERE s.trace_id = m.trace_id "
                    "AND s.span_id = m.span_id)")
        con.unregister("_otlp_maybe")
    if logs:
        con.from_arrow(_columns(logs, LOG_SCHEMA)).insert_into("span_logs")


class _Request:
    __slots__ = ("spans", "logs", "admission", "error", "done", "future")

    def __init__(self, spans, logs, future=None):
        self.spans, self.logs, self.future = spans, logs, future
        self.admission: Admission | None = None
        self.error: Exception | None = None
        self.done = threading.Event()

    def finish(self) -> None:
        self.done.set()
        if self.future is not None:  # an event loop's request: answer it on its loop
            self.future.get_loop().call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if self.future.done():  # the client went away meanwhile
            return
        if self.error is not None:
            self.future.set_exception(StoreDown(f"{type(self.error).__name__}: {self.error}"))
        else:
            self.future.set_result(self.admission)


class Appender:
    """One thread that appends what requests bring, a group of requests per transaction."""

    def __init__(self, db_path, assembler: Assembler, log):
        self.db_path, self.assembler, self.log = db_path, assembler, log
        self.queue: list[_Request] = []
        self.cv = threading.Condition()
        self.stopping = False
        self.behind_until = 0.0
        self.stored_spans = 0
        self.transactions = 0
        self.thread = threading.Thread(target=self._loop, daemon=True, name="otlp-append")
        self.thread.start()

    @property
    def behind(self) -> bool:
        return time.monotonic() < self.behind_until

    def submit(self, spans: list[Span], logs: list[LogRecord]) -> Admission:
        """Store a request's records; returns once they are committed (``StoreDown`` when the
        store refused them: nothing kept)."""
        req = self._queue(_Request(spans, logs))
        req.done.wait()
        if req.error is not None:
            raise StoreDown(f"{type(req.error).__name__}: {req.error}")
        return req.admission

    def submit_async(self, spans: list[Span], logs: list[LogRecord], loop):
        """``submit`` for an event loop: a future of the ``Admission`` (or ``StoreDown``)."""
        return self._queue(_Request(spans, logs, loop.create_future())).future

    def _queue(self, req: _Request) -> _Request:
        with self.cv:
            if self.stopping:
                raise StoreDown("the receiver is stopping")
            self.queue.append(req)
            self.cv.notify()
        return req

    def run(self, fn):
        """``fn(con)`` in a transaction of its own on the appender's connection (the deriver's
        writes: one writer, no second open of the store, no wait on its lock); returns what
        ``fn`` returns and raises what it raises (``StoreDown`` when stopping)."""
        job = _Request(None, None)
        job.admission = fn
        self._queue(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.future

    def _take(self, wait_s: float) -> list[_Request]:
        with self.cv:
            if not self.queue and not self.stopping and wait_s > 0:
                self.cv.wait(wait_s)
            if self.queue and not self.stopping:  # clients answered a moment ago are sending
                # again: a few ms more make one group (one commit) of them, not several
                until = time.monotonic() + GATHER_S
                while len(self.queue) < GATHER and (left := until - time.monotonic()) > 0:
                    self.cv.wait(left)
            batch, self.queue = self.queue, []
            return batch

    def _job(self, con, job: _Request) -> None:
        try:
            job.future = job.admission(con)
            con.execute("COMMIT")
        except BaseException as exc:  # noqa: BLE001 (the caller gets it)
            job.error = exc
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:
                pass
        con.execute("BEGIN TRANSACTION")
        job.done.set()

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.queue and not self.stopping:
                    self.cv.wait()
                if not self.queue and self.stopping:
                    return
            try:
                self._lease()
            except Exception as exc:  # noqa: BLE001 (the store cannot be opened: tell them)
                for req in self._take(0):
                    if req.spans is None:
                        req.error = exc
                        req.done.set()
                    else:
                        self._fail([req], exc)

    def _lease(self) -> None:
        """Hold the store for a burst of groups, each its own committed transaction, for at
        most ``LEASE_S`` (opening and closing the file is most of a small write's cost; readers
        and the deriver queue fairly behind the lease: storage/db.py)."""
        with db.writing(self.db_path) as con:
            until = time.monotonic() + LEASE_S
            while time.monotonic() < until:
                batch = self._take(LINGER_S)
                if not batch:
                    break
                requests = [r for r in batch if r.spans is not None]
                if requests:
                    self._append(con, requests)
                for job in batch:
                    if job.spans is None:
                        self._job(con, job)

    def _append(self, con, batch: list[_Request]) -> None:
        a = self.assembler
        with a.lock:
            for req in batch:
                req.admission = a.admit(req.spans, req.logs)
            for req in batch:
                a.resolve(req.admission)
        at = now()
        try:
            plain, suspect, logs = [], [], []
            for req in batch:
                for _, run_id, traj_id, s, maybe in req.admission.spans:
                    (suspect if maybe else plain).append((run_id, traj_id, s))
                logs += [(run_id, traj_id, r) for _, run_id, traj_id, r in req.admission.logs]
            rows = span_rows(plain, at), log_rows(logs, at), span_rows(suspect, at)
            insert(con, rows[0], rows[1], rows[2])
            con.execute("COMMIT")  # durable here: only now are the requests answered
        except Exception as exc:  # noqa: BLE001 (every request of the group is told; none kept)
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:
                pass
            con.execute("BEGIN TRANSACTION")
            with a.lock:
                for req in batch:
                    a.undo(req.admission)
            if len(batch) > 1 and not errors_of(exc):  # one request's records: find it
                for req in batch:
                    self._append(con, [req])
            else:
                self._fail(batch, exc)
            return
        con.execute("BEGIN TRANSACTION")
        with a.lock:
            for req in batch:
                a.commit(req.admission)
        self.behind_until = 0.0
        self.transactions += 1
        self.stored_spans += len(rows[0]) + len(rows[2])
        for req in batch:
            req.finish()

    def _fail(self, batch: list[_Request], exc: Exception) -> None:
        if batch:
            if errors_of(exc):  # the store itself: answer 503 at once for a while
                self.behind_until = time.monotonic() + BEHIND_S
            self.log(f"error: could not store {sum(len(r.spans) for r in batch)} span(s): "
                     f"{type(exc).__name__}: {str(exc)[:300]}")
        for req in batch:
            req.error = exc
            req.finish()

    def stop(self) -> None:
        """Append what is queued, then end the thread."""
        with self.cv:
            self.stopping = True
            self.cv.notify()
        self.thread.join()


# -- reading back -----------------------------------------------------------------------------------
def known_rows(db_path) -> list[tuple[str, str, str]]:
    """(run id, traj id, trace id) of every stored span's trajectory (a late span's home)."""
    with db.reading(db_path) as con:
        return con.execute("SELECT DISTINCT run_id, traj_id, trace_id FROM spans").fetchall()


def pending(db_path) -> list[tuple[str, str, str]]:
    """(run id, traj id, a trace id) of every trajectory whose stored spans were not all
    derived: none derived, derived from fewer, or derived while open (a receiver killed or
    stopped before it closed them)."""
    with db.reading(db_path) as con:
        return con.execute("""
            WITH raw AS (SELECT run_id, traj_id, min(trace_id) AS trace_id,
                                count(DISTINCT span_id) AS n FROM spans GROUP BY ALL)
            SELECT raw.run_id, raw.traj_id, raw.trace_id FROM raw
            LEFT JOIN trajectories t USING (run_id, traj_id)
            WHERE t.traj_id IS NULL
               OR coalesce(TRY_CAST(t.info->'otel'->>'spans' AS BIGINT), -1) <> raw.n
               OR coalesce(TRY_CAST(t.info->'otel'->>'open' AS BOOLEAN), FALSE)""").fetchall()


def _load(text):
    return json.loads(text) if text else {}


def stored_records(db_path, keys: list[tuple[str, str]]
                   ) -> dict[tuple[str, str], tuple[list[Span], list[LogRecord]]]:
    """Each (run id, traj id)'s stored spans (one per span id) and log records, one read."""
    out: dict[tuple[str, str], tuple[list[Span], list[LogRecord]]] = {k: ([], []) for k in keys}
    if not keys:
        return out
    table = pa.table({"run_id": [k[0] for k in keys], "traj_id": [k[1] for k in keys]})
    with db.reading(db_path) as con:
        con.register("_otlp_keys", table)
        spans = con.execute(
            "SELECT run_id, traj_id, trace_id, span_id, any_value(parent_span_id), "
            "any_value(name), any_value(kind), any_value(start_ns), any_value(end_ns), "
            "any_value(attributes), any_value(resource), any_value(scope), "
            "any_value(status_code), any_value(status_message), any_value(events) "
            "FROM spans JOIN _otlp_keys USING (run_id, traj_id) GROUP BY ALL").fetchall()
        logs = con.execute(
            "SELECT DISTINCT run_id, traj_id, trace_id, span_id, time_ns, event_name, body, "
            "attributes, resource FROM span_logs JOIN _otlp_keys USING (run_id, traj_id)"
        ).fetchall()
        con.unregister("_otlp_keys")
    for r in spans:
        out[(r[0], r[1])][0].append(Span(r[2], r[3], r[4], r[5], r[6], r[7], r[8], _load(r[9]),
                                         _load(r[10]), r[11], r[12] or 0, r[13] or "",
                                         _load(r[14]) or []))
    for r in logs:
        out[(r[0], r[1])][1].append(LogRecord(r[2], r[3], r[4], r[5],
                                              _load(r[6]) if r[6] else None, _load(r[7]),
                                              _load(r[8])))
    return out


def move(con, run_id: str, absorbed: list[str], into: str) -> None:
    """Records first stored under their trace's own trajectory now belong to the conversation
    ``into`` (inside the caller's transaction)."""
    for table in ("spans", "span_logs"):
        con.execute(f"UPDATE {table} SET traj_id = ? WHERE run_id = ? AND traj_id IN "
                    "(SELECT unnest(?))", [into, run_id, absorbed])


def errors_of(exc: Exception) -> bool:
    """Whether ``exc`` is the store's (locked, gone, disk) rather than one record's."""
    return isinstance(exc, (db.StoreError, OSError, duckdb.IOException))
