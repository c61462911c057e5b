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

Spans become trajectories as they arrive (storage/otlp/assemble.py): one run per instrumented
service (``otlp-{service.name}``, or ``--run-id``), one trajectory per trace or conversation,
rewritten as the agent goes on and closed when its root ends or after ``--idle-s``. Ctrl-C
(SIGINT) or SIGTERM writes everything held, marks the runs finished and exits 0.
"""
from __future__ import annotations

import argparse
import hmac
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from storage.otlp.assemble import Assembler, Bounds
from storage.otlp.decode import BodyError, decode, response_body, status_body
from storage.otlp.writer import Writer
from storage.recorder import check_run_id, clean_text

PATHS = {"/v1/traces": "traces", "/v1/logs": "logs"}
MAX_REJECTIONS_NAMED = 5


@dataclass(frozen=True)
class Limits:
    """What one client may send (docs/threat-model.md)."""
    max_body_bytes: int = 16 << 20
    max_inflated_bytes: int = 64 << 20
    body_deadline_s: float = 30.0
    max_connections: int = 64
    token: str | None = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "agentrl-otlp"

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass  # one line per request would drown the terminal; errors are said below

    def _reply(self, status: int, body: bytes, as_json: bool, headers: dict | None = None,
               close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if as_json
                         else "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        # headers and body in one send: two small writes on a kept-alive connection meet
        # Nagle's algorithm and the client's delayed ACK (tens of ms per request)
        if hasattr(self, "_headers_buffer"):
            self._headers_buffer.extend((b"\r\n", body))
            self.flush_headers()
        else:  # an HTTP/0.9 request: no headers
            self.wfile.write(body)

    def _error(self, status: int, message: str, as_json: bool, headers=None, close=False):
        self._reply(status, status_body(message, as_json), as_json, headers, close)

    def do_GET(self):  # noqa: N802
        self._error(405, "POST /v1/traces or /v1/logs", True, {"Allow": "POST"})

    def do_POST(self):  # noqa: N802
        srv = self.server
        path = self.path.split("?", 1)[0]
        as_json = (self.headers.get("Content-Type") or "").split(";")[0].strip() \
            == "application/json"
        if path not in PATHS:
            return self._error(404, f"no such path {path[:100]!r}: POST /v1/traces or /v1/logs",
                               as_json, close=True)
        if srv.limits.token is not None:
            given = self.headers.get("Authorization") or ""
            if not hmac.compare_digest(given.encode(), f"Bearer {srv.limits.token}".encode()):
                return self._error(401, "missing or wrong bearer token", as_json,
                                   {"WWW-Authenticate": "Bearer"}, close=True)
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding") or length is None:
            return self._error(411, "a Content-Length is required", as_json, close=True)
        if not length.strip().isdigit():
            return self._error(400, f"bad Content-Length {length[:40]!r}", as_json, close=True)
        size = int(length)
        if size > srv.limits.max_body_bytes:
            return self._error(413, f"body of {size} bytes is over the limit of "
                               f"{srv.limits.max_body_bytes}", as_json, close=True)
        if srv.writer.behind:
            return self._error(503, "the store cannot be written now; retry", as_json,
                               {"Retry-After": "2"}, close=True)
        if srv.assembler.over_memory():
            return self._error(429, "the receiver holds as much as it may until the writer "
                               "catches up; retry", as_json, {"Retry-After": "1"}, close=True)
        body = self._read(size)
        if body is None:
            return  # the client left mid-body or stalled past the deadline: nothing taken
        signal_name = PATHS[path]
        try:
            records = decode(body, self.headers.get("Content-Type") or "",
                             self.headers.get("Content-Encoding") or "", signal_name,
                             srv.limits.max_inflated_bytes)
        except BodyError as exc:
            return self._error(exc.status, str(exc), as_json)
        except MemoryError:
            return self._error(413, "the body is too large to decode", as_json)
        rejected = records.rejected + srv.assembler.add(records.spans, records.logs)
        srv.counts["spans"] += len(records.spans)
        srv.counts["logs"] += len(records.logs)
        srv.counts["rejected"] += len(rejected)
        named = list(dict.fromkeys(rejected))  # one line per reason (a trace over its limit)
        message = "; ".join(named[:MAX_REJECTIONS_NAMED])
        if len(named) > MAX_REJECTIONS_NAMED:
            message += f"; and {len(named) - MAX_REJECTIONS_NAMED} more"
        if rejected:
            srv.log(f"rejected {len(rejected)}: {clean_text(message)[:500]}")
        self._reply(200, response_body(signal_name, len(rejected), message, as_json), as_json)

    def _read(self, size: int) -> bytes | None:
        """The body, read before a deadline; None when the client goes away or stalls."""
        deadline = time.monotonic() + self.server.limits.body_deadline_s
        chunks, got = [], 0
        try:
            while got < size:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                self.connection.settimeout(min(left, 5.0))
                chunk = self.rfile.read1(min(size - got, 1 << 20))
                if not chunk:
                    raise ConnectionError
                chunks.append(chunk)
                got += len(chunk)
        except (ConnectionError, TimeoutError, socket.timeout, OSError):
            self.server.counts["dropped_bodies"] += 1
            self.close_connection = True
            return None
        return b"".join(chunks)


class Receiver(ThreadingHTTPServer):
    """The HTTP server plus its assembler and writer thread (``start`` / ``stop``)."""
    daemon_threads = True
    request_queue_size = 256  # 20 agents connecting at once overflowed the default 5 (resets)

    def __init__(self, db_path, host: str = "127.0.0.1", port: int = 4318,
                 bounds: Bounds = Bounds(), limits: Limits = Limits(), run_id: str | None = None,
                 log=None):
        self.limits, self.bounds = limits, bounds
        self.log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        self.assembler = Assembler(bounds, run_id)
        self.writer = Writer(db_path, self.assembler, self.log)
        self.counts = {"spans": 0, "logs": 0, "rejected": 0, "dropped_bodies": 0}
        self.active, self._slots = 0, threading.Lock()
        self._stop = threading.Event()
        super().__init__((host, port), Handler)

    # at most max_connections served at once; the next is closed unanswered
    def process_request(self, request, client_address):
        with self._slots:
            if self.active >= self.limits.max_connections:
                self.shutdown_request(request)
                return
            self.active += 1
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._slots:
                self.active -= 1

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)

    def _write_loop(self) -> None:
        while not self._stop.wait(self.bounds.flush_s):
            try:
                self.writer.flush()
            except Exception as exc:  # never let the writer thread die silently
                self.log(f"error: writing stopped a round: {type(exc).__name__}: {exc}")

    def start(self) -> "Receiver":
        threading.Thread(target=self.serve_forever, daemon=True, name="otlp-http").start()
        self._writer_thread = threading.Thread(target=self._write_loop, daemon=True,
                                               name="otlp-writer")
        self._writer_thread.start()
        return self

    def stop(self) -> None:
        """Stop taking requests, then write everything held and finish the runs."""
        self.shutdown()
        self.server_close()
        self._stop.set()
        self._writer_thread.join()
        self.writer.flush(final=True)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


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
                   help="write what changed this often (default 0.5)")
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
                    token=token)
    try:
        receiver = Receiver(args.db, args.host, args.port, bounds, limits, args.run_id).start()
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
    print(f"receiving OTLP/HTTP at {receiver.url}/v1/traces and /v1/logs into {args.db} "
          "(Ctrl-C writes what it holds and stops)", flush=True)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        receiver.stop()
    c = receiver.counts
    print(f"received {c['spans']} spans and {c['logs']} log records ({c['rejected']} rejected); "
          f"{len(receiver.writer.runs)} run(s): {', '.join(receiver.writer.runs) or 'none'}",
          flush=True)
    return 0
