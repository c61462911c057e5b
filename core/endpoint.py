"""An OpenAI-compatible chat-completions client: the endpoint policy's one way to the server.

``--model openai:URL --model-name NAME`` makes a server (vLLM, SGLang, llama.cpp server, Ollama,
a hosted API, or core/endpoint_server.py) the policy; core/collection.py runs the episodes. Only
the standard library speaks HTTP here (``urllib``).

One request per turn: ``POST {URL}/chat/completions`` with the conversation so far, the env's
stop tags as ``stop``, ``max_tokens``, ``temperature``, ``top_p``, ``seed`` and, unless turned off,
``logprobs: true`` (and ``top_logprobs: k``). The key is read from ``AGENTRL_OPENAI_API_KEY``
(else ``OPENAI_API_KEY``) and sent as ``Authorization: Bearer``; it is never part of the config,
and every error text is scrubbed of it before anything keeps it.

Failures, per request:
* timeout, connection lost, HTTP 5xx, HTTP 429, a 200 whose body is not a chat completion:
  retried up to ``retries`` times, waiting ``backoff * 2**(attempt-1)`` seconds (x a jitter in
  [0.5, 1], at most ``BACKOFF_CAP_S``) or, for a 429 with ``Retry-After``, that long (at most
  ``RETRY_AFTER_CAP_S``). Still failing: ``EndpointError``, which ends that trajectory only.
* any other 4xx (e.g. the context is longer than the server takes): ``EndpointError`` at once.
* 401, 403, 404 (bad key, no such model or URL): ``EndpointRefused``; every request would fail
  alike, so the run stops with that message.
Before a run starts, ``check`` asks ``GET {URL}/models``: a server that cannot be reached at all
(after the same retries) or that refuses the key is said at once, and no run is recorded.

The stop tag: OpenAI's ``stop`` leaves the matched string out of the returned text and does not
say which one matched (vLLM does, as ``stop_reason``). ``restore_stop`` appends it again: the
``stop_reason`` when given, else the stop tag whose opening tag is still open, so the action the
env receives and the store keeps ends with its closing tag, as our own rollouts' do.
"""
from __future__ import annotations

import codecs
import http.client
import json
import os
import random
import re
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Callable, Sequence

PREFIX = "openai:"
KEY_VARS = ("AGENTRL_OPENAI_API_KEY", "OPENAI_API_KEY")
"""Where the API key is read from, first set wins. Local servers need none."""
BACKOFF_CAP_S = 30.0
RETRY_AFTER_CAP_S = 60.0
"""A server asking for a longer pause than this is waited for this long, then tried again."""
_DETAIL_CHARS = 500


class EndpointError(RuntimeError):
    """A request that failed for good: ``kind`` is timeout | connection | server_error |
    rate_limited | malformed | bad_request | refused; ``status`` the HTTP status if any."""

    def __init__(self, kind: str, detail: str, attempts: int = 1, status: int | None = None):
        super().__init__(f"{kind}" + (f" (HTTP {status})" if status else "")
                         + f" after {attempts} attempt{'s' * (attempts != 1)}: {detail}")
        self.kind, self.detail, self.attempts, self.status = kind, detail, attempts, status

    def as_info(self) -> dict:
        return {"kind": self.kind, "status": self.status, "attempts": self.attempts,
                "detail": self.detail}


class EndpointRefused(EndpointError):
    """401 / 403 / 404: a wrong key, model name or URL. The run stops."""


class _Retry(Exception):
    def __init__(self, kind: str, detail: str, status: int | None = None,
                 retry_after: float | None = None):
        super().__init__(detail)
        self.kind, self.detail, self.status, self.retry_after = kind, detail, status, retry_after


@dataclass
class Reply:
    """One chat completion as the collection needs it."""
    text: str
    """The message content exactly as returned (the stop string left out by the server)."""
    finish_reason: str
    """stop | length | ... as the server said."""
    tokens: list[tuple[str, float]] | None
    """(token text, logprob) of each returned token, when the server sent logprobs."""
    top: list[list[tuple[str, float]]] | None = None
    """Each token's top alternatives, when asked for (``top_logprobs``)."""
    stop_reason: str | None = None
    """The stop string that matched, where the server says (vLLM)."""
    usage: dict = field(default_factory=dict)
    latency_s: float = 0.0
    attempts: int = 1


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
        good, EndpointRefused for 401/403/404."""
        data = json.dumps(self.body(messages, **kwargs)).encode()
        attempt, t0 = 0, time.perf_counter()
        while True:
            attempt += 1
            try:
                reply = self._parse(self._post(data))
                reply.latency_s, reply.attempts = time.perf_counter() - t0, attempt
                return reply
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
        Any other answer, a 404 included (not every server lists its models), will do."""
        base = self.url[:-len("/chat/completions")]
        attempt = 0
        while True:
            attempt += 1
            try:
                self._send(urllib.request.Request(base + "/models", headers=self._headers()))
                return
            except EndpointRefused as exc:
                if exc.status != 404:
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

    def _post(self, data: bytes) -> bytes:
        return self._send(urllib.request.Request(self.url, data=data, headers=self._headers(),
                                                 method="POST"))

    def _send(self, request: urllib.request.Request) -> bytes:
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.read()
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
            raise _Retry("timeout", f"no answer within {self.timeout:g} s ({exc})") from None
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            raise _Retry("connection", self.scrub(f"{type(exc).__name__}: {exc}")) from None

    def _parse(self, raw: bytes) -> Reply:
        try:
            data = json.loads(raw.decode("utf-8"))
            choice = data["choices"][0]
            message = choice["message"]
            text = message.get("content") or ""
            if not isinstance(text, str):
                raise TypeError(f"content is {type(text).__name__}")
            finish = str(choice.get("finish_reason") or "stop")
            tokens, top = _logprobs(choice.get("logprobs"))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            shown = raw[:200].decode("utf-8", "replace")
            raise _Retry("malformed", self.scrub(f"not a chat completion ({exc}): {shown!r}"))
        stop_reason = choice.get("stop_reason")
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        return Reply(text=text, finish_reason=finish, tokens=tokens, top=top,
                     stop_reason=stop_reason if isinstance(stop_reason, str) else None,
                     usage={k: v for k, v in usage.items() if isinstance(v, (int, float))})


def _logprobs(block) -> tuple[list | None, list | None]:
    """(tokens, top) from a choice's ``logprobs`` (``{"content": [{"token", "logprob",
    "top_logprobs"}]}``), or (None, None) when the server sent none."""
    if not isinstance(block, dict) or not isinstance(block.get("content"), list):
        return None, None
    tokens, top = [], []
    # A token's text from its bytes where the server sends them: a character split across
    # tokens then reads "" for its first part and whole for the last (the texts spell the
    # content), where the token strings would hold a broken character each.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for entry in block["content"]:
        raw = entry.get("bytes")
        text = decoder.decode(bytes(raw)) if isinstance(raw, list) else str(entry["token"])
        tokens.append((text, float(entry["logprob"])))
        top.append([(str(a["token"]), float(a["logprob"]))
                    for a in entry.get("top_logprobs") or ()])
    return tokens, (top if any(top) else None)


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
