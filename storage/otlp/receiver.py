"""``agentrl otlp --db PATH``: an OTLP/HTTP receiver that records agents' traces as trajectories.

    agentrl otlp --db runs/agents.duckdb [--host 127.0.0.1] [--port 4318] [--token-env VAR]
    python -m storage.otlp --db runs/agents.duckdb              (the same)

Point any OpenTelemetry exporter at ``http://127.0.0.1:4318`` (``OTEL_EXPORTER_OTLP_ENDPOINT``):
``POST /v1/traces`` and ``POST /v1/logs``, protobuf or JSON, optionally gzip. Answers as the
OTLP specification says: 200 with an ``Export{Trace,Logs}ServiceResponse`` whose
``partial_success`` counts and names what was rejected (an id of the wrong length, a span past
the per-trajectory limit); 400 with a ``google.rpc.Status`` for a body that does not parse; 413
for a body over ``--max-body-mb`` (refused from its ``Content-Length``, unread) or one that
inflates past ``--max-inflated-mb``; 415 for another media type; 429 with ``Retry-After`` while
the spans held wait for the writer past ``--max-held-mb``, 503 with ``Retry-After`` while the
store cannot be written (exporters retry both). With ``--token-env VAR`` a request must carry
``Authorization: Bearer`` and that variable's value (401 otherwise, decided before the body is
read). It binds to 127.0.0.1 unless ``--host`` says otherwise.

What it answers 200 to is stored: a request's spans and log records are appended raw to the
store before the answer (storage/otlp/store.py), and trajectories are derived from the stored
spans afterwards (storage/otlp/writer.py, storage/otlp/assemble.py): one run per instrumented
service (``otlp-{service.name}``, or ``--run-id``), one trajectory per trace or conversation,
rewritten as the agent goes on and closed when its root ends or after ``--idle-s``. A receiver
killed at any point loses nothing it acknowledged; the next one derives what was pending. With
``--derive-process`` the derivation runs in a worker process, off the interpreter that answers.
Ctrl-C (SIGINT) or SIGTERM stores what is in flight, derives everything held, marks the runs
finished and exits 0.

The server is uvicorn with a starlette app (storage/asgi_serve.py): a header timeout
(``--header-timeout-s``), an idle keep-alive timeout, a connection limit that closes the
longest-idle connection before refusing a new one (``--max-connections``), a whole-body
deadline and size cap; a request h11 cannot parse (``Content-Length: ²``) is a 400.
"""
from __future__ import annotations

import argparse
import asyncio
import hmac
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from storage import lake
from storage.asgi_serve import BodyRefused, ServeLimits, read_body, serve
from storage.otlp.assemble import Assembler, Bounds
from storage.otlp.decode import BodyError, decode, response_body, status_body
from storage.otlp.store import Appender, StoreDown
from storage.otlp.writer import Writer
from storage.recorder import check_run_id, clean_text

PATHS = {"/v1/traces": "traces", "/v1/logs": "logs"}
MAX_REJECTIONS_NAMED = 5
BIG_AT_ONCE = 2  # big or compressed bodies decoded and stored at once (memory, see handle)
INLINE_BYTES = 64 << 10  # bodies up to this are decoded on the event loop (a thread hop costs more)
REST_MAX_S = 1.0  # the deriver's longest pause after a long flush (see _derive_loop)


@dataclass(frozen=True)
class Limits:
    """What one client may send and hold (docs/threat-model.md)."""
    max_body_bytes: int = 16 << 20
    max_inflated_bytes: int = 64 << 20
    body_deadline_s: float = 30.0
    max_connections: int = 256
    token: str | None = None
    header_timeout_s: float = 10.0
    keep_alive_s: float = 30.0


def _reply(status: int, body: bytes, as_json: bool, headers: dict | None = None,
           close: bool = False) -> Response:
    headers = dict(headers or {})
    if close:
        headers["Connection"] = "close"
    return Response(body, status, headers, "application/json" if as_json
                    else "application/x-protobuf")


def _error(status: int, message: str, as_json: bool, headers=None, close=False) -> Response:
    return _reply(status, status_body(message, as_json), as_json, headers, close)


class Receiver:
    """The HTTP server, the assembler, the appender (raw records first) and the deriver thread
    (``start`` / ``stop``)."""

    def __init__(self, db_path, host: str = "127.0.0.1", port: int = 4318,
                 bounds: Bounds = Bounds(), limits: Limits = Limits(), run_id: str | None = None,
                 log=None, derive_process: bool = False):
        if lake.is_lake(db_path) and not lake.shares_threads(db_path):
            # the appender commits in one thread while the deriver writes in another
            # (storage/otlp/store.py), which a SQLite catalog cannot take (storage/lake.py)
            raise lake.LakeError(f"{db_path} is a team store on a SQLite catalog, which takes one "
                                 "writing thread per process: the receiver needs a PostgreSQL "
                                 "catalog (agentrl store init DIR --catalog postgres:...)")
        self.limits, self.bounds = limits, bounds
        self.log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        self.assembler = Assembler(bounds, run_id)
        self.writer = Writer(db_path, self.assembler, self.log, process=derive_process)
        self.counts = {"spans": 0, "logs": 0, "rejected": 0, "dropped_bodies": 0}
        self._stop = threading.Event()
        self.host, self.port = host, port
        self.served = None
        self._big = asyncio.Semaphore(BIG_AT_ONCE)
        self.app = Starlette(routes=[Route("/{path:path}", self.handle, methods=[
            "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])])

    # -- one request ---------------------------------------------------------------------------
    async def handle(self, request: Request) -> Response:
        lim = self.limits
        path = request.url.path
        ctype = request.headers.get("content-type") or ""
        as_json = ctype.split(";")[0].strip() == "application/json"
        if path not in PATHS:
            return _error(404, f"no such path {path[:100]!r}: POST /v1/traces or /v1/logs",
                          as_json, close=True)
        if request.method != "POST":
            return _error(405, "POST /v1/traces or /v1/logs", True, {"Allow": "POST"})
        if lim.token is not None:
            given = request.headers.get("authorization") or ""
            if not hmac.compare_digest(given.encode(), f"Bearer {lim.token}".encode()):
                return _error(401, "missing or wrong bearer token", as_json,
                              {"WWW-Authenticate": "Bearer"}, close=True)
        if self.writer.appender.behind:
            return _error(503, "the store cannot be written now; retry", as_json,
                          {"Retry-After": "2"}, close=True)
        if self.assembler.over_memory():
            return _error(429, "the receiver holds as much as it may until the deriver "
                          "catches up; retry", as_json, {"Retry-After": "1"}, close=True)
        try:
            body = await read_body(request, lim.max_body_bytes, lim.body_deadline_s)
        except BodyRefused as exc:  # 400 / 408 / 413: from the headers, or while reading
            if exc.status == 408:
                self.counts["dropped_bodies"] += 1
            return _error(exc.status, str(exc), as_json, close=True)
        except ClientDisconnect:  # the client left mid-body: nothing taken
            self.counts["dropped_bodies"] += 1
            return _error(400, "the client left mid-body", as_json, close=True)
        signal_name = PATHS[path]
        encoding = request.headers.get("content-encoding") or ""
        if len(body) <= INLINE_BYTES and not encoding:
            return await self._take(body, ctype, encoding, signal_name, as_json)
        # A big or compressed body is decoded off the event loop, BIG_AT_ONCE at a time until
        # stored: decoded, one can hold ~8x its inflated size, and 20 at once (61 KB of gzip
        # each, 60 MB inflated) took the receiver past 8 GB before this bound.
        async with self._big:
            if self.assembler.over_memory():
                return _error(429, "the receiver holds as much as it may until the deriver "
                              "catches up; retry", as_json, {"Retry-After": "1"}, close=True)
            return await self._take(body, ctype, encoding, signal_name, as_json)

    async def _take(self, body, ctype, encoding, signal_name, as_json) -> Response:
        try:
            records = await run_in_threadpool(self._decode, body, ctype, encoding, signal_name) \
                if len(body) > INLINE_BYTES or encoding else \
                self._decode(body, ctype, encoding, signal_name)
        except BodyError as exc:
            return _error(exc.status, str(exc), as_json)
        try:
            admitted = await self.writer.appender.submit_async(
                records.spans, records.logs, asyncio.get_running_loop())
        except StoreDown as exc:
            return _error(503, f"the store cannot be written now ({clean_text(str(exc))[:200]})"
                          "; retry", as_json, {"Retry-After": "2"})
        return _reply(200, self._answer(records, admitted, signal_name, as_json), as_json)

    def _decode(self, body: bytes, ctype: str, encoding: str, signal_name: str):
        try:
            return decode(body, ctype, encoding, signal_name, self.limits.max_inflated_bytes)
        except MemoryError:
            raise BodyError("the body is too large to decode", 413) from None

    def _answer(self, records, admitted, signal_name: str, as_json: bool) -> bytes:
        """The ``Export*ServiceResponse``, naming what was rejected."""
        rejected = records.rejected + admitted.rejected
        self.counts["spans"] += len(records.spans)
        self.counts["logs"] += len(records.logs)
        self.counts["rejected"] += len(rejected)
        named = list(dict.fromkeys(rejected))  # one line per reason (a trace over its limit)
        message = "; ".join(named[:MAX_REJECTIONS_NAMED])
        if len(named) > MAX_REJECTIONS_NAMED:
            message += f"; and {len(named) - MAX_REJECTIONS_NAMED} more"
        if rejected:
            self.log(f"rejected {len(rejected)}: {clean_text(message)[:500]}")
        return response_body(signal_name, len(rejected), clean_text(message), as_json)

    # -- lifecycle ------------------------------------------------------------------------------
    def _derive_loop(self) -> None:
        """A flush every ``flush_s``; one that took longer while requests kept coming is followed
        by a pause as long as it took (``REST_MAX_S`` at most): the deriver then takes at most
        about half the process (the acknowledgements share its interpreter) and each flush
        derives more at once (a flush's statements cost the same for 10 trajectories as for
        500). With no requests coming it catches up back to back."""
        wait, appender = self.bounds.flush_s, self.writer.appender
        folds = lake.FoldSchedule(self.writer.db_path, self.log)
        while not self._stop.wait(wait):
            folds.tick()                 # a team store's small files, every few minutes
            started, groups = time.monotonic(), appender.transactions
            try:
                self.writer.flush()
            except Exception as exc:  # noqa: BLE001 (never let the deriver die silently)
                self.log(f"error: deriving stopped a round: {type(exc).__name__}: {exc}")
            took = time.monotonic() - started
            busy = appender.transactions != groups  # requests came meanwhile: share with them
            wait = max(self.bounds.flush_s - took, min(took, REST_MAX_S) if busy else 0.0)

    def start(self) -> "Receiver":
        self.writer.appender = Appender(self.writer.db_path, self.assembler, self.log)
        lim = self.limits
        self.served = serve(self.app, ServeLimits(max_connections=lim.max_connections,
                                                  header_s=lim.header_timeout_s,
                                                  idle_s=lim.keep_alive_s, shutdown_s=10.0),
                            self.host, self.port,
                            bad_request=lambda text: status_body(text, True))
        self.server_address = (self.served.host, self.served.port)
        self._deriver = threading.Thread(target=self._derive_loop, daemon=True,
                                         name="otlp-deriver")
        self._deriver.start()
        return self

    def stop(self) -> None:
        """Stop taking requests, store what is in flight, derive everything held and finish
        the runs."""
        self.served.stop(30)
        self.writer.appender.stop()
        self._stop.set()
        self._deriver.join()
        try:
            self.writer.flush(final=True)
        finally:
            self.writer.close()

    @property
    def url(self) -> str:
        return self.served.url


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentrl otlp", description=__doc__.split("\n\n")[0])
    p.add_argument("--db", required=True, help="the DuckDB store (created if missing)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    p.add_argument("--port", type=int, default=4318)
    p.add_argument("--run-id", help="record every trace into this run (default: one run per "
                                     "service, otlp-{service.name})")
    p.add_argument("--token-env", metavar="VAR", help="require Authorization: Bearer $VAR")
    p.add_argument("--max-body-mb", type=float, default=16.0)
    p.add_argument("--max-inflated-mb", type=float, default=64.0)
    p.add_argument("--max-spans-per-trace", type=int, default=Bounds.max_spans_per_trace)
    p.add_argument("--max-open-traces", type=int, default=Bounds.max_open_traces)
    p.add_argument("--max-held-mb", type=float, default=Bounds.max_held_bytes / (1 << 20))
    p.add_argument("--idle-s", type=float, default=Bounds.idle_s,
                   help="close a trajectory after this long with no new span (default 30)")
    p.add_argument("--flush-s", type=float, default=Bounds.flush_s,
                   help="derive what changed this often (default 0.5)")
    p.add_argument("--derive-process", action="store_true",
                   help="derive trajectories in a worker process, off the interpreter that "
                        "answers requests (on 2 shared cores it made no trajectory sooner: "
                        "bench/README.md)")
    p.add_argument("--max-connections", type=int, default=Limits.max_connections,
                   help="open connections at most; past it the idlest is closed (default 256)")
    p.add_argument("--header-timeout-s", type=float, default=Limits.header_timeout_s,
                   help="close a connection that sends no request head for this long "
                        "(default 10)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            print(f"error: --token-env {args.token_env}: that variable is empty or unset",
                  file=sys.stderr)
            return 2
    if args.run_id:
        try:
            check_run_id(args.run_id)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    bounds = Bounds(args.max_spans_per_trace, args.max_open_traces,
                    int(args.max_held_mb * (1 << 20)), args.idle_s, Bounds.grace_s, args.flush_s)
    limits = Limits(int(args.max_body_mb * (1 << 20)), int(args.max_inflated_mb * (1 << 20)),
                    max_connections=max(args.max_connections, 2), token=token,
                    header_timeout_s=args.header_timeout_s)
    try:
        receiver = Receiver(args.db, args.host, args.port, bounds, limits, args.run_id,
                            derive_process=args.derive_process).start()
    except OSError as exc:
        print(f"error: cannot serve on {args.host}:{args.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    except Exception as exc:  # a store this code cannot use (storage.db.StoreError, ...)
        print(f"error: {clean_text(str(exc))}", file=sys.stderr)
        return 2
    if args.host not in ("127.0.0.1", "localhost", "::1") and token is None:
        print(f"warning: listening on {args.host} without --token-env: anyone who reaches the "
              "port can write into the store", file=sys.stderr)
    stop = threading.Event()
    # installed before the first line is printed: a Ctrl-C right after it still stops cleanly
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    print(f"receiving OTLP/HTTP at {receiver.url}/v1/traces and /v1/logs into {args.db} "
          "(Ctrl-C writes what it holds and stops)", flush=True)
    try:
        while not stop.wait(0.5):
            pass
        try:
            receiver.stop()
        except Exception as exc:  # noqa: BLE001 (the spans are stored: the next start derives)
            print(f"error: stopping: {type(exc).__name__}: {clean_text(str(exc))[:300]}; every "
                  "acknowledged span is stored and the next start derives what is pending",
                  file=sys.stderr)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    c = receiver.counts
    print(f"received {c['spans']} spans and {c['logs']} log records ({c['rejected']} rejected); "
          f"{len(receiver.writer.runs)} run(s): {', '.join(receiver.writer.runs) or 'none'}"
          + (f"; {receiver.writer.failed} trajectory(ies) could not be assembled (named above)"
             if receiver.writer.failed else ""), flush=True)
    return 0
