"""``export --format otlp`` (storage/otlp_export.py) against collectors that answer badly, each a
real server on loopback (a thread with a socket, writing raw HTTP): a redirect is not followed
and the token never reaches the URL it names; a collector dripping its answer is cut at the
request's deadline; a 200 that is not an ExportTraceServiceResponse is an error, not a success;
spans the collector rejects fail the export with their count, the command included.

Before: the 302 was followed with the token to the other origin and its empty 200 counted as
success; a byte every 0.25 s kept a 1 s request alive until the server stopped; a web page's 200
was a protobuf DecodeError traceback or a success; rejected spans printed "sent N trajectories".
"""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)

from storage import queries
from storage.export import Filters
from storage.io import main as io_main
from storage.otlp_export import ExportError, ExportRejected, export_otlp, post

STORE = Path(__file__).resolve().parent.parent / "sample_runs" / "apps_tiny.duckdb"
BODY = ExportTraceServiceRequest().SerializeToString()


class Collector:
    """Answers every request with ``answer(conn)``, which writes the raw reply; ``seen`` keeps
    each request's headers (lower-case names)."""

    def __init__(self, answer):
        self.answer, self.seen = answer, []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1/traces"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, body = data.split(b"\r\n\r\n", 1)
                headers = {k.strip().lower(): v.strip() for k, v in
                           (line.split(":", 1) for line in head.decode().split("\r\n")[1:])}
                while len(body) < int(headers.get("content-length", 0)):
                    body += conn.recv(65536)
                self.seen.append(headers)
                self.answer(conn)
            except OSError:  # the client cut the connection: its deadline
                pass

    def close(self) -> None:
        self.listener.close()


def raw(status: str, body: bytes = b"", kind: str | None = None, extra: str = ""):
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n{extra}"
    if kind:
        head += f"Content-Type: {kind}\r\n"
    return lambda conn: conn.sendall(head.encode() + b"\r\n" + body)


@pytest.fixture
def collectors():
    made = []

    def start(answer):
        made.append(Collector(answer))
        return made[-1]
    yield start
    for c in made:
        c.close()


def test_a_redirect_is_not_followed_and_the_token_stays_home(collectors):
    other = collectors(raw("200 OK"))                      # an empty 200: the old "success"
    first = collectors(raw("302 Found", extra=f"Location: {other.url}\r\n"))
    with pytest.raises(ExportError, match=rf"{first.url}: HTTP 302 redirect to "
                                          rf"'{other.url}' not followed"):
        post(first.url, BODY, token="s3cret", sleep=lambda s: None)
    assert first.seen[0]["authorization"] == "Bearer s3cret"
    assert other.seen == []                                 # never contacted, token or not


def test_a_collector_dripping_its_answer_is_cut_at_the_deadline(collectors):
    def drip(conn, every_s=0.25, most_s=8.0):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
                     b"Content-Length: 100000\r\n\r\n")
        end = time.monotonic() + most_s
        while time.monotonic() < end:
            conn.sendall(b"\x00")
            time.sleep(every_s)
    slow = collectors(drip)
    t0 = time.perf_counter()
    with pytest.raises(ExportError, match=r"no complete answer within 1 s"):
        post(slow.url, BODY, timeout=1.0, sleep=lambda s: None)
    assert time.perf_counter() - t0 < 3.0
    assert len(slow.seen) == 1                              # a deadline is not retried


@pytest.mark.parametrize("kind, body, why", [
    ("text/html", b"<html><body>Welcome</body></html>", "Content-Type 'text/html'"),
    ("application/json", b"{}", "Content-Type 'application/json'"),
    (None, b"<html>hello</html>", "not an ExportTraceServiceResponse"),
    ("application/x-protobuf", b"\x12\x09\x08", "not an ExportTraceServiceResponse")])
def test_a_200_that_is_not_an_otlp_answer_is_an_error(collectors, kind, body, why):
    page = collectors(raw("200 OK", body, kind))
    with pytest.raises(ExportError, match=why):
        post(page.url, BODY, sleep=lambda s: None)


def test_rejected_spans_fail_the_export_with_their_count(collectors, capsys):
    answer = ExportTraceServiceResponse()
    answer.partial_success.rejected_spans = 2
    answer.partial_success.error_message = "spans older than 7 days"
    picky = collectors(raw("200 OK", answer.SerializeToString(), "application/x-protobuf"))
    run = queries.runs(STORE)["run_id"].iloc[0]
    first = int(queries.trajectories(STORE, run)["step"].min())
    with pytest.raises(ExportRejected, match="rejected 2 of .* spans .*older than 7 days") as exc:
        export_otlp(STORE, run, picky.url, Filters(step_max=first))
    assert exc.value.rejected == 2 * len(picky.seen) and exc.value.sent > 0  # 2 a request
    asked = len(picky.seen)
    _, rejected = export_otlp(STORE, run, picky.url, Filters(step_max=first), allow_rejected=True)
    assert rejected == 2 * (len(picky.seen) - asked)
    code = io_main(["export", "--db", str(STORE), "--run", run, "--format", "otlp",
                    "--step-max", str(first), "--endpoint", picky.url])
    out, err = capsys.readouterr()
    assert code != 0 and "sent" not in out and "rejected 2 of" in err
