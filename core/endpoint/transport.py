"""The endpoint client's HTTP transport: every request bounded by one deadline and one size cap,
and no redirect that would carry the API key to another origin.

The machinery is storage/http_client.py, shared with ``export --format otlp``
(storage/otlp_export.py), which holds the same rules (storage/ never imports core/, so it lives
there): ``Deadline`` bounds the whole request, connect and TLS handshake to the last byte, however
the server paces its bytes; ``read_capped`` refuses a body over the cap (``BodyTooLarge``) as soon
as it, or its ``Content-Length``, passes it; the opener follows a redirect only within the origin
the request was made to and raises ``RedirectRefused`` naming both origins otherwise, so the key
never reaches another host.
"""
from __future__ import annotations

import urllib.request

from storage import http_client
from storage.http_client import (BodyTooLarge, Deadline, RedirectRefused, origin, read_capped,
                                 request)

__all__ = ["BodyTooLarge", "Deadline", "RedirectRefused", "opener", "origin", "read_capped",
           "request"]


def opener() -> urllib.request.OpenerDirector:
    """The shared opener (storage/http_client.py) with redirects followed within the origin."""
    return http_client.opener("same-origin")
