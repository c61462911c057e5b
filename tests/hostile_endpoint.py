"""A real HTTP server that answers the chat-completions protocol badly, on purpose: the faults a
client meets from a broken or hostile server (tests/test_endpoint_client_limits.py and the
measurements in its docstring).

``HostileServer(answer)`` listens on 127.0.0.1 (a free port) in a thread. ``answer(handler,
body)`` writes the whole response itself: ``body`` is the request's parsed JSON (None for a GET).
Every request is recorded in ``seen`` as (method, path, Authorization header or None).
Each fault ends by itself (a bounded drip, a bounded stream), so a client without limits makes a
test fail by its assertions, not hang the suite.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


class HostileServer:
    def __init__(self, answer: Callable):
        self.answer, self.seen = answer, []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):
                pass

            def _serve(self, method: str) -> None:
                owner.seen.append((method, self.path, self.headers.get("Authorization")))
                body = None
                if method == "POST":
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                try:
                    owner.answer(self, body)
                except (BrokenPipeError, ConnectionResetError):  # the client left: its limit
                    pass

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def completion(content, *, finish="stop", logprobs=None, usage=None) -> dict:
    """A chat completion as a server sends it, with any field set to anything."""
    choice = {"index": 0, "message": {"role": "assistant", "content": content},
              "finish_reason": finish}
    if logprobs is not None:
        choice["logprobs"] = {"content": logprobs}
    return {"id": "x", "object": "chat.completion", "choices": [choice],
            "usage": usage if usage is not None else {"prompt_tokens": 3,
                                                      "completion_tokens": 1,
                                                      "total_tokens": 4}}


def send_json(handler, data, status: int = 200) -> None:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(raw)))
    handler.end_headers()
    handler.wfile.write(raw)


def drip_body(handler, _body, every_s: float = 0.2, most_s: float = 30.0) -> None:
    """A 200 whose declared 100,000 bytes come one every ``every_s`` seconds (for ``most_s``)."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    handler.wfile.flush()
    end = time.monotonic() + most_s
    while time.monotonic() < end:
        handler.wfile.write(b" ")
        handler.wfile.flush()
        time.sleep(every_s)


def drip_head(handler, _body, every_s: float = 0.2, most_s: float = 30.0) -> None:
    """The status line and headers one byte every ``every_s`` seconds: no body is ever reached."""
    head = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * 60000 + b"\r\n\r\n"
    end = time.monotonic() + most_s
    for byte in head:
        if time.monotonic() > end:
            break
        handler.wfile.write(bytes([byte]))
        handler.wfile.flush()
        time.sleep(every_s)
    handler.close_connection = True


def endless_chunks(handler, _body, most_bytes: int | None = 64 << 20) -> None:
    """A chunked 200 that never ends (``most_bytes`` None) or ends after ``most_bytes``."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    piece = b"a" * (64 << 10)
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    sent = 0
    while most_bytes is None or sent < most_bytes:
        handler.wfile.write(chunk)
        sent += len(piece)
    handler.wfile.write(b"0\r\n\r\n")
    handler.close_connection = True


def slow_tls_server(every_s: float = 0.2, most_s: float = 30.0) -> tuple[socket.socket, int]:
    """A TCP listener that answers a TLS hello with a record header announcing 16 KiB, then
    drips its body one byte every ``every_s`` seconds: a handshake that never completes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def run():
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.recv(65536)  # the ClientHello
            end = time.monotonic() + most_s
            try:
                conn.sendall(b"\x16\x03\x03\x40\x00")
                while time.monotonic() < end:
                    conn.sendall(b"\x02")
                    time.sleep(every_s)
            except OSError:
                pass

    threading.Thread(target=run, daemon=True).start()
    return listener, listener.getsockname()[1]
