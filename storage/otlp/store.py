"""The receiver's durable write path: what it acknowledges is stored.

A request's spans and log records are routed (storage/otlp/assemble.py ``Assembler.admit``) and
appended raw to ``spans`` / ``span_logs``, committed, and only then is the client answered 200
(``Appender.submit`` returns). Requests that arrive while a commit runs are written together in
the next one (a group commit: one insert and one commit for all of them, each still answered
only once its records are committed). The commit's flush to disk costs about as much as the
whole group's insert, so the group is what sets the speed: one waits up to ``GATHER_S`` for as
many requests as the last group had (the clients it answered are sending again). A group of
spans alone is one statement in autocommit (durable when it returns); with log records or
spans to deduplicate it is one explicit transaction.

The appender holds the store open across groups (opening and closing it costs ~60-150 ms, a
checkpoint included) until another opener queues for it on storage/db.py's turnstile (a page, an
export, a second writer: each waits at most one group), it has been idle ``LINGER_S``, or
``LEASE_S`` passed. Trajectories are derived from the stored records afterwards
(storage/otlp/writer.py) in transactions of their own on a cursor of the appender's connection
(``Appender.run``), which run beside the group commits instead of between them: a derivation's
writes never hold an acknowledgement. So a receiver killed at any moment loses nothing it
acknowledged: on the next start ``stored.pending`` finds every trajectory whose stored spans it has not
derived (or derived while still open) and it is derived again from all of them.

Idempotence: a span is keyed by (trace id, span id). One the assembler knows is held drops at
``admit`` (a retried export); one whose trajectory is in the store but not read back yet
(``suspect``) is inserted only if the store does not hold it. A log record is keyed by (trace
id, span id, time, event name). When the store cannot be written the request is answered 503
and nothing of it is remembered (the exporter retries).
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import duckdb
import pyarrow as pa

from storage import db, lake
from storage.otlp.assemble import Admission, Assembler
from storage.otlp.decode import LogRecord, Span
from storage.recorder import clean_column, now, to_json

try:  # POSIX: the turnstile of storage/db.py says when another opener waits
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

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
LEASE_S = 5.0    # the appender holds the store at most this long per open (half the time a
# bare storage.db.connect retries on DuckDB's own lock: one that skips the turnstile gets in)
LINGER_S = 0.5   # and closes it after this long with nothing to write
POLL_S = 0.02    # how often an idle appender looks for a queued opener
GATHER, MAX_GATHER, GATHER_S = 16, 512, 0.006  # a group waits this long for as many requests
# as the last group had (GATHER at least, MAX_GATHER at most)
MAX_GROUP, BIG = 20_000, 1_000  # records per group commit at most; a request of BIG or more
# records is a group alone, after the small ones (``_groups``)
BEHIND_S = 2.0   # after the store refused a write, requests are answered 503 this long


class StoreDown(RuntimeError):
    """The store could not be written; nothing of the request was kept (answer 503)."""


_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode


def dumps(value: Any) -> str:
    try:
        return _encode(value)
    except (ValueError, TypeError, RecursionError):  # Infinity, NaN: to_json's own rule
        return to_json(value, ensure_ascii=False)


def _table(columns: list[list], schema: pa.Schema) -> pa.Table:
    """One Arrow table of ``columns`` (a list per field of ``schema``), text cells cleaned."""
    return pa.Table.from_arrays(
        [pa.array(clean_column(c) if f.type == pa.string() else c, f.type)
         for f, c in zip(schema, columns)], schema=schema)


def span_table(spans: list[tuple[str, str, Span]], at) -> pa.Table:
    """The ``spans`` rows of (run id, traj id, span) items, built column by column."""
    resources: dict[int, str] = {}  # one request's spans share their resource object
    res = []
    for _, _, s in spans:
        text = resources.get(id(s.resource))
        if text is None:
            text = resources[id(s.resource)] = dumps(s.resource)
        res.append(text)
    ss = [s for _, _, s in spans]
    return _table([
        [r for r, _, _ in spans], [t for _, t, _ in spans], [s.trace_id for s in ss],
        [s.span_id for s in ss], [s.parent_span_id for s in ss], [s.name for s in ss],
        [s.kind for s in ss], [min(s.start_ns, I64) for s in ss],
        [min(s.end_ns, I64) for s in ss], [s.status_code for s in ss],
        [s.status_message for s in ss], [dumps(s.attributes) for s in ss], res,
        [s.scope for s in ss], [dumps(s.events) if s.events else None for s in ss],
        [at] * len(ss)], SPAN_SCHEMA)


def log_table(logs: list[tuple[str, str, LogRecord]], at) -> pa.Table:
    rs = [r for _, _, r in logs]
    return _table([
        [r for r, _, _ in logs], [t for _, t, _ in logs], [r.trace_id for r in rs],
        [r.span_id for r in rs], [min(r.time_ns, I64) for r in rs], [r.event_name for r in rs],
        [dumps(r.body) for r in rs], [dumps(r.attributes) for r in rs],
        [dumps(r.resource) for r in rs], [at] * len(rs)], LOG_SCHEMA)


def insert(con, spans: pa.Table | None, logs: pa.Table | None,
           suspect: pa.Table | None) -> None:
    """Append rows (in the caller's transaction, or as one autocommitted statement when only
    ``spans`` are given); ``suspect`` span rows only where the store holds no span of that
    (trace id, span id)."""
    if spans is not None:  # the schemas' columns are the tables' own (storage/migrations.py)
        con.from_arrow(spans).insert_into("spans")
    if suspect is not None:
        con.register("_otlp_maybe", suspect)
        con.execute("INSERT INTO spans BY NAME SELECT * FROM _otlp_maybe m WHERE NOT EXISTS "
                    "(SELECT 1 FROM spans s WHERE s.trace_id = m.trace_id "
                    "AND s.span_id = m.span_id)")
        con.unregister("_otlp_maybe")
    if logs is not None:
        con.from_arrow(logs).insert_into("span_logs")


class _Request:
    __slots__ = ("spans", "logs", "admission", "error", "done", "future")

    def __init__(self, spans, logs, future=None):
        self.spans, self.logs, self.future = spans, logs, future
        self.admission: Admission | None = None
        self.error: Exception | None = None
        self.done = threading.Event()

    def resolve(self) -> None:
        """Answer an event loop's request (on its loop)."""
        if self.future.done():  # the client went away meanwhile
            return
        if self.error is not None:
            self.future.set_exception(StoreDown(f"{type(self.error).__name__}: {self.error}"))
        else:
            self.future.set_result(self.admission)


def _resolve_all(requests: list[_Request]) -> None:
    for req in requests:
        req.resolve()


def finish(requests: list[_Request]) -> None:
    """Wake every request's waiter: one hand-off per event loop, not one per request."""
    loops: dict[Any, list[_Request]] = {}
    for req in requests:
        req.done.set()
        if req.future is not None:
            loops.setdefault(req.future.get_loop(), []).append(req)
    for loop, reqs in loops.items():
        try:
            loop.call_soon_threadsafe(_resolve_all, reqs)
        except RuntimeError:  # the loop is closed: nobody waits for the answer any more
            pass


def _groups(requests: list[_Request]) -> list[list[_Request]]:
    """The requests taken together as group commits: the small ones first, together (at most
    ``MAX_GROUP`` records a group), then each big one (``BIG`` records or more) alone, so a
    small request never waits for the insert of a big one it arrived with."""
    out: list[list[_Request]] = [[]]
    held = 0
    for req in sorted(requests, key=lambda r: len(r.spans) + len(r.logs)):
        size = len(req.spans) + len(req.logs)
        if out[-1] and (held + size > MAX_GROUP or size >= BIG):
            out.append([])
            held = 0
        out[-1].append(req)
        held += size
    return out if out[0] else []


class _Job:
    """A derivation's transaction: waits for a cursor of the appender's connection."""
    __slots__ = ("cursor", "error", "granted", "spans")

    def __init__(self):
        self.spans = None  # not a request
        self.cursor = None
        self.error: Exception | None = None
        self.granted = threading.Event()


class _Turnstile:
    """Whether another opener queues for the store (storage/db.py: a queued opener holds the
    store's turnstile while it waits for the readers-writer lock the appender holds)."""

    def __init__(self, db_path):
        files = db.lock_paths(db_path) if fcntl is not None else None
        self.fd = None
        if files is not None:
            try:
                self.fd = os.open(files[0], os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:
                pass

    def queued(self) -> bool:
        if self.fd is None:
            return False
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        return False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Appender:
    """One thread that appends what requests bring, a group of requests per commit, and lends
    cursors of its connection to the deriver's transactions (``run``)."""

    def __init__(self, db_path, assembler: Assembler, log):
        self.db_path, self.assembler, self.log = db_path, assembler, log
        self.queue: list = []
        self.cv = threading.Condition()
        self.stopping = False
        self.behind_until = 0.0
        self.stored_spans = 0
        self.transactions = 0
        self.lent = 0       # cursors lent to ``run`` and not returned yet
        self.last_group = GATHER
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

    def _queue(self, req):
        with self.cv:
            if self.stopping:
                raise StoreDown("the receiver is stopping")
            self.queue.append(req)
            self.cv.notify_all()
        return req

    def run(self, fn):
        """``fn(cursor)`` in a transaction of its own, in the calling thread, on a cursor of
        the appender's connection (one open of the store: no wait on its lock, and the group
        commits go on beside it); returns what ``fn`` returns and raises what it raises
        (``StoreDown`` when stopping or the store cannot be opened)."""
        job = self._queue(_Job())
        job.granted.wait()
        if job.error is not None:
            raise StoreDown(f"{type(job.error).__name__}: {job.error}")
        cur = job.cursor
        try:
            cur.execute("BEGIN TRANSACTION")
            try:
                out = fn(cur)
                cur.execute("COMMIT")
            except BaseException:
                try:
                    cur.execute("ROLLBACK")
                except duckdb.Error:  # a failed COMMIT already ended it
                    pass
                raise
            return out
        finally:
            cur.close()
            with self.cv:
                self.lent -= 1
                self.cv.notify_all()

    def _take(self, wait_s: float) -> list:
        with self.cv:
            if not self.queue and not self.stopping and wait_s > 0:
                self.cv.wait(wait_s)
            if self.queue and not self.stopping:  # clients answered a moment ago are sending
                # again: a few ms more make one group (one commit) of them, not several
                want = min(max(self.last_group, GATHER), MAX_GATHER)
                until = time.monotonic() + GATHER_S
                while len(self.queue) < want and (left := until - time.monotonic()) > 0:
                    self.cv.wait(left)
            batch, self.queue = self.queue, []
            return batch

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
                batch = self._take(0)
                for job in batch:
                    if isinstance(job, _Job):
                        job.error = exc
                        job.granted.set()
                self._fail([r for r in batch if isinstance(r, _Request)], exc)

    def _lease(self) -> None:
        """Hold the store for a burst of groups, each committed on its own, until another
        opener queues, it is idle ``LINGER_S`` or ``LEASE_S`` passed (module docstring), and
        then until every lent cursor is back."""
        turnstile = _Turnstile(self.db_path)
        try:
            with db.writing(self.db_path) as con:
                con.execute("COMMIT")  # autocommit between groups (db.writing's own is empty)
                try:
                    self._serve(con, turnstile)
                finally:
                    with self.cv:
                        while self.lent:
                            self.cv.wait()
                    con.execute("BEGIN TRANSACTION")  # what db.writing commits on leaving
        finally:
            turnstile.close()

    def _serve(self, con, turnstile: _Turnstile) -> None:
        until = time.monotonic() + LEASE_S
        idle_since = time.monotonic()
        while True:
            batch = self._take(POLL_S)
            if batch:
                requests = [r for r in batch if isinstance(r, _Request)]
                jobs = [j for j in batch if isinstance(j, _Job)]
                if requests:  # what the next group waits for, forgetting slowly
                    self.last_group = max(len(requests), int(self.last_group * 0.9))
                groups = _groups(requests)
                for i, group in enumerate(groups):
                    if not self._group(con, group):  # the store itself failed: the rest
                        with self.cv:                 # waits for the next open
                            self.queue[:0] = [r for g in groups[i + 1:] for r in g] + jobs
                        return
                for job in jobs:
                    try:
                        job.cursor = lake.cursor(con)  # a team store's, on a team store
                    except Exception as exc:  # noqa: BLE001 (the deriver is told: StoreDown)
                        job.error = exc
                    else:
                        with self.cv:
                            self.lent += 1
                    job.granted.set()
                idle_since = time.monotonic()
            with self.cv:
                busy = bool(self.lent or self.queue)
                if not busy and self.stopping:
                    return
            t = time.monotonic()
            if t >= until or turnstile.queued():  # even while busy: what is queued (requests,
                return  # derivations) waits for the next open, behind the queued opener
            if not busy and t - idle_since >= LINGER_S:
                return

    def _group(self, con, group: list[_Request]) -> bool:
        """``_append``; an error of this code (not the store's) fails the group's requests
        (never left waiting) and forgets what was admitted of them (a retry is stored)."""
        try:
            return self._append(con, group)
        except Exception as exc:  # noqa: BLE001
            with self.assembler.lock:  # every span id admitted and not committed: this group's
                for t in self.assembler.open.values():
                    if len(t.ids) != len(t.spans):
                        t.ids = {x for x in t.ids if x in t.spans}
            self._fail([r for r in group if not r.done.is_set()], exc)
            return True

    def _append(self, con, batch: list[_Request]) -> bool:
        """Store a group; False when the store itself refused it (every request was told)."""
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
            tables = (span_table(plain, at) if plain else None,
                      log_table(logs, at) if logs else None,
                      span_table(suspect, at) if suspect else None)
            one = sum(t is not None for t in tables) <= 1 and tables[2] is None
            if not one:
                con.execute("BEGIN TRANSACTION")
            insert(con, *tables)  # one statement: committed (durable) when it returns
            if not one:
                con.execute("COMMIT")  # durable here: only now are the requests answered
        except Exception as exc:  # noqa: BLE001 (every request of the group is told; none kept)
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:  # autocommitted, or a failed COMMIT already ended it
                pass
            with a.lock:
                for req in batch:
                    a.undo(req.admission)
            if len(batch) > 1 and not errors_of(exc):  # one request's records: find it
                return all([self._append(con, [req]) for req in batch])
            self._fail(batch, exc)
            return not errors_of(exc)
        with a.lock:
            for req in batch:
                a.commit(req.admission)
        self.behind_until = 0.0
        self.transactions += 1
        self.stored_spans += len(plain) + len(suspect)
        finish(batch)
        return True

    def _fail(self, batch: list[_Request], exc: Exception) -> None:
        if batch:
            if errors_of(exc):  # the store itself: answer 503 at once for a while
                self.behind_until = time.monotonic() + BEHIND_S
            self.log(f"error: could not store {sum(len(r.spans) for r in batch)} span(s): "
                     f"{type(exc).__name__}: {str(exc)[:300]}")
        for req in batch:
            req.error = exc
        finish(batch)

    def stop(self) -> None:
        """Append what is queued, then end the thread."""
        with self.cv:
            self.stopping = True
            self.cv.notify_all()
        self.thread.join()


def errors_of(exc: Exception) -> bool:
    """Whether ``exc`` is the store's (locked, gone, disk) rather than one record's."""
    return isinstance(exc, (db.StoreError, OSError, duckdb.IOException))
