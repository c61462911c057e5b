"""``python -m core.endpoint_server``: a local model behind the OpenAI-compatible chat protocol,
with injectable faults, for trying endpoint policies (core/serve/server.py)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import threading

import torch

from core.serve.server import ChatModel, Limits, serve


def _within(kind, low, high):
    """An argparse type: a ``kind`` number in (low, high]."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            name = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {name}") from None
        if not low < value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside ({low}, {high}]")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.endpoint_server",
                                     description="Serve a local model over the OpenAI "
                                                 "chat-completions protocol.")
    parser.add_argument("--model", default="tiny", help="tiny | smollm2-135m | a local HF dir")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--faults", metavar="FILE.json", help="fault rules (module docstring)")
    parser.add_argument("--api-key-env", metavar="VAR",
                        help="require Authorization: Bearer $VAR on every request")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument("--max-body-mb", type=_within(float, 0, 1024), default=4.0,
                        help="a request body's size at most, MiB (default 4): 413 above")
    parser.add_argument("--max-request-s", type=_within(float, 0, 86400), default=600.0,
                        help="one request's time at most, waiting included (default 600): 503")
    parser.add_argument("--max-connections", type=_within(int, 0, 4096), default=64,
                        help="connections open at once (default 64): past it the longest-idle "
                             "one is closed for the new one, 503 when all are busy")
    args = parser.parse_args(argv)
    limits = Limits(max_body_bytes=int(args.max_body_mb * (1 << 20)),
                    request_s=args.max_request_s, max_connections=args.max_connections)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            parser.error(f"--api-key-env {args.api_key_env}: that variable is not set")
    rules = json.loads(open(args.faults).read()) if args.faults else None
    server = serve(ChatModel(args.model), args.host, args.port, rules, key, limits)
    host, port = server.server_address[:2]
    # Ctrl-C or SIGTERM (a supervisor's stop): requests in flight are answered, then exit 0;
    # a second one stops at once (a queue of long generations could otherwise take many minutes)
    stop = threading.Event()

    def on_signal(*_):
        if stop.is_set():
            server.force_stop()
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    print(f"serving {args.model} at http://{host}:{port}/v1 (Ctrl-C stops)", flush=True)
    try:
        while not stop.wait(1.0):
            pass
        if server.generations.waiting or server.active:
            print("stopping: requests in flight are answered first (Ctrl-C again stops at once)",
                  flush=True)
    finally:
        server.shutdown()
        server.server_close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0
