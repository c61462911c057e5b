"""A small OpenAI-compatible chat-completions server for a local model, with injectable faults.

    python -m core.endpoint_server --model tiny --port 8000
    python -m core.train --model openai:http://127.0.0.1:8000/v1 --model-name tiny --env bandit

It is what the endpoint policy (core/endpoint/client.py) is tested against, and a way to try
``--model openai:URL`` without a GPU server: ``POST /v1/chat/completions`` renders the messages
with the model's chat template and samples with transformers ``generate``; ``GET /v1/models``
lists the one model. It honours ``max_tokens`` (or ``max_completion_tokens``), ``temperature``,
``top_p``, ``seed``, ``stop`` (cut before the stop string, which is not returned, as OpenAI and
vLLM do) and ``logprobs`` / ``top_logprobs`` (each returned token's logprob under the sampling
distribution, temperature applied). One request generates at a time (a lock); the others wait.

Authentication: with ``--api-key-env VAR`` a request must carry ``Authorization: Bearer``
followed by that variable's value (a key never appears on a command line), else 401, decided
from the headers before a byte of the body is read.

Limits, so that whoever reaches the port cannot knock it over: a body over ``--max-body-mb``
(``Content-Length``) gets 413 unread; a missing, negative or non-integer length 411/400; a bad
field 400 with OpenAI's error object naming it (core/serve/chat_request.py); ``max_tokens`` above the
room the model's context leaves after the prompt 400 (as OpenAI; none given: min(256, room)); a
client that leaves stops its generation (and its wait for the lock) within 0.05-0.2 s
(core/serve/client_watch.py); a request over ``--max-request-s`` gets 503; at most
``--max-connections`` connections are served at once (503 for the next); what the server keeps
per request (``server.faults.seen``) is bounded. Anything unexpected is a JSON 500, never a
dropped connection.

Faults (``--faults FILE.json``, or ``server.faults`` when started in-process with ``serve``): a list
of rules, each ``{"fault": KIND, "when": TEXT, "times": N, ...}``. A request whose messages
contain ``when`` (every request when absent) gets the first rule that still has ``times`` left
(-1 = always). KIND: ``timeout`` (sleep ``delay`` seconds, default 30, then a 503), ``500``,
``503``, ``429`` (with ``Retry-After: retry_after``), ``malformed`` (a 200 whose body is not JSON),
``reply`` (answer ``text`` instead of sampling, cut at ``stop`` like a real answer, its logprobs
scored by the model), ``401``.
"""
from __future__ import annotations

import argparse
import json
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from core.serve.bounded_server import BoundedServer
from core.serve.chat_model import ChatModel, token_bytes  # noqa: F401 (this module's names, kept)
from core.serve.chat_request import (MAX_TOKENS, ChatRequest, RequestError,  # noqa: F401 (MAX_TOKENS)
                               completion_budget, content_length, parse_chat_request)
from core.serve.client_watch import ClientWatch
from core.serve.fault_plan import FaultPlan


@dataclass(frozen=True)
class Limits:
    """How much one client may ask of the server (see the module docstring)."""
    max_body_bytes: int = 4 << 20
    """A request body's size at most: 4 MiB is ~1M tokens of text, past any context served here."""
    request_s: float = 600.0
    """One chat request's time at most, waiting for the generation lock included."""
    max_connections: int = 64
    """Connections served at once (one thread each); the next ones get 503."""
    idle_s: float = 60.0
    """A connection's silence at most while the server waits for its request's headers."""
    body_s: float = 30.0
    """Receiving one body at most (a deadline for the whole body, not per read)."""


DRAIN_BYTES, DRAIN_S = 1 << 20, 1.0
"""After refusing a request unread, what is still read and dropped (at most) before closing:
closing with unread bytes resets the connection, which can destroy the refusal before the client
reads it."""


class ChatHandler(BaseHTTPRequestHandler):
    """One connection's requests; ``make_handler`` binds the model, faults, key and limits."""
    protocol_version = "HTTP/1.1"
    model: ChatModel
    faults: FaultPlan
    api_key: str | None = None
    limits: Limits = Limits()
    entered = answered = False
    """A chat request of this connection is counted in flight (set by do_POST); a reply went out."""

    def log_message(self, fmt, *args):  # quiet: tests and demos read their own output
        pass

    def setup(self):
        self.timeout = self.limits.idle_s  # StreamRequestHandler.setup applies it to the socket
        super().setup()

    # -- replies ---------------------------------------------------------------------------
    def _leave(self) -> None:
        """The request stops counting as in flight, once."""
        if self.entered:
            self.entered = False
            self.faults.enter(-1)

    def _send(self, status: int, body: bytes, headers: dict | None = None,
              close: bool = False) -> None:
        # before the first byte goes out: a client that has its answer may send its next
        # request at once, and counted until after the write it would read as one too many
        self._leave()
        self.answered = True
        self.send_response(status)
        headers = dict(headers or {})
        self.send_header("Content-Type", headers.pop("Content-Type", "application/json"))
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:  # the client gave up (its timeout), or stopped reading
            self.close_connection = True

    def _error(self, status: int, message: str, headers: dict | None = None,
               close: bool = False) -> None:
        body = {"error": {"message": message, "type": "server_error" if status >= 500 else
                          "invalid_request_error", "param": None, "code": status}}
        self._send(status, json.dumps(body).encode(), headers, close)

    def _invalid(self, err: RequestError, close: bool = False) -> None:
        self._send(err.status, json.dumps(err.body()).encode(), close=close)

    def _refuse_unread(self, status: int, message: str = "",
                       err: RequestError | None = None) -> None:
        """Answer without reading the body, then close: what the client still sends is read
        and dropped (DRAIN_BYTES, DRAIN_S at most) so that the close does not reset the
        connection under the answer."""
        if err is not None:
            self._invalid(err, close=True)
        else:
            self._error(status, message, close=True)
        try:
            self.connection.shutdown(socket.SHUT_WR)
            left, end = DRAIN_BYTES, time.monotonic() + DRAIN_S
            while left > 0 and (rest := end - time.monotonic()) > 0:
                self.connection.settimeout(rest)
                chunk = self.rfile.read1(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    # -- requests --------------------------------------------------------------------------
    def _keyed(self) -> bool:
        return not self.api_key or self.headers.get("Authorization") == f"Bearer {self.api_key}"

    def do_GET(self):
        if not self._keyed():
            self._refuse_unread(401, "invalid API key")
        elif self.path.rstrip("/").endswith("/models"):
            self._send(200, json.dumps({"object": "list", "data": [
                {"id": self.model.name, "object": "model", "owned_by": "local"}]}).encode())
        else:
            self._refuse_unread(404, f"no route {self.path}")

    def do_POST(self):
        self.faults.enter(1)
        self.entered = True
        try:
            self._post()
        except Exception as exc:  # noqa: BLE001 -- a JSON 500 rather than a dropped connection
            if not self.answered:
                self._error(500, f"internal error: {type(exc).__name__}: {str(exc)[:200]}",
                            close=True)
        finally:
            self._leave()

    def handle_expect_100(self):
        # a client that asks before sending its body (curl does over 1 MB) hears the refusal
        # then, instead of "100 Continue"
        if self.command == "POST" and self._gate() is None:
            return False
        return super().handle_expect_100()

    def _gate(self) -> int | None:
        """The body's length when this POST may send it; None once it is refused, unread: the
        key, the route and the length are all in the headers."""
        if not self._keyed():
            self.faults.record({"fault": None, "authorized": False, "seed": None,
                                "messages": None, "bytes": 0})
            return self._refuse_unread(401, "invalid API key")
        if not self.path.rstrip("/").endswith("/chat/completions"):
            return self._refuse_unread(404, f"no route {self.path}")
        length = content_length(self.headers.get_all("Content-Length") or [],
                                self.headers.get("Transfer-Encoding"),
                                self.limits.max_body_bytes)
        if isinstance(length, RequestError):
            return self._refuse_unread(length.status, err=length)
        return length

    def _post(self):
        self.answered = False
        length = self._gate()
        if length is None:
            return
        raw = self._read_body(length)
        if raw is None:
            return
        req = parse_chat_request(raw, context=self.model.context)
        rule = self.faults.take(raw.decode("utf-8", "replace"))
        ok = isinstance(req, ChatRequest)
        self.faults.record({"fault": rule.get("fault") if rule else None, "authorized": True,
                            "seed": req.seed if ok else None,
                            "messages": req.messages if ok else None, "bytes": len(raw)})
        del raw
        if rule and rule["fault"] == "401":
            return self._error(401, "invalid API key")
        if not ok:
            return self._invalid(req)
        if rule and self._fault(rule):
            return
        self._complete(req, rule.get("text") if rule and rule["fault"] == "reply" else None)

    def _read_body(self, length: int) -> bytearray | None:
        """The body's ``length`` bytes, received within ``limits.body_s`` in all (else 408);
        None when it did not come (the reply, if any, is sent)."""
        raw, end = bytearray(), time.monotonic() + self.limits.body_s
        try:
            while len(raw) < length:
                rest = end - time.monotonic()
                if rest <= 0:
                    raise TimeoutError
                self.connection.settimeout(rest)
                chunk = self.rfile.read1(min(length - len(raw), 1 << 16))
                if not chunk:  # the client left mid-body: nobody to answer
                    self.close_connection = True
                    return None
                raw += chunk
        except TimeoutError:
            self._error(408, f"the body's {length} bytes did not arrive within "
                        f"{self.limits.body_s:g} s", close=True)
            return None
        self.connection.settimeout(self.limits.idle_s)
        return raw

    def _fault(self, rule: dict) -> bool:
        """Answer an injected fault; False when the rule lets the model answer."""
        kind = rule["fault"]
        if kind == "timeout":  # the client has given up by now: answer without generating
            time.sleep(float(rule.get("delay", 30)))
            self._error(503, "answered too late")
        elif kind in ("500", "503"):
            self._error(int(kind), "injected server error")
        elif kind == "429":
            self._error(429, "rate limited", {"Retry-After": str(rule.get("retry_after", 1))})
        elif kind == "malformed":
            self._send(200, b'{"id": "chatcmpl-broken", "choices": [{"mess')
        else:
            return False
        return True

    def _complete(self, req: ChatRequest, reply: str | None) -> None:
        watch = ClientWatch(self.connection, self.limits.request_s)
        ids = self.model.prompt_ids(req.messages)
        budget = completion_budget(req.max_tokens, len(ids), self.model.context)
        if isinstance(budget, RequestError):
            return self._invalid(budget)
        out = self.model.complete(
            ids, max_tokens=budget, temperature=req.temperature, top_p=req.top_p, seed=req.seed,
            stop=list(req.stop), top_k=req.top_logprobs if req.logprobs else 0, reply=reply,
            watch=watch)
        if watch.reason is not None:  # cut short: no answer, or 503 for the deadline
            self.faults.cut_short({"reason": watch.reason, "max_tokens": budget,
                                   "completion_tokens": out["usage"]["completion_tokens"]
                                   if out else 0})
            if watch.reason == "client_gone":
                self.close_connection = True
                return None
            return self._error(503, f"the request took over {self.limits.request_s:g} s "
                               "(--max-request-s)", {"Retry-After": "1"})
        body = completion_body(req, out, self.model.name)
        if req.stream:
            return self._send(200, stream_body(body), {"Content-Type": "text/event-stream"})
        self._send(200, json.dumps(body).encode())


def stream_body(body: dict) -> bytes:
    """``body`` (a chat.completion) as the server-sent events a streaming client reads: the
    whole reply in one ``chat.completion.chunk`` (the reply is made before anything is sent),
    its finish reason in the next, the usage in a last one with no choices (what
    ``stream_options.include_usage`` asks for; clients that did not ask ignore it), then
    ``[DONE]``. For clients and agent harnesses that only ever stream (verifiers')."""
    head = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    choice = body["choices"][0]
    chunks = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                          "content": choice["message"]["content"]},
                                    "logprobs": choice["logprobs"], "finish_reason": None}]},
              {**head, "choices": [{"index": 0, "delta": {},
                                    "finish_reason": choice["finish_reason"]}]},
              {**head, "choices": [], "usage": body["usage"]}]
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"


def completion_body(req: ChatRequest, out: dict, model_name: str) -> dict:
    """The chat.completion object for ``ChatModel.complete``'s ``out``."""
    logprobs = None
    if req.logprobs:
        logprobs = {"content": [
            {"token": t, "logprob": lp, "bytes": list(b),
             "top_logprobs": [{"token": a, "logprob": v, "bytes": list(a.encode())}
                              for a, v in alts]}
            for t, b, lp, alts in out["tokens"]]}
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion",
            "created": int(time.time()), "model": req.model or model_name,
            "choices": [{"index": 0, "finish_reason": out["finish_reason"],
                         "message": {"role": "assistant", "content": out["text"]},
                         "logprobs": logprobs}],
            "usage": out["usage"]}


def make_handler(model: ChatModel, faults: FaultPlan, api_key: str | None,
                 limits: Limits = Limits()) -> type[ChatHandler]:
    return type("Handler", (ChatHandler,), {"model": model, "faults": faults,
                                             "api_key": api_key, "limits": limits})


def serve(model: ChatModel, host: str = "127.0.0.1", port: int = 0,
          faults: list[dict] | None = None, api_key: str | None = None,
          limits: Limits = Limits()) -> ThreadingHTTPServer:
    """Start serving in a daemon thread; ``server.server_address`` has the port, ``server.faults``
    the fault plan (``server.faults.rules`` may be replaced between requests). Stop with
    ``server.shutdown(); server.server_close()`` (the second waits for requests in flight)."""
    plan = FaultPlan(faults)
    server = BoundedServer((host, port), make_handler(model, plan, api_key, limits),
                           limits.max_connections)
    # server_close() waits for the requests in flight: none is cut off in the middle of torch
    server.daemon_threads, server.block_on_close = False, True
    server.faults = plan
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
