"""A threaded HTTP server that serves at most ``max_connections`` connections at once (a thread
each): the next one gets a fixed JSON 503 with ``Retry-After: 1`` and is closed, so a flood of
connections costs a bounded number of threads. Used by core/serve/server.py.
"""
from __future__ import annotations

import json
import sys
import threading
from http.server import ThreadingHTTPServer

_BUSY_BODY = json.dumps({"error": {"message": "too many connections; retry",
                                    "type": "server_error", "param": None, "code": 503}}).encode()
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
         b"Retry-After: 1\r\nConnection: close\r\n"
         + f"Content-Length: {len(_BUSY_BODY)}\r\n\r\n".encode() + _BUSY_BODY)


class BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` at once: the next is answered 503
    (from the accepting thread: the fixed reply fits any socket's send buffer) and closed."""

    def __init__(self, address, handler, max_connections: int):
        self.max_connections, self.active = max_connections, 0
        """The bound, and the connections being served now."""
        self._lock = threading.Lock()
        super().__init__(address, handler)

    def _take(self, delta: int) -> bool:
        with self._lock:
            if delta > 0 and self.active >= self.max_connections:
                return False
            self.active += delta
            return True

    def process_request(self, request, client_address):
        if not self._take(1):
            try:
                request.settimeout(1.0)
                request.sendall(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._take(-1)
            raise

    def handle_error(self, request, client_address):
        # a client that resets its connection is not the server's error: no traceback
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._take(-1)
