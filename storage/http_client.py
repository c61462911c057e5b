"""HTTP requests bounded the same way everywhere this product calls out (the endpoint client,
core/endpoint/client.py; ``export --format otlp``, storage/otlp_export.py): one deadline and one
size cap per request, and no redirect that would carry a key or token to another origin.

Why not plain ``urllib.request.urlopen(timeout=t)``: its ``t`` bounds each socket operation, so
a server sending one byte every ``t/2`` seconds keeps a request alive for ever; it reads a body
of any size into memory; and its redirect handler re-sends every header, ``Authorization``
included, to whatever host a 3xx names.

Here (still urllib, so ``HTTP(S)_PROXY`` keep working):

* ``Deadline``: each socket operation of the request (connect, TLS handshake, send, every read of
  the headers and body) waits at most the time left until ``start + limit_s``; once it has passed,
  the next one raises ``TimeoutError`` at once. So the whole request ends by the deadline plus
  one scheduling delay, however the server paces its bytes. Not bounded by it: name resolution
  (``getaddrinfo`` has no timeout); each resolved address is tried with the time left then.
* ``read_capped``: the body read in 64 KiB pieces, refused (``BodyTooLarge``) as soon as it, or
  its announced ``Content-Length``, passes the cap: memory stays under the cap plus one piece.
* ``opener(redirects=...)``: ``"same-origin"`` (``SameOriginRedirects``): a redirect to another
  scheme, host or port raises ``RedirectRefused`` naming both origins, and the new origin is never
  contacted; ``"none"``: no redirect is followed, the 3xx comes back as urllib's ``HTTPError``.
"""
from __future__ import annotations

import functools
import http.client
import io
import select
import socket
import ssl
import time
import urllib.parse
import urllib.request

READ_PIECE = 64 << 10
"""Bytes asked of the socket per read: small enough that the cap is checked often."""


class BodyTooLarge(Exception):
    """The reply is longer than the cap (``size`` the bytes read or announced, at least)."""

    def __init__(self, size: int, cap: int, announced: bool):
        how = "announced" if announced else "read"
        super().__init__(f"reply body over {cap:,} bytes ({size:,} {how})")
        self.size, self.cap = size, cap


class RedirectRefused(Exception):
    """A 3xx to another origin: following it would send the key there."""

    def __init__(self, code: int, source: str, target: str):
        super().__init__(f"redirect from {source} to {target} refused: the API key is "
                         f"never sent to another origin; use the URL it redirects to")
        self.code, self.source, self.target = code, source, target


class Deadline:
    """One request's end: ``limit_s`` seconds after it was made."""

    def __init__(self, limit_s: float):
        self.limit_s, self.end = limit_s, time.monotonic() + limit_s

    def left(self) -> float:
        """Seconds left; ``TimeoutError`` once none are."""
        left = self.end - time.monotonic()
        if left <= 0:
            raise self.passed()
        return left

    def passed(self, during: str = "connect to last byte") -> TimeoutError:
        return TimeoutError(f"the request took over {self.limit_s:g} s ({during})")


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url``, the port made explicit (80 / 443 when not given)."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}:{port}"


def opener(redirects: str = "same-origin") -> urllib.request.OpenerDirector:
    """urllib's opener with this module's HTTP(S) and redirect handlers in place of its own:
    redirects followed within the origin (``"same-origin"``) or never (``"none"``)."""
    handlers = {"same-origin": SameOriginRedirects, "none": NoRedirects}
    if redirects not in handlers:
        raise ValueError(f"redirects={redirects!r}: one of {', '.join(handlers)}")
    return urllib.request.build_opener(_HTTPHandler, _HTTPSHandler, handlers[redirects])


def request(url: str, deadline: Deadline, data: bytes | None = None, headers: dict | None = None,
            method: str | None = None) -> urllib.request.Request:
    """A Request that carries its deadline (the handlers read it from there)."""
    req = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    req.deadline = deadline
    return req


def read_capped(response, cap: int) -> bytes:
    """The whole body, or ``BodyTooLarge`` once it, or its ``Content-Length``, passes ``cap``."""
    announced = response.headers.get("Content-Length")
    if announced and announced.strip().isdigit() and int(announced) > cap:
        raise BodyTooLarge(int(announced), cap, True)
    body = bytearray()
    while True:
        piece = response.read(min(READ_PIECE, cap + 1 - len(body)))
        if not piece:
            return bytes(body)
        body += piece
        if len(body) > cap:
            raise BodyTooLarge(len(body), cap, False)


class SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, but only within the origin the request was made to."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        source, target = origin(req.full_url), origin(newurl)
        if source != target:
            fp.close()
            raise RedirectRefused(code, source, target)
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            new.deadline = req.deadline
        return new


class NoRedirects(urllib.request.HTTPRedirectHandler):
    """No redirect is followed: the 3xx is answered as an ``HTTPError`` (its ``Location`` in its
    headers), and the URL it names is never contacted."""

    def redirect_request(self, *args):
        return None


class _DeadlineSocket:
    """A connected socket whose every send and receive waits at most the time left."""

    def __init__(self, sock: socket.socket, deadline: Deadline):
        self.sock, self.deadline = sock, deadline
        self._files, self._closed = 0, False

    def _armed(self, operation, *args):
        self.sock.settimeout(self.deadline.left())
        try:
            return operation(*args)
        except TimeoutError:  # it waited the time left: the deadline, not one slow read
            raise self.deadline.passed() from None

    def sendall(self, *args):
        return self._armed(self.sock.sendall, *args)

    def recv_into(self, *args):
        return self._armed(self.sock.recv_into, *args)

    def recv(self, *args):
        return self._armed(self.sock.recv, *args)

    def makefile(self, mode="rb", buffering=None, **_):
        # what http.client reads the status, headers and body through; SocketIO calls our
        # recv_into, so each buffered read is armed too
        if mode != "rb":
            raise ValueError(f"mode {mode!r}: only 'rb' is used by http.client")
        self._files += 1
        return io.BufferedReader(socket.SocketIO(self, "rb"))

    def _decref_socketios(self) -> None:
        # the response's file outlives the connection's close (urllib closes it at once): the
        # socket is shut only when both are done, as socket.socket itself does
        self._files -= 1
        if self._closed and self._files <= 0:
            self.sock.close()

    def close(self) -> None:
        self._closed = True
        if self._files <= 0:
            self.sock.close()

    def __getattr__(self, name):  # setsockopt, fileno, ...
        return getattr(self.sock, name)


def _connect(deadline: Deadline, address, timeout=None, source_address=None):
    """``socket.create_connection``, but each resolved address is tried with the time left
    now, not the time left before the first: a name whose addresses all leave the handshake
    unanswered is given up at the deadline, not after the limit once per address."""
    host, port = address
    error: OSError | None = None
    for family, kind, proto, _, addr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.left())
            if source_address:
                sock.bind(source_address)
            sock.connect(addr)
        except TimeoutError:
            sock.close()
            raise deadline.passed("connect") from None
        except OSError as exc:  # refused, unreachable: the next address
            sock.close()
            error = exc
            continue
        return _DeadlineSocket(sock, deadline)
    raise error or OSError(f"{host!r} resolved to no address")


class _Connection(http.client.HTTPConnection):
    def __init__(self, host, *, deadline: Deadline, timeout=None, **kwargs):
        super().__init__(host, timeout=deadline.left(), **kwargs)
        self._create_connection = functools.partial(_connect, deadline)


class _TLSConnection(http.client.HTTPSConnection):
    def __init__(self, host, *, deadline: Deadline, timeout=None, **kwargs):
        super().__init__(host, timeout=deadline.left(), **kwargs)
        self._create_connection = functools.partial(_connect, deadline)
        self.deadline = deadline

    def connect(self):
        http.client.HTTPConnection.connect(self)  # TCP and any proxy tunnel, armed
        name = self._tunnel_host or self.host
        tls = self._context.wrap_socket(self.sock.sock, server_hostname=name,
                                        do_handshake_on_connect=False)
        _handshake(tls, self.deadline)
        self.sock = _DeadlineSocket(tls, self.deadline)


def _handshake(tls: ssl.SSLSocket, deadline: Deadline) -> None:
    """The TLS handshake within the deadline: non-blocking steps, each wait the time left (a
    blocking handshake would bound each of its reads, not the handshake)."""
    tls.setblocking(False)
    while True:
        try:
            tls.do_handshake()
            return
        except ssl.SSLWantReadError:
            ready = select.select([tls], [], [], deadline.left())[0]
        except ssl.SSLWantWriteError:
            ready = select.select([], [tls], [], deadline.left())[1]
        if not ready:  # the wait ran to the deadline
            raise deadline.passed("TLS handshake")


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(functools.partial(_Connection, deadline=req.deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        return self.do_open(functools.partial(_TLSConnection, deadline=req.deadline), req,
                            context=self._context)
