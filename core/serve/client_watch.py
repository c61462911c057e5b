"""A request's watch: is the client that asked still connected, and is the request past its
deadline? The model (core/serve/chat_model.py) asks between generated tokens and while waiting
for the one generation lock, so a client that leaves (or a request that runs too long) frees the
lock within about ``every_s`` instead of after its whole ``max_tokens``.

The client's departure is seen either on its socket (``sock``: peeked) or through ``left``, a
callable the server's event loop makes true when the connection is lost (core/serve/server.py).
A client that half-closes its socket after sending (``shutdown(SHUT_WR)``, as ``nc -N`` does)
reads as gone: a peer's FIN and a closed socket look the same from here, and HTTP clients keep
the socket open while they wait for the answer.
"""
from __future__ import annotations

import select
import socket
import threading
import time
from typing import Callable


def client_gone(sock: socket.socket) -> bool:
    """True when the peer has closed ``sock`` (or it is broken): readable, and a peek at the next
    byte finds end-of-file. Unread data (a pipelined request) is not a departure."""
    try:
        poll = select.poll()
        poll.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        if not poll.poll(0):
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except (OSError, ValueError):  # reset, or already closed (fileno -1)
        return True


class ClientWatch:
    """``stop()`` turns true, for good, once the client is gone or ``deadline_s`` has passed since
    the watch began; ``reason`` says which ("client_gone" | "deadline")."""

    def __init__(self, sock: socket.socket | None, deadline_s: float, every_s: float = 0.05,
                 left: Callable[[], bool] | None = None):
        self.sock, self.every_s, self.left = sock, every_s, left
        self.started = time.monotonic()
        self.deadline = self.started + deadline_s
        self.reason: str | None = None
        self._next = 0.0

    def stop(self) -> bool:
        if self.reason is None:
            now = time.monotonic()
            if now >= self.deadline:
                self.reason = "deadline"
            elif now >= self._next:  # the socket is asked at most every every_s
                self._next = now + self.every_s
                if (self.left is not None and self.left()) or \
                        (self.sock is not None and client_gone(self.sock)):
                    self.reason = "client_gone"
        return self.reason is not None

    def acquire(self, lock: threading.Lock) -> bool:
        """Take ``lock``, unless the watch stops first (then False, the lock not held)."""
        while not self.stop():
            if lock.acquire(timeout=self.every_s * 4):
                return True
        return False
