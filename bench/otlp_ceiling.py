"""What the OTLP bench's clients and this machine allow a receiver at best: the receiver's own
server (storage/asgi_serve.py: uvicorn, its guarded HTTP protocol, a starlette route, the same
limits) answering every POST with the real ``ExportTraceServiceResponse`` and storing nothing.

    python bench/otlp_ceiling.py --port N [--decode]

``--decode`` also decodes each body as the receiver does (storage/otlp/decode.py), so the
difference between the two is the decoding's share and the rest of the gap to the receiver is
the store's. Run by ``bench/otlp.py --ceiling``, which posts the same bodies from the same
client threads to it, to the receiver and to this, side by side.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage.asgi_serve import ServeLimits, read_body, run  # noqa: E402
from storage.otlp.decode import decode, response_body, status_body  # noqa: E402
from storage.otlp.receiver import Limits  # noqa: E402


def app(decoding: bool) -> Starlette:
    lim = Limits()

    async def handle(request: Request) -> Response:
        body = await read_body(request, lim.max_body_bytes, lim.body_deadline_s)
        if decoding:
            decode(body, request.headers.get("content-type") or "", "", "traces",
                   lim.max_inflated_bytes)
        return Response(response_body("traces", 0, "", False),
                        media_type="application/x-protobuf")

    return Starlette(routes=[Route("/v1/traces", handle, methods=["POST"])])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--decode", action="store_true")
    args = p.parse_args()
    lim = Limits()
    run(app(args.decode), ServeLimits(max_connections=lim.max_connections,
                                      header_s=lim.header_timeout_s, idle_s=lim.keep_alive_s),
        port=args.port, bad_request=lambda text: status_body(text, True),
        on_ready=lambda s: print(f"serving at {s.url}", flush=True))


if __name__ == "__main__":
    main()
