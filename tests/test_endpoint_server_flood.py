"""``agentrl endpoint`` (core/serve/server.py, on storage/asgi_serve.py's uvicorn) against
connection floods and malformed headers, over raw sockets and the tiny model: idle or dripping
connections do not lock a real client out, a request's headers have a deadline, a length h11
cannot read is a JSON 400, and the model's work leaves the server answering.

Before the move to uvicorn, 64 idle connections got every later client a 503 for as long as they
were held (bench/endpoint_idle_lockout.py), a client sending its headers a byte at a time held its
connection for ever, and ``Content-Length: ²`` was answered with a traceback.
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from core.serve.server import ChatModel, Limits, serve

HI = [{"role": "user", "content": "hi"}]
MODELS = b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n"


def chat(fields: dict | None = None, head: str = "") -> bytes:
    raw = json.dumps({"messages": HI, "max_tokens": 2, **(fields or {})}).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n{head}"
            f"Content-Length: {len(raw)}\r\n\r\n").encode() + raw


def reply(sock: socket.socket) -> tuple[int, dict, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed without a reply: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk, "the connection closed mid-reply"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def until(condition, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def model():
    return ChatModel("tiny")


@pytest.fixture
def make(model):
    made = []

    def start(api_key: str | None = None, **limits):
        srv = serve(model, api_key=api_key, limits=Limits(**limits))
        made.append(srv)
        return srv, ("127.0.0.1", srv.server_address[1])
    yield start
    for srv in made:
        srv.shutdown()
        srv.server_close()


def test_64_idle_connections_do_not_lock_a_client_out(make):
    """The default limit (64 connections) filled with 32 silent sockets and 32 that sent half a
    request line: a real client still gets its models list and a completion, at once."""
    srv, addr = make()
    held = [socket.create_connection(addr) for _ in range(64)]
    try:
        for s in held[::2]:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHo")
        until(lambda: srv.active == 64, "the 64 connections to be open")
        for request in (MODELS, chat()):
            t0 = time.perf_counter()
            with socket.create_connection(addr, timeout=10) as s:
                s.sendall(request)
                status, _, body = reply(s)
            assert status == 200, body
            assert time.perf_counter() - t0 < 5
        assert srv.served.evicted >= 1  # the longest-idle one made room
    finally:
        for s in held:
            s.close()


@pytest.mark.parametrize("length", ["²", "1e3", "12, 13", "0x10"])
def test_a_malformed_content_length_is_a_json_400(make, length):
    srv, addr = make()
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: {length}"
                  "\r\n\r\n{}".encode())
        status, headers, body = reply(s)
        assert s.recv(100) == b""                       # and the connection closed
    error = json.loads(body)["error"]
    assert status == 400 and headers["connection"] == "close"
    assert error["param"] == "Content-Length" and "Content-Length" in error["message"]
    with socket.create_connection(addr, timeout=10) as s:  # and the server serves on
        s.sendall(MODELS)
        assert reply(s)[0] == 200


@pytest.mark.parametrize("every_s", [2.0, 0.3])
def test_headers_dripped_a_byte_at_a_time_are_cut_at_the_header_deadline(make, every_s):
    """One byte, then another every ``every_s`` seconds (the wait is the read that finds the
    connection closed): cut once the headers' deadline from the connection's start has passed,
    however often the bytes come."""
    srv, addr = make(header_s=1.0)
    request = b"GET /v1/models HTTP/1.1\r\nHost: " + b"h" * 200 + b"\r\n\r\n"
    t0 = time.perf_counter()
    with socket.create_connection(addr, timeout=10) as s:
        closed = False
        for byte in request:
            try:
                s.sendall(bytes([byte]))
                s.settimeout(every_s)
                closed = s.recv(100) == b""
            except TimeoutError:
                continue
            except ConnectionError:
                closed = True
            if closed:
                break
    took = time.perf_counter() - t0
    assert closed and 0.9 < took < 1.0 + every_s + 1.0, took
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(MODELS)
        assert reply(s)[0] == 200


def test_the_server_answers_while_the_model_works_and_its_queue_is_bounded(make, model):
    """A 3,000-token generation holds the model: ``/v1/models`` is still answered at once, one
    more chat request waits (max_waiting=1), the next is a 503 with Retry-After; once the
    clients leave, the queue empties and a request is served."""
    srv, addr = make(max_waiting=1)
    first = socket.create_connection(addr)
    first.sendall(chat({"max_tokens": 3000, "temperature": 0}))
    until(model.lock.locked, "the long request to start generating")
    second = socket.create_connection(addr)
    second.sendall(chat({"max_tokens": 3000, "temperature": 0}))
    until(lambda: srv.generations.waiting == 1, "the second request to wait")
    try:
        t0 = time.perf_counter()
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(MODELS)
            assert reply(s)[0] == 200
        assert time.perf_counter() - t0 < 2 and model.lock.locked()
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(chat())
            status, headers, body = reply(s)
        assert status == 503 and headers["retry-after"] == "1"
        assert "waiting for the model" in json.loads(body)["error"]["message"]
    finally:
        first.close()
        second.close()
    until(lambda: not model.lock.locked() and srv.generations.waiting == 0, "the queue to empty")
    with socket.create_connection(addr, timeout=20) as s:
        s.sendall(chat())
        assert reply(s)[0] == 200


def test_a_refusal_before_the_body_reaches_a_client_still_sending_it(make):
    """A wrong key with 2 MiB on its way: the 401 is read whole, not lost to a reset."""
    srv, addr = make(api_key="k")
    body = b"x" * (2 << 20)
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer no"
                  + f"\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        sender = threading.Thread(target=lambda: _send_quietly(s, body), daemon=True)
        sender.start()
        status, headers, _ = reply(s)
    assert status == 401 and headers["connection"] == "close"


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_command_stops_cleanly_on_sigterm_and_sigint(sig):
    """``python -m core.endpoint_server``: answers, then on SIGTERM (a supervisor's stop) or
    Ctrl-C releases its port and exits 0 (SIGTERM used to kill it mid-request)."""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-m", "core.endpoint_server", "--port", "0"],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        port = int(line.split("/v1")[0].rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
            s.sendall(MODELS)
            assert reply(s)[0] == 200
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
    finally:
        proc.kill()
        proc.wait()
