"""A small OpenAI-compatible chat-completions server for a local model, with injectable faults.

    python -m core.endpoint_server --model tiny --port 8000
    python -m core.train --model openai:http://127.0.0.1:8000/v1 --model-name tiny --env bandit

It is what the endpoint policy (core/endpoint/client.py) is tested against, and a way to try
``--model openai:URL`` without a GPU server: ``POST /v1/chat/completions`` renders the messages
with the model's chat template and samples with transformers ``generate``; ``GET /v1/models``
lists the one model. It honours ``max_tokens`` (or ``max_completion_tokens``), ``temperature``,
``top_p``, ``seed``, ``stop`` (cut before the stop string, which is not returned, as OpenAI and
vLLM do) and ``logprobs`` / ``top_logprobs`` (each returned token's logprob under the sampling
distribution, temperature applied). One request generates at a time, on one worker thread fed
by a bounded queue (core/serve/generations.py): the others wait there, and the server's event loop
keeps answering (``/v1/models``, refusals) while torch works; a full queue is a 503.

The server is a starlette app on uvicorn (storage/asgi_serve.py): a request's headers must be
complete within ``header_s`` of the connection (a client dripping them is cut off), a kept-alive
connection idle ``idle_s`` is closed, and at ``--max-connections`` open the longest-idle connection
is closed for a new one, so idle sockets never lock clients out; a request h11 cannot parse
(``Content-Length: ²``) gets a JSON 400.

Authentication: with ``--api-key-env VAR`` a request must carry ``Authorization: Bearer``
followed by that variable's value (a key never appears on a command line), else 401, decided
from the headers before a byte of the body is read.

Limits, so that whoever reaches the port cannot knock it over: a body over ``--max-body-mb``
(``Content-Length``) gets 413 unread; a missing, negative or non-integer length 411/400; a bad
field 400 with OpenAI's error object naming it (core/serve/chat_request.py); ``max_tokens``
above the room the model's context leaves after the prompt 400 (as OpenAI; none given:
min(256, room)); a client that leaves stops its generation (and its wait for the model) within
0.05-0.2 s (core/serve/client_watch.py); a request over ``--max-request-s`` gets 503; at most
``--max-connections`` connections are open at once (an idle one is closed for a new one; 503
when all are busy); what the server keeps per request (``server.faults.seen``) is bounded.
Anything unexpected is a JSON 500, never a dropped connection.

Faults (``--faults FILE.json``, or ``server.faults`` when started in-process with ``serve``): a list
of rules, each ``{"fault": KIND, "when": TEXT, "times": N, ...}``. A request whose messages
contain ``when`` (every request when absent) gets the first rule that still has ``times`` left
(-1 = always). KIND: ``timeout`` (sleep ``delay`` seconds, default 30, then a 503), ``500``,
``503``, ``429`` (with ``Retry-After: retry_after``), ``malformed`` (a 200 whose body is not JSON),
``reply`` (answer ``text`` instead of sampling, cut at ``stop`` like a real answer, its logprobs
scored by the model), ``401``.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from core.serve.chat_model import ChatModel, token_bytes  # noqa: F401 (this module's names, kept)
from core.serve.chat_request import MAX_TOKENS  # noqa: F401 (this module's name, kept)
from core.serve.chat_request import (ChatRequest, RequestError, completion_budget,
                                     content_length, parse_chat_request)
from core.serve.client_watch import ClientWatch
from core.serve.fault_plan import FaultPlan
from core.serve.generations import Busy, Generations
from storage.asgi_serve import BodyRefused, ServeLimits, Served, read_body
from storage.asgi_serve import serve as serve_app


@dataclass(frozen=True)
class Limits:
    """How much one client may ask of the server (see the module docstring)."""
    max_body_bytes: int = 4 << 20
    """A request body's size at most: 4 MiB is ~1M tokens of text, past any context served here."""
    request_s: float = 600.0
    """One chat request's time at most, waiting for the model included."""
    max_connections: int = 64
    """Connections open at once; past it the longest-idle one is closed, else the next gets 503."""
    idle_s: float = 60.0
    """A kept-alive connection's silence at most between requests."""
    body_s: float = 30.0
    """Receiving one body at most (a deadline for the whole body, not per read)."""
    header_s: float = 10.0
    """A request's line and headers complete within this (a client dripping them is cut off)."""
    max_waiting: int = 64
    """Chat requests waiting for the model at most; the next gets 503 with Retry-After."""


def _error_body(status: int, message: str, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": "server_error" if status >= 500
                                 else "invalid_request_error", "param": param,
                                 "code": status}}).encode()


def _bad_request(text: str) -> bytes:
    """The JSON 400 for a request h11 refused before the app saw it, naming the header."""
    param = next((h for h in ("Content-Length", "Transfer-Encoding") if h in text), None)
    return _error_body(400, text, param)


class ChatApp:
    """The routes: ``GET …/models``, ``POST …/chat/completions``; every answer JSON (or SSE)."""

    def __init__(self, model: ChatModel, faults: FaultPlan, api_key: str | None,
                 limits: Limits, generations: Generations):
        self.model, self.faults, self.api_key, self.limits = model, faults, api_key, limits
        self.generations = generations
        self.app = Starlette(routes=[Route("/{path:path}", self.handle, methods=["GET", "POST"])],
                             exception_handlers={HTTPException: self._refused})

    async def _refused(self, request: Request, exc: HTTPException) -> Response:
        """starlette's own refusals (another method: 405; a request target that is not a
        path, ``GET http://host/...``: 404) as OpenAI's JSON error, not plain text."""
        return self._send(exc.status_code, _error_body(exc.status_code, f"{request.method} "
                          f"{request.url.path}: {exc.detail}"), dict(exc.headers or {}),
                          close=True)

    # -- replies ---------------------------------------------------------------------------
    @staticmethod
    def _send(status: int, body: bytes, headers: dict | None = None,
              close: bool = False) -> Response:
        headers = dict(headers or {})
        media = headers.pop("Content-Type", "application/json")
        if close:  # uvicorn closes after it; a body still coming is drained first
            headers["Connection"] = "close"
        return Response(body, status, headers, media_type=media)

    def _error(self, status: int, message: str, headers: dict | None = None,
               close: bool = False) -> Response:
        return self._send(status, _error_body(status, message), headers, close)

    def _invalid(self, err: RequestError, close: bool = False) -> Response:
        return self._send(err.status, json.dumps(err.body()).encode(), close=close)

    # -- requests --------------------------------------------------------------------------
    def _keyed(self, request: Request) -> bool:
        return not self.api_key or \
            request.headers.get("authorization") == f"Bearer {self.api_key}"

    async def handle(self, request: Request) -> Response:
        path = request.url.path
        if request.method == "GET":
            if not self._keyed(request):
                return self._error(401, "invalid API key", close=True)
            if path.rstrip("/").endswith("/models"):
                return self._send(200, json.dumps({"object": "list", "data": [
                    {"id": self.model.name, "object": "model", "owned_by": "local"}]}).encode())
            return self._error(404, f"no route {path}", close=True)
        # counted until the reply is returned: a client that has its answer may send its next
        # request at once, and counted until after the write it would read as one too many
        self.faults.enter(1)
        try:
            return await self._post(request)
        except ClientDisconnect:  # the client left mid-body: nobody to answer
            return self._send(400, b"", close=True)
        except asyncio.CancelledError:  # stopping past the grace, or at a second signal
            # answered rather than re-raised: uvicorn would log a traceback and send plain text;
            # the generation stops between tokens (_complete's finally), and the task ends here
            return self._error(503, "the server is stopping; retry", {"Retry-After": "1"},
                               close=True)
        except Exception as exc:  # noqa: BLE001 -- a JSON 500 rather than a dropped connection
            return self._error(500, f"internal error: {type(exc).__name__}: {str(exc)[:200]}",
                               close=True)
        finally:
            self.faults.enter(-1)

    def _gate(self, request: Request) -> Response | None:
        """A refusal decided from the headers alone (the key, the route, the length), sent with
        the body unread; None when the body may be read."""
        if not self._keyed(request):
            self.faults.record({"fault": None, "authorized": False, "seed": None,
                                "messages": None, "bytes": 0})
            return self._error(401, "invalid API key", close=True)
        if not request.url.path.rstrip("/").endswith("/chat/completions"):
            return self._error(404, f"no route {request.url.path}", close=True)
        length = content_length(request.headers.getlist("content-length"),
                                request.headers.get("transfer-encoding"),
                                self.limits.max_body_bytes)
        if isinstance(length, RequestError):
            return self._invalid(length, close=True)
        coding = request.headers.get("content-encoding", "identity").strip().lower()
        if coding not in ("", "identity"):  # never inflated here: no bomb, and no wrong "not UTF-8"
            return self._invalid(RequestError(415, "Content-Encoding", f"{coding!r} bodies are "
                                              "not supported; send the JSON uncompressed"),
                                 close=True)
        return None

    async def _post(self, request: Request) -> Response:
        if (refused := self._gate(request)) is not None:
            return refused
        try:
            raw = await read_body(request, self.limits.max_body_bytes, self.limits.body_s)
        except BodyRefused as exc:
            if exc.status == 408:
                return self._error(408, f"the body's {request.headers.get('content-length')} "
                                   f"bytes did not arrive within {self.limits.body_s:g} s",
                                   close=True)
            return self._error(exc.status, str(exc), close=True)
        # a 4 MiB body parses in tens of ms: off the loop, so other clients are not held
        req = await asyncio.to_thread(parse_chat_request, raw, context=self.model.context)
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
        chars = sum(len(m["role"]) + len(m["content"]) for m in req.messages)
        if chars > self.model.max_prompt_chars:
            return self._invalid(RequestError(
                400, "messages", f"{chars} characters cannot fit the model's context of "
                f"{self.model.context} tokens (at most {self.model.max_prompt_chars} characters)",
                "context_length_exceeded"))
        if rule and (faulted := await self._fault(rule)) is not None:
            return faulted
        return await self._complete(request, req,
                                    rule.get("text") if rule and rule["fault"] == "reply" else None)

    async def _fault(self, rule: dict) -> Response | None:
        """The reply for an injected fault; None when the rule lets the model answer."""
        kind = rule["fault"]
        if kind == "timeout":  # the client has given up by now: answer without generating
            await asyncio.sleep(float(rule.get("delay", 30)))
            return self._error(503, "answered too late")
        if kind in ("500", "503"):
            return self._error(int(kind), "injected server error")
        if kind == "429":
            return self._error(429, "rate limited",
                               {"Retry-After": str(rule.get("retry_after", 1))})
        if kind == "malformed":
            return self._send(200, b'{"id": "chatcmpl-broken", "choices": [{"mess')
        return None

    def _generate(self, req: ChatRequest, reply: str | None, watch: ClientWatch):
        """On the worker thread: the prompt's budget, then the model's answer."""
        ids = self.model.prompt_ids(req.messages)
        budget = completion_budget(req.max_tokens, len(ids), self.model.context)
        if isinstance(budget, RequestError):
            return budget, None
        return budget, self.model.complete(
            ids, max_tokens=budget, temperature=req.temperature, top_p=req.top_p, seed=req.seed,
            stop=list(req.stop), top_k=req.top_logprobs if req.logprobs else 0, reply=reply,
            watch=watch)

    async def _complete(self, request: Request, req: ChatRequest,
                        reply: str | None) -> Response:
        left = threading.Event()
        watch = ClientWatch(None, self.limits.request_s, left=left.is_set)
        try:
            job = self.generations.submit(lambda: self._generate(req, reply, watch))
        except Busy as exc:
            return self._error(503, f"busy: {exc}; retry", {"Retry-After": "1"})
        result = asyncio.wrap_future(job)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
            if gone.done():
                left.set()  # the worker stops between tokens, or skips the job if not begun
            budget, out = await result
        finally:
            left.set()  # also when this handler is cancelled (shutdown past its grace)
            gone.cancel()
        if isinstance(budget, RequestError):
            return self._invalid(budget)
        if watch.reason is not None:  # cut short: no answer, or 503 for the deadline
            self.faults.cut_short({"reason": watch.reason, "max_tokens": budget,
                                   "completion_tokens": out["usage"]["completion_tokens"]
                                   if out else 0})
            if watch.reason == "client_gone":
                return self._send(499, b"", close=True)  # nobody reads it
            return self._error(503, f"the request took over {self.limits.request_s:g} s "
                               "(--max-request-s)", {"Retry-After": "1"})
        body = completion_body(req, out, self.model.name)
        if req.stream:
            return self._send(200, stream_body(body), {"Content-Type": "text/event-stream"})
        return self._send(200, json.dumps(body).encode())


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (its body already read: the next message is the
    disconnect; a half-close counts, as in client_watch)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


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


class EndpointServer:
    """A running server: ``server_address`` (host, port), ``faults`` (the plan; ``rules`` may be
    replaced between requests), ``active`` (connections open), ``shutdown()`` then
    ``server_close()``."""

    def __init__(self, served: Served, faults: FaultPlan, generations: Generations):
        self.served, self.faults, self.generations = served, faults, generations
        self.server_address = (served.host, served.port)

    @property
    def active(self) -> int:
        return self.served.active

    def shutdown(self) -> None:
        """Stop accepting; requests in flight are answered first (at most ``request_s``)."""
        self.served.stop()

    def force_stop(self) -> None:
        """While ``shutdown`` waits (from another thread or a signal handler): stop waiting;
        requests in flight are cancelled, their generations stop between tokens."""
        self.served.server.should_exit = self.served.server.force_exit = True

    def server_close(self) -> None:
        """Wait for the model's queued work to end (none is cut off in the middle of torch)."""
        self.served.stop()
        self.generations.close()


def serve(model: ChatModel, host: str = "127.0.0.1", port: int = 0,
          faults: list[dict] | None = None, api_key: str | None = None,
          limits: Limits = Limits()) -> EndpointServer:
    """Start serving in a daemon thread; ``server.server_address`` has the port, ``server.faults``
    the fault plan. Stop with ``server.shutdown(); server.server_close()``."""
    plan = FaultPlan(faults)
    generations = Generations(limits.max_waiting)
    app = ChatApp(model, plan, api_key, limits, generations).app
    served = serve_app(app, ServeLimits(max_connections=limits.max_connections,
                                        header_s=limits.header_s, idle_s=limits.idle_s,
                                        shutdown_s=limits.request_s + limits.body_s),
                       host, port, bad_request=_bad_request)
    return EndpointServer(served, plan, generations)
