"""storage/asgi_serve.py, the uvicorn runner under ``agentrl endpoint`` and ``agentrl otlp``, with
a three-route starlette app (no model): idle connections make room, busy ones get 503, headers
have a deadline, ``read_body`` caps and times bodies, and ``run`` stops cleanly on SIGTERM."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from storage.asgi_serve import BodyRefused, ServeLimits, read_body, serve

ROOT = Path(__file__).resolve().parent.parent


async def _echo(request):
    try:
        body = await read_body(request, cap=1000, deadline_s=1.0)
    except BodyRefused as exc:
        return JSONResponse({"error": str(exc)}, exc.status, headers={"Connection": "close"})
    return JSONResponse({"bytes": len(body)})


async def _hi(request):
    return JSONResponse({"hi": 1})


APP = Starlette(routes=[Route("/echo", _echo, methods=["POST"]), Route("/", _hi)])


def ask(addr, request: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = [int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:")]
            if _ and length and len(body) >= length[0]:
                break
        return data


def until(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        time.sleep(0.01)


@pytest.fixture
def server():
    made = []

    def start(**limits):
        made.append(serve(APP, ServeLimits(**limits)))
        return made[-1], (made[-1].host, made[-1].port)
    yield start
    for s in made:
        s.stop()


def test_it_binds_loopback_and_idle_connections_make_room(server):
    srv, addr = server(max_connections=4)
    assert srv.host == "127.0.0.1"
    held = [socket.create_connection(addr) for _ in range(4)]
    try:
        until(lambda: srv.active == 4, "the 4 connections to be accepted")
        for _ in range(3):
            assert ask(addr, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").startswith(b"HTTP/1.1 200")
        assert srv.evicted >= 1 and srv.active <= 4
    finally:
        for s in held:
            s.close()


def test_when_every_connection_is_busy_the_next_gets_503(server):
    srv, addr = server(max_connections=2)
    held = [socket.create_connection(addr) for _ in range(2)]
    try:
        for s in held:  # a body announced and not sent: busy, not idle
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n")
        until(lambda: len(srv.server.server_state.tasks) == 2, "both requests to begin")
        got = ask(addr, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in got
    finally:
        for s in held:
            s.close()


@pytest.mark.parametrize("request_, status", [
    (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n", b"413"),
    (b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
     + b"5dc\r\n" + b"a" * 1500 + b"\r\n0\r\n\r\n", b"413"),
    (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc", b"408"),
    ("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: ²\r\n\r\n".encode(), b"400"),
    (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc", b"200")])
def test_read_body_caps_and_times_the_body(server, request_, status):
    _, addr = server()
    got = ask(addr, request_)
    assert got.startswith(b"HTTP/1.1 " + status), got[:200]


def test_a_request_whose_headers_drip_is_closed_at_the_header_deadline(server):
    _, addr = server(header_s=0.5)
    t0 = time.perf_counter()
    with socket.create_connection(addr, timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHo")
        assert s.recv(100) == b""  # closed, no answer
    assert 0.4 < time.perf_counter() - t0 < 3


def test_run_stops_cleanly_on_sigterm():
    script = textwrap.dedent("""
        import sys
        from starlette.applications import Starlette
        from storage.asgi_serve import run
        got = run(Starlette(), on_ready=lambda s: print(s.port, flush=True))
        print("stopped by", got, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        port = int(proc.stdout.readline())
        assert ask(("127.0.0.1", port), b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").startswith(
            b"HTTP/1.1 404")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, proc.stderr.read()
        assert proc.stdout.read().strip() == f"stopped by {int(signal.SIGTERM)}"
    finally:
        proc.kill()
        proc.wait()
