"""storage/http_client.py's deadline covers the connect whatever the host resolves to: a name with
two addresses that both never answer the handshake (an AAAA record whose route is black-holed
beside an A record, a load balancer's dead nodes) is given up at the deadline, not after the
whole limit once per address.
"""
from __future__ import annotations

import socket
import time

import pytest

from storage import http_client

LIMIT_S = 1.0


def _unanswering_listener(host: str) -> tuple[socket.socket, list[socket.socket]]:
    """A listening socket whose accept queue is full: a further connect's handshake goes
    unanswered (its SYN dropped), as a black-holed address's does."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind((host, 0))
    server.listen(0)
    held = []
    for _ in range(4):  # fill the queue (Linux keeps backlog + 1)
        c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        c.setblocking(False)
        try:
            c.connect(server.getsockname())
        except BlockingIOError:
            pass
        held.append(c)
    time.sleep(0.2)
    return server, held


def test_a_name_with_two_unanswering_addresses_is_given_up_at_the_deadline(monkeypatch):
    server, held = _unanswering_listener("127.0.0.1")
    port = server.getsockname()[1]
    probe = socket.socket()
    probe.settimeout(0.3)
    try:  # the queue is full only where SYNs past it are dropped (Linux's default)
        probe.connect(("127.0.0.1", port))
        pytest.skip("this system answers a connect past a full accept queue")
    except (TimeoutError, OSError):
        pass
    finally:
        probe.close()
    answers = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))] * 2
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: answers)  # the resolver's answer
    opener = http_client.opener("none")
    started = time.monotonic()
    try:
        with pytest.raises((TimeoutError, OSError)):
            req = http_client.request(f"http://two-addresses.test:{port}/",
                                      http_client.Deadline(LIMIT_S))
            opener.open(req, timeout=LIMIT_S)
    finally:
        took = time.monotonic() - started
        server.close()
        for c in held:
            c.close()
    # socket.create_connection gave each address the whole time left: 2 x the limit
    assert took < LIMIT_S + 0.6, took
