"""Does a flood of idle TCP connections lock real clients out of ``agentrl endpoint``?

    python bench/endpoint_idle_lockout.py [--idle 64] [--wait 15]

Starts the endpoint server in-process (the tiny model, default limits: 64 connections), opens
``--idle`` TCP connections that send nothing, then asks ``GET /v1/models`` and
``POST /v1/chat/completions`` (2 tokens) as a real client would, each with a ``--wait`` second
deadline, and prints what each got and how long it took.
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

# bench/storage.py would shadow the storage package: the repository root comes first
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from core.serve.server import ChatModel, serve  # noqa: E402


def ask(port: int, request: bytes, wait: float) -> str:
    t0 = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
            s.sendall(request)
            head = s.recv(65536).split(b"\r\n", 1)[0].decode()
        return f"{head or 'closed, no reply'} after {time.perf_counter() - t0:.3f} s"
    except OSError as exc:
        return f"no answer: {type(exc).__name__} after {time.perf_counter() - t0:.3f} s"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=int, default=64)
    ap.add_argument("--wait", type=float, default=15.0)
    args = ap.parse_args()
    srv = serve(ChatModel("tiny"))
    port = srv.server_address[1]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(args.idle)]
    time.sleep(0.5)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    print(f"{args.idle} idle connections held open")
    print("GET /v1/models:", ask(port, b"GET /v1/models HTTP/1.1\r\nHost: b\r\n\r\n", args.wait))
    print("POST chat:", ask(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: b\r\n"
                            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body, args.wait))
    for s in idle:
        s.close()
    srv.shutdown()
    srv.server_close()


if __name__ == "__main__":
    main()
