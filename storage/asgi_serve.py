"""An ASGI (starlette) app served by uvicorn with the limits a server on an open port needs, for
the project's two servers (``agentrl endpoint``, ``agentrl otlp``).

    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from storage.asgi_serve import BodyRefused, ServeLimits, read_body, run, serve

    async def echo(request):
        try:
            body = await read_body(request, cap=1 << 20, deadline_s=30)
        except BodyRefused as exc:  # 400 / 408 / 413, decided before or while reading
            return JSONResponse({"error": str(exc)}, exc.status, headers={"Connection": "close"})
        return JSONResponse({"bytes": len(body)})

    app = Starlette(routes=[Route("/echo", echo, methods=["POST"])])
    served = serve(app, ServeLimits(max_connections=64))   # in a thread; 127.0.0.1, a free port
    print(served.url)                                      # http://127.0.0.1:PORT
    served.stop()                                          # requests in flight finish first
    # or in the foreground until SIGINT / SIGTERM (then the same clean stop; returns the signal):
    run(app, ServeLimits(), host="127.0.0.1", port=8000, on_ready=lambda s: print(s.url))

What uvicorn alone does not bound, and this module does (``_Guarded``, its HTTP protocol):

* **header timeout** (``header_s``): a request's line and headers must be complete within
  ``header_s`` of the connection's start (of the request's first byte on a kept-alive
  connection), else the connection is closed. uvicorn has none: a client sending a byte every
  2 s, or nothing, holds its connection for ever.
* **idle connections never lock clients out**: at ``max_connections`` open, a new connection
  closes the connection that has waited longest for its request to arrive (idle, still sending
  headers, or still sending a body begun over ``body_grace_s`` ago); only when every one is busy
  with a request is the new one answered 503 and closed. So 64 silent sockets cost 64 sockets, not the service, and
  64 sockets dripping a body (a byte every 2 s, each cut at its body deadline and sent again)
  do not hold every other client out either.
* **a refusal survives**: a reply sent before the body was read (401, 413, ...) is followed by a
  half-close and the client's bytes are read and dropped (``DRAIN_BYTES`` / ``DRAIN_S`` at most)
  before closing; closing over unread bytes resets the connection, which can destroy the reply.
* **a malformed request** (``Content-Length: ²``, a bad header line) gets ``bad_request(text)``'s
  JSON 400 and a close, not uvicorn's plain-text one.

uvicorn's own limits are set too: ``idle_s`` (keep-alive), ``max_header_bytes`` (h11's buffer),
``limit_concurrency`` (requests at once, a backstop: 503). Bodies are the app's to bound:
``read_body`` (declared length over the cap 413 unread; over ``deadline_s`` in all 408).
"""
from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Callable

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

DRAIN_BYTES, DRAIN_S = 1 << 20, 1.0
"""After a reply sent before the request's body was read: what is still read and dropped (at
most) before the connection is closed."""


@dataclass(frozen=True)
class ServeLimits:
    """What one connection may hold of the server."""
    max_connections: int = 64
    """Open connections at most: past it an idle one is closed for the new one, else 503."""
    header_s: float = 10.0
    """A request's line and headers complete within this (from the connection or first byte)."""
    idle_s: float = 60.0
    """A kept-alive connection's silence at most between requests."""
    max_header_bytes: int = 64 << 10
    """A request line plus headers at most (h11 answers 400 past it)."""
    shutdown_s: float = 30.0
    """On stop, requests in flight get this long to finish; then they are cancelled."""
    body_grace_s: float = 1.0
    """A body still arriving this long after its headers may be closed for a new connection when
    all are taken (a body that comes at once is never at risk; a dripped one is)."""


def _default_bad_request(text: str) -> bytes:
    return json.dumps({"error": {"message": text, "code": 400}}).encode()


_BUSY_BODY = json.dumps({"error": {"message": "too many connections; retry",
                                   "type": "server_error", "param": None,
                                   "code": 503}}).encode()
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
         b"Retry-After: 1\r\nConnection: close\r\n"
         + f"Content-Length: {len(_BUSY_BODY)}\r\n\r\n".encode() + _BUSY_BODY)


class BodyRefused(Exception):
    """A body not accepted: ``status`` (400, 408, 411, 413) and ``header`` (the field at fault:
    Content-Length, or "body" when it was the bytes themselves)."""

    def __init__(self, status: int, header: str, message: str):
        super().__init__(f"{header}: {message}")
        self.status, self.header, self.message = status, header, message


def declared_length(headers, cap: int) -> int | None:
    """The body's announced length (None when chunked), ``BodyRefused`` when it is malformed
    (400) or over ``cap`` (413), decided from the headers before a byte is read."""
    values = headers.getlist("content-length")
    if not values:
        return None
    texts = {v.strip() for v in values}
    if len(texts) > 1 or not all(t.isascii() and t.isdigit() and len(t) <= 20 for t in texts):
        raise BodyRefused(400, "Content-Length", f"{', '.join(values)!r} is not one "
                          "non-negative integer")
    length = int(texts.pop())
    if length > cap:
        raise BodyRefused(413, "Content-Length", f"{length} bytes is over the limit of {cap}")
    return length


async def read_body(request, cap: int, deadline_s: float) -> bytes:
    """The request's whole body, at most ``cap`` bytes, received within ``deadline_s`` in all
    (not per read: a byte every second is still cut). ``BodyRefused`` 400/413 from the headers
    (unread), 413 once a chunked body passes the cap, 408 at the deadline. A client that leaves
    mid-body raises starlette's ``ClientDisconnect``."""
    length = declared_length(request.headers, cap)
    body = bytearray()
    try:
        async with asyncio.timeout(deadline_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > cap:
                    raise BodyRefused(413, "body", f"over the limit of {cap} bytes")
    except TimeoutError:
        want = f"{length} bytes" if length is not None else "body"
        raise BodyRefused(408, "body", f"the {want} did not arrive within {deadline_s:g} s "
                          f"({len(body)} came)") from None
    return bytes(body)


# -- the protocol ---------------------------------------------------------------------------
class _Draining:
    """The connection's transport, whose ``close`` half-closes and drains first when the client
    may still be sending its body (see the module docstring)."""

    def __init__(self, transport, protocol: "_Guarded"):
        self._t, self._p, self.draining = transport, protocol, False

    def __getattr__(self, name):
        return getattr(self._t, name)

    def is_closing(self) -> bool:
        return self.draining or self._t.is_closing()

    def close(self) -> None:
        if self.draining or self._t.is_closing():
            return
        if self._p.conn.their_state in (h11.SEND_BODY, h11.ERROR) and self._t.can_write_eof():
            self.draining, self._p.drained = True, 0
            self._t.write_eof()
            self._t.resume_reading()
            self._p.drain_timer = self._p.loop.call_later(DRAIN_S, self._t.close)
            return
        self._t.close()


class _Guarded(H11Protocol):
    """uvicorn's h11 protocol with the header timeout, idle-first eviction, draining close and
    JSON 400 of the module docstring. ``limits`` and ``bad_request`` are set by ``serve``'s
    subclass."""
    limits: ServeLimits
    bad_request: Callable[[str], bytes]
    evicted = 0

    def connection_made(self, transport) -> None:
        self.header_timer = self.drain_timer = self.began = None
        self.waiting_since, self.drained = self.loop.time(), 0
        super().connection_made(_Draining(transport, self))
        self._arm()
        if len(self.connections) > self.limits.max_connections and not self._evict():
            transport.write(_BUSY)
            self.transport.close()

    def _waiting(self) -> bool:
        """Its request not all here: idle, its headers not complete, or its body still arriving
        with no reply begun (a reply sent before the body is read drains, ``is_closing``)."""
        if self.transport.is_closing():
            return False
        if self.conn.their_state is h11.IDLE:
            return self.cycle is None or self.cycle.response_complete
        return (self.conn.their_state is h11.SEND_BODY and self.cycle is not None
                and not self.cycle.response_started and self.began is not None
                and self.loop.time() - self.began > self.limits.body_grace_s)

    def _evict(self) -> bool:
        idle = [c for c in self.connections if c is not self and isinstance(c, _Guarded)
                and c._waiting()]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.waiting_since)
        type(self).evicted += 1
        oldest.transport._t.close()  # no reply went out: nothing to drain for
        return True

    def _arm(self) -> None:
        if self.header_timer is None:
            self.header_timer = self.loop.call_later(self.limits.header_s, self._headers_late)

    def _disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _headers_late(self) -> None:
        self.header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.transport.draining:  # a refusal went out: the rest of the body is dropped
            self.drained += len(data)
            if self.drained > DRAIN_BYTES:
                self.transport._t.close()
            return
        if self.conn.their_state is h11.IDLE:
            self._arm()  # a kept-alive connection's next request: timed from its first byte
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()
            if self.began is None:  # the headers are complete: the body's clock starts
                self.began = self.loop.time()

    def eof_received(self):
        if self.transport.draining:
            self.transport._t.close()
        return None

    def on_response_complete(self) -> None:
        self.waiting_since, self.began = self.loop.time(), None
        super().on_response_complete()
        if self.conn.their_state is not h11.IDLE:  # a pipelined request already complete
            self._disarm()
            self.began = self.loop.time()

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self.drain_timer is not None:
            self.drain_timer.cancel()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        # called inside uvicorn's `except h11.RemoteProtocolError`: the exception names the fault
        err = sys.exc_info()[1]
        body = self.bad_request(f"invalid HTTP request: {err or msg}")
        event = h11.Response(status_code=400, reason=b"Bad Request", headers=[
            (b"content-type", b"application/json"), (b"connection", b"close"),
            (b"content-length", str(len(body)).encode())])
        try:
            for part in (event, h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(part))
        except h11.LocalProtocolError:  # h11 cannot answer in its state: the raw bytes then
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json"
                                 b"\r\nConnection: close\r\nContent-Length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.transport.close()


# -- running it -----------------------------------------------------------------------------
class Served:
    """A server running in a thread: ``host``, ``port``, ``url``, ``active`` (connections open
    now), ``evicted`` (idle connections closed for new ones), ``stop()``."""

    def __init__(self, server: uvicorn.Server, sock: socket.socket, protocol: type[_Guarded]):
        self.server, self._sock, self._protocol = server, sock, protocol
        self.host, self.port = sock.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"asgi-{self.port}")
        self._thread.start()

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self._sock])
        finally:
            self._sock.close()

    @property
    def active(self) -> int:
        return len(self.server.server_state.connections)

    @property
    def evicted(self) -> int:
        return self._protocol.evicted

    def stop(self, timeout: float | None = None, force: bool = False) -> None:
        """Stop accepting, close idle connections, let requests in flight finish (at most
        ``limits.shutdown_s``), and return once the server's thread has ended. ``force`` (also
        while another thread waits in ``stop``): stop waiting, cancel what is in flight now."""
        self.server.should_exit = True
        if force:
            self.server.force_exit = True
        self._thread.join(timeout)


def serve(app, limits: ServeLimits = ServeLimits(), host: str = "127.0.0.1", port: int = 0,
          bad_request: Callable[[str], bytes] = _default_bad_request) -> Served:
    """Serve ``app`` from a daemon thread on ``host:port`` (0: a free port). The socket is bound
    here, so a port in use raises OSError in the caller. ``bad_request(text)`` is the JSON body
    of the 400 for a request h11 cannot parse."""
    protocol = type("Guarded", (_Guarded,), {"limits": limits, "evicted": 0,
                                             "bad_request": staticmethod(bad_request)})
    config = uvicorn.Config(
        app, http=protocol, loop="asyncio", ws="none", lifespan="off", interface="asgi3",
        log_config=None, log_level="error", access_log=False, proxy_headers=False,
        server_header=False, timeout_keep_alive=limits.idle_s,
        limit_concurrency=limits.max_connections + 1,  # uvicorn counts the asking one too
        h11_max_incomplete_event_size=limits.max_header_bytes,
        timeout_graceful_shutdown=limits.shutdown_s)
    sock = socket.create_server((host, port), backlog=2048)
    served = Served(uvicorn.Server(config), sock, protocol)
    return served


def run(app, limits: ServeLimits = ServeLimits(), host: str = "127.0.0.1", port: int = 0,
        on_ready: Callable[[Served], None] | None = None,
        bad_request: Callable[[str], bytes] = _default_bad_request) -> int:
    """Serve ``app`` in the foreground until SIGINT or SIGTERM, then stop cleanly (``stop``) and
    return the signal's number; a second signal while requests in flight are still being
    answered stops at once (they are cancelled); call from the main thread."""
    got: list[int] = []
    woken = threading.Event()
    running: list[Served] = []

    def ask_stop(signum, _frame):
        if got and running:  # the user asks again: do not wait out shutdown_s
            running[0].server.force_exit = True
        got.append(signum)
        woken.set()

    previous = {s: signal.signal(s, ask_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        served = serve(app, limits, host, port, bad_request)
        running.append(served)
        if on_ready is not None:
            on_ready(served)
        while not woken.wait(1.0):
            if not served._thread.is_alive():
                break
        served.stop()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return got[0] if got else 0
