"""``export --format otlp`` (storage/otlp_export.py) with endpoint URLs that can never work,
against a real collector on loopback.

Before: ``http://user:hunter2@127.0.0.1:PORT/v1/traces`` was taken whole as a host name, tried
five times over 30 s of back-off, and the error printed the password; a URL with a space or a
line break, no host or a port that is not a number was likewise retried 30 s before its error.
Now each is refused before anything is sent or the store is read, and a password never appears.
"""
from __future__ import annotations

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from storage.otlp_export import ExportError, export_otlp, post
from tests.test_otlp_export_doors import BODY, STORE, Collector, raw


@pytest.fixture
def collector():
    ok = ExportTraceServiceResponse().SerializeToString()
    c = Collector(raw("200 OK", ok, "application/x-protobuf"))
    yield c
    c.close()


def _never(seconds):
    raise AssertionError(f"retried (slept {seconds} s) a URL that can never work")


@pytest.mark.parametrize("userinfo", ["user:hunter2@", "hunter2@", ":hunter2@"])
def test_a_password_in_the_url_is_refused_unsent_and_never_shown(collector, userinfo):
    url = collector.url.replace("127.0.0.1", userinfo + "127.0.0.1")
    with pytest.raises(ExportError) as err:
        post(url, BODY, token="T", timeout=5, sleep=_never)
    assert "hunter2" not in str(err.value) and "***@127.0.0.1" in str(err.value)
    assert "AGENTRL_OTLP_TOKEN" in str(err.value)
    assert collector.seen == []
    with pytest.raises(ExportError) as err:
        export_otlp(STORE, "no-such-run", url)  # refused before the store is read
    assert "hunter2" not in str(err.value)


@pytest.mark.parametrize("url, why", [
    ("http://127.0.0.1:{port}/v1/traces\r\nX-Injected: 1", "control characters"),
    ("http://127.0.0.1:{port}/v1/ traces", "control characters"),
    ("http:///v1/traces", "no host"),
    ("http://127.0.0.1:notaport/v1/traces", "port"),
    ("http://127.0.0.1:99999/v1/traces", "port"),
    ("ftp://127.0.0.1/v1/traces", "only http")])
def test_a_url_that_can_never_work_fails_at_once_without_retries(collector, url, why):
    port = collector.url.split(":")[2].split("/")[0]
    with pytest.raises(ExportError, match="(?i)" + why):
        post(url.format(port=port), BODY, timeout=5, sleep=_never)
    assert collector.seen == []


def test_the_plain_url_still_exports(collector):
    assert post(collector.url, BODY, timeout=5, sleep=_never) == ExportTraceServiceResponse()
    assert len(collector.seen) == 1


def test_https_to_a_plain_http_collector_fails_at_once_and_says_so():
    """A plain HTTP server answers a TLS hello with a 400: the handshake fails the same way
    every time. Before: five tries over 30 s of back-off, then the bare SSL error."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Plain(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"https://127.0.0.1:{httpd.server_address[1]}/v1/traces"
        with pytest.raises(ExportError, match="TLS failed .*is it an http:// endpoint"):
            post(url, BODY, timeout=5, sleep=_never)
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("timeout", [float("nan"), 0, -1, float("inf"), 1e308, True])
def test_a_timeout_that_is_not_seconds_is_refused_naming_the_flag(collector, timeout):
    """Before: nan, 0 and -1 failed as "no complete answer within nan s"; inf and 1e308 as an
    OverflowError from the timer."""
    with pytest.raises(ExportError, match="--timeout"):
        post(collector.url, BODY, timeout=timeout, sleep=_never)
    with pytest.raises(ExportError, match="--timeout"):
        export_otlp(STORE, "no-such-run", collector.url, timeout=timeout)
    assert collector.seen == []


def test_a_collector_that_never_reads_is_cut_at_one_deadline_not_two():
    """The request's sockets wait at most the time left, so a send blocked on a collector that
    never reads times out at the deadline; that timeout came a moment before the deadline's
    timer and was taken for a failed try: the request was sent again, in full (6.3 s for a 3 s
    --timeout). A race: before the fix this failed about every other run."""
    import gzip
    import os
    import socket
    import threading
    import time
    listener = socket.create_server(("127.0.0.1", 0))
    held = []

    def accept():
        while True:
            try:
                held.append(listener.accept()[0])  # and never read
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1/traces"
        body = os.urandom(8 << 20)
        t0 = time.monotonic()
        gzip.compress(body)  # what post() does before its deadline starts (0.3-0.9 s loaded)
        zipping = time.monotonic() - t0
        t0 = time.monotonic()
        with pytest.raises(ExportError, match="within 1 s"):
            post(url, body, timeout=1, sleep=_never)
        assert len(held) == 1                             # sent once, never again
        assert time.monotonic() - t0 - zipping < 1.9     # a second deadline would be 2 s
    finally:
        listener.close()
        for s in held:
            s.close()
