"""An OpenAI-compatible chat-completions client: the endpoint policy's one way to the server.

``--model openai:URL --model-name NAME`` makes a server (vLLM, SGLang, llama.cpp server, Ollama,
a hosted API, or core/serve/server.py) the policy; core/run/collection.py runs the episodes. Only
the standard library speaks HTTP here (``urllib``).

One request per turn: ``POST {URL}/chat/completions`` with the conversation so far, the env's
stop tags as ``stop``, ``max_tokens``, ``temperature``, ``top_p``, ``seed`` and, unless turned off,
``logprobs: true`` (and ``top_logprobs: k``). The key is read from ``AGENTRL_OPENAI_API_KEY``
(else ``OPENAI_API_KEY``) and sent as ``Authorization: Bearer``; it is never part of the config,
and every error text is scrubbed of it before anything keeps it.

Every request is bounded (core/endpoint/transport.py): ``timeout`` is its deadline, connect to
last byte, however slowly the server sends (each retry has its own); its body may be at most ``body_cap(max_tokens,
top_logprobs)`` bytes (1 MiB + 2 KiB per token and 1 KiB per token per alternative); a redirect
to another scheme, host or port is refused, so the key never reaches another origin. Each field
of the reply is checked and the completion held to ``max_tokens`` (core/endpoint/reply.py): cut
there, it reads as finish reason ``length`` and ``Reply.cut_chars`` / ``cut_tokens`` say how
much was left out.

Failures, per request:
* the deadline passed, connection lost, HTTP 5xx, HTTP 429, a 200 whose body is not a chat
  completion or has a field out of range (``malformed``, the field named): retried up to
  ``retries`` times, waiting ``backoff * 2**(attempt-1)`` seconds (x a jitter in [0.5, 1], at
  most ``BACKOFF_CAP_S``) or, for a 429 with ``Retry-After``, that long (at most
  ``RETRY_AFTER_CAP_S``). Still failing: ``EndpointError``, which ends that trajectory only.
* a body over the cap (``too_large``: the server ignores ``max_tokens``, it would again) or any
  other 4xx (e.g. the context is longer than the server takes): ``EndpointError`` at once.
* 401, 403, 404 (bad key, no such model or URL) and a redirect to another origin:
  ``EndpointRefused``; every request would fail alike, so the run stops with that message.
Before a run starts, ``check`` asks ``GET {URL}/models``: a server that cannot be reached at all
(after the same retries), that refuses the key or redirects elsewhere is said at once, and no run
is recorded.

The stop tag: OpenAI's ``stop`` leaves the matched string out of the returned text and does not
say which one matched (vLLM does, as ``stop_reason``). ``restore_stop`` appends it again: the
``stop_reason`` when given, else the stop tag whose opening tag is still open, so the action the
env receives and the store keeps ends with its closing tag, as our own rollouts' do.
"""
from __future__ import annotations

import http.client
import json
import os
import random
import re
import socket
import time
import urllib.error
from email.utils import parsedate_to_datetime
from typing import Callable, Sequence

from core.endpoint import transport
from core.endpoint.reply import BadField, Reply, body_cap, parse
from core.endpoint.transport import BodyTooLarge, Deadline, RedirectRefused

PREFIX = "openai:"
KEY_VARS = ("AGENTRL_OPENAI_API_KEY", "OPENAI_API_KEY")
"""Where the API key is read from, first set wins. Local servers need none."""
BACKOFF_CAP_S = 30.0
RETRY_AFTER_CAP_S = 60.0
"""A server asking for a longer pause than this is waited for this long, then tried again."""
_DETAIL_CHARS = 500


class EndpointError(RuntimeError):
    """A request that failed for good: ``kind`` is timeout | connection | server_error |
    rate_limited | malformed | too_large | bad_request | refused | redirect; ``status`` the HTTP
    status if any."""

    def __init__(self, kind: str, detail: str, attempts: int = 1, status: int | None = None):
        super().__init__(f"{kind}" + (f" (HTTP {status})" if status else "")
                         + f" after {attempts} attempt{'s' * (attempts != 1)}: {detail}")
        self.kind, self.detail, self.attempts, self.status = kind, detail, attempts, status

    def as_info(self) -> dict:
        return {"kind": self.kind, "status": self.status, "attempts": self.attempts,
                "detail": self.detail}


class EndpointRefused(EndpointError):
    """401 / 403 / 404 (a wrong key, model name or URL) or a redirect to another origin (kind
    ``redirect``, the status its 3xx). The run stops."""


class _Retry(Exception):
    def __init__(self, kind: str, detail: str, status: int | None = None,
                 retry_after: float | None = None):
        super().__init__(detail)
        self.kind, self.detail, self.status, self.retry_after = kind, detail, status, retry_after


def api_key() -> str | None:
    """The key from the environment (``KEY_VARS``), or None."""
    for name in KEY_VARS:
        if os.environ.get(name):
            return os.environ[name]
    return None


def chat_url(base: str) -> str:
    """``http://host:port/v1`` -> ``http://host:port/v1/chat/completions`` (kept if given whole)."""
    base = base.rstrip("/")
    return base if base.endswith("/chat/completions") else base + "/chat/completions"


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(when - (time.time() if now is None else now), 0.0)


def backoff_s(attempt: int, base: float, retry_after: float | None = None,
              cap: float = BACKOFF_CAP_S, retry_after_cap: float = RETRY_AFTER_CAP_S,
              jitter: float = 1.0) -> float:
    """Wait before retry number ``attempt`` (1, 2, ...):

        min(Retry-After, retry_after_cap)               when the server sent one
        min(base * 2 ** (attempt - 1), cap) * jitter    otherwise (jitter in [0.5, 1])
    """
    if retry_after is not None:
        return min(retry_after, retry_after_cap)
    return min(base * 2 ** (attempt - 1), cap) * jitter


def restore_stop(text: str, finish_reason: str, stop_tags: Sequence[str],
                 stop_reason: str | None = None) -> str:
    """The action as the model produced it: ``text`` plus the stop tag the server cut off.

    Only when the server stopped (``finish_reason`` stop) and the text does not already end with
    a tag: the server's ``stop_reason`` if it is one of ``stop_tags``, else the tag ``</x>`` whose
    ``<x`` was opened last and not closed since. An end of sequence (no tag open) adds nothing."""
    if finish_reason != "stop" or any(text.endswith(t) for t in stop_tags):
        return text
    if stop_reason in stop_tags:
        return text + stop_reason
    best, where = None, -1
    for tag in stop_tags:
        if not tag.startswith("</"):
            continue
        opened = text.rfind("<" + tag[2:].rstrip(">"))
        if opened > where and text.rfind(tag) < opened:
            best, where = tag, opened
    return text + best if best else text


def pieces(text: str) -> list[str]:
    """Whitespace-led pieces (``" word"``) whose concatenation is ``text``: how text that is not
    the server's tokens is stored (the import format's rule, storage/interchange.py)."""
    return re.findall(r"\s*\S+|\s+", text)


def action_pieces(action: str, tokens: Sequence[tuple[str, float]] | None,
                  ) -> list[tuple[str, float | None]]:
    """(text, logprob) rows of the action: the server's own tokens while they spell the action,
    then the rest (a restored stop tag, text the logprobs did not cover) as pieces without one."""
    out: list[tuple[str, float | None]] = []
    pos = 0
    for text, logprob in tokens or ():
        if not action.startswith(text, pos):
            break
        out.append((text, logprob))
        pos += len(text)
    out.extend((p, None) for p in pieces(action[pos:]))
    return out


class ChatClient:
    """Chat completions against one server and model, with bounded retries (module docstring)."""

    def __init__(self, url: str, model: str, key: str | None = None, *, timeout: float = 120.0,
                 retries: int = 3, backoff: float = 1.0, logprobs: bool = True,
                 top_logprobs: int = 0, retry_after_cap: float = RETRY_AFTER_CAP_S,
                 sleep: Callable[[float], None] = time.sleep):
        self.url, self.model, self._key = chat_url(url), model, key
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.logprobs, self.top_logprobs = logprobs, top_logprobs
        self.retry_after_cap, self.sleep = retry_after_cap, sleep
        self._opener = transport.opener()

    def body(self, messages: list[dict], *, stop: Sequence[str], max_tokens: int,
             temperature: float, top_p: float, seed: int | None) -> dict:
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                "temperature": temperature, "top_p": top_p}
        if stop:
            body["stop"] = list(stop)[:4]  # OpenAI takes at most 4
        if seed is not None:
            body["seed"] = seed
        if self.logprobs:
            body["logprobs"] = True
            if self.top_logprobs:
                body["top_logprobs"] = self.top_logprobs
        return body

    def complete(self, messages: list[dict], **kwargs) -> Reply:
        """One chat completion (``body``'s keyword arguments); EndpointError when it fails for
        good, EndpointRefused for 401/403/404 and a redirect to another origin."""
        data = json.dumps(self.body(messages, **kwargs)).encode()
        max_tokens = kwargs["max_tokens"]
        cap = body_cap(max_tokens, self.top_logprobs if self.logprobs else 0)
        attempt, t0 = 0, time.perf_counter()
        while True:
            attempt += 1
            try:
                reply = self._parse(self._send(self.url, data=data, cap=cap), max_tokens)
                reply.latency_s, reply.attempts = time.perf_counter() - t0, attempt
                return reply
            except EndpointError as exc:  # not retried; counted with the attempts before it
                raise type(exc)(exc.kind, exc.detail, attempt, exc.status) from None
            except _Retry as exc:
                if attempt > self.retries:
                    raise EndpointError(exc.kind, self.scrub(exc.detail), attempt,
                                        exc.status) from None
                self.sleep(backoff_s(attempt, self.backoff, exc.retry_after,
                                     retry_after_cap=self.retry_after_cap,
                                     jitter=random.uniform(0.5, 1.0)))

    def check(self) -> None:
        """Fail early when the server cannot be reached at all (EndpointError, after the usual
        retries: it may be starting) or refuses the key (EndpointRefused): ``GET {URL}/models``.
        Any other answer, a 404 included (not every server lists its models), will do; its body
        is not read."""
        base = self.url[:-len("/chat/completions")]
        attempt = 0
        while True:
            attempt += 1
            try:
                self._send(base + "/models")
                return
            except EndpointRefused as exc:
                if exc.status != 404 or exc.kind == "redirect":
                    raise
                return
            except EndpointError:
                return  # it answered
            except _Retry as exc:
                if exc.kind not in ("timeout", "connection"):
                    return  # it answered (a 5xx or 429 here says the server is up)
                if attempt > self.retries:
                    raise EndpointError(exc.kind, f"cannot reach {base}: {exc.detail}",
                                        attempt) from None
                self.sleep(backoff_s(attempt, self.backoff, jitter=random.uniform(0.5, 1.0)))

    def scrub(self, text: str) -> str:
        """``text`` without the key, cut to a readable length."""
        text = str(text)
        if self._key:
            text = text.replace(self._key, "[key]")
        return text[:_DETAIL_CHARS]

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        return headers

    def _send(self, url: str, data: bytes | None = None, cap: int = 0) -> bytes:
        """One HTTP request within ``timeout`` seconds in all; the body (at most ``cap`` bytes)
        when ``cap``, else nothing read. Failures as the module docstring sorts them."""
        request = transport.request(url, Deadline(self.timeout), data, self._headers(),
                                    "POST" if data is not None else "GET")
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return transport.read_capped(response, cap) if cap else b""
        except BodyTooLarge as exc:
            raise EndpointError("too_large", f"{exc}, more than max_tokens can need; the server "
                                             "may ignore max_tokens") from None
        except RedirectRefused as exc:
            raise EndpointRefused("redirect", self.scrub(str(exc)), 1, exc.code) from None
        except urllib.error.HTTPError as exc:
            detail = self.scrub(_body_text(exc))
            status = exc.code
            if status in (401, 403, 404):
                raise EndpointRefused("refused", detail, 1, status) from None
            if status == 429:
                raise _Retry("rate_limited", detail, status,
                             retry_after_s(exc.headers.get("Retry-After"))) from None
            if status >= 500:
                raise _Retry("server_error", detail, status) from None
            raise EndpointError("bad_request", detail, 1, status) from None
        except urllib.error.URLError as exc:
            kind = "timeout" if isinstance(exc.reason, (socket.timeout, TimeoutError)) \
                else "connection"
            raise _Retry(kind, self.scrub(f"{exc.reason}")) from None
        except (socket.timeout, TimeoutError) as exc:
            raise _Retry("timeout", f"{exc}") from None
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            raise _Retry("connection", self.scrub(f"{type(exc).__name__}: {exc}")) from None

    def _parse(self, raw: bytes, max_tokens: int) -> Reply:
        try:
            return parse(json.loads(raw.decode("utf-8")), max_tokens,
                         self.top_logprobs if self.logprobs else 0)
        except BadField as exc:
            raise _Retry("malformed", self.scrub(f"{exc}")) from None
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deep
            shown = raw[:200].decode("utf-8", "replace")
            raise _Retry("malformed", self.scrub(f"not JSON ({exc}): {shown!r}")) from None


def _body_text(exc: urllib.error.HTTPError) -> str:
    """The error body's message (OpenAI's ``{"error": {"message"}}``) or its first characters."""
    try:
        raw = exc.read(4096).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 -- the status is enough
        return exc.reason if isinstance(exc.reason, str) else ""
    try:
        message = json.loads(raw)["error"]["message"]
        return str(message)
    except (ValueError, KeyError, TypeError):
        return raw[:_DETAIL_CHARS]
