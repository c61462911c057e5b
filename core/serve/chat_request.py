"""A chat-completions request as core/serve/server.py accepts it: parsed and checked field by
field, before any of it is kept or reaches the model.

Pure functions: each returns either the parsed value or a ``RequestError`` that names the field
(the header, the JSON key, or ``messages[i].content``) and the HTTP status to answer with, so the
server can answer every bad request with an OpenAI-style JSON error instead of dropping it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

MAX_TOKENS = 256
"""``max_tokens`` when a request gives none (less when the model's context has less room left)."""
MAX_STOPS = 4
"""Stop strings per request (OpenAI takes at most 4)."""
MAX_TOP_LOGPROBS = 20
"""``top_logprobs`` at most (OpenAI's bound; the server computes 20 alternatives per token)."""


@dataclass(frozen=True)
class RequestError:
    """Why a request is refused: ``status`` (400, 411, 413), ``param`` (the field), ``message``."""
    status: int
    param: str
    message: str
    code: str | None = None

    def body(self) -> dict:
        """OpenAI's error object; the message starts with the field so any client shows it."""
        return {"error": {"message": f"{self.param}: {self.message}",
                          "type": "invalid_request_error", "param": self.param,
                          "code": self.code}}


@dataclass(frozen=True)
class ChatRequest:
    """The fields the server uses; ``max_tokens`` None = the default (see ``completion_budget``)."""
    messages: list[dict]
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    model: str | None = None
    stream: bool = False
    """Answer as server-sent events (``chat.completion.chunk``s, then ``[DONE]``)."""


def content_length(values: list[str], transfer_encoding: str | None,
                   cap: int) -> int | RequestError:
    """The body's length from the ``Content-Length`` header(s), or why it will not be read.

    Chunked bodies and a missing length get 411 (the server reads exactly the declared bytes, so
    it must know them first); a negative, non-integer or conflicting length 400; more than
    ``cap`` bytes 413, decided before a byte of the body is read."""
    if transfer_encoding:
        return RequestError(411, "Transfer-Encoding", f"{transfer_encoding!r} bodies are not "
                            "supported; send the body with a Content-Length")
    if not values:
        return RequestError(411, "Content-Length", "missing: a POST needs one")
    texts = {v.strip() for v in values}
    # 20 digits is past any real length; longer digit strings would only cost int() time
    if len(texts) > 1 or not all(t.isascii() and t.isdigit() and len(t) <= 20 for t in texts):
        return RequestError(400, "Content-Length", f"{', '.join(values)!r} is not one "
                            "non-negative integer")
    length = int(texts.pop())
    if length > cap:
        return RequestError(413, "Content-Length", f"{length} bytes is over this server's "
                            f"limit of {cap} bytes (--max-body-mb)", "request_too_large")
    return length


def parse_chat_request(raw: bytes, *, context: int) -> ChatRequest | RequestError:
    """The request in ``raw`` (the body's bytes), every field type- and range-checked.

    ``context`` is the model's context in tokens: a ``max_tokens`` above it can never be served
    (the room left after the prompt is checked once the prompt is tokenised)."""
    try:
        req = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return RequestError(400, "body", f"not UTF-8 ({exc.reason} at byte {exc.start})")
    except (ValueError, RecursionError) as exc:
        return RequestError(400, "body", f"not JSON ({str(exc)[:100]})")
    if not isinstance(req, dict):
        return RequestError(400, "body", f"must be a JSON object, not {_kind(req)}")
    messages = _messages(req.get("messages"), context)
    if isinstance(messages, RequestError):
        return messages
    fields: dict = {"messages": messages}
    for name, check in _CHECKS:
        value = req.get(name)
        if value is None:
            continue
        ok = check(value, context)
        if isinstance(ok, str):
            return RequestError(400, name, ok)
        fields[name] = value
    if req.get("n") is not None and (type(req["n"]) is not int or req["n"] != 1):
        return RequestError(400, "n", f"{req['n']!r}: only n = 1 is supported")
    if req.get("stream") not in (None, True, False):
        return RequestError(400, "stream", f"{req['stream']!r}: must be true or false")
    stop = fields.pop("stop", ())
    # max_completion_tokens is the newer name; it wins when both are given, as with OpenAI
    limit = fields.pop("max_completion_tokens", fields.pop("max_tokens", None))
    stops = (stop,) if isinstance(stop, str) else stop
    return ChatRequest(**fields, max_tokens=limit, stop=tuple(s for s in stops if s),
                       stream=bool(req.get("stream")))


def completion_budget(requested: int | None, prompt_tokens: int,
                      context: int) -> int | RequestError:
    """The tokens to generate: ``requested`` when the context has room for it after the prompt
    (room = context - prompt_tokens), else 400 naming ``max_tokens`` as OpenAI does (or
    ``messages`` when the prompt alone fills the context). None gives min(MAX_TOKENS, room)."""
    room = context - prompt_tokens
    if room < 1:
        return RequestError(400, "messages", f"the prompt is {prompt_tokens} tokens and the "
                            f"model's context is {context}: no room to answer",
                            "context_length_exceeded")
    if requested is None:
        return min(MAX_TOKENS, room)
    if requested > room:
        return RequestError(400, "max_tokens", f"{requested} is more than the room left in the "
                            f"model's context: {context} - {prompt_tokens} prompt tokens = {room}",
                            "context_length_exceeded")
    return requested


def _messages(value, context: int) -> list[dict] | RequestError:
    """Each message as ``{"role", "content"}`` with a string content (text parts joined). More
    messages than the context has tokens can never fit (each takes at least one), and are
    refused before they are copied or rendered."""
    if not isinstance(value, list) or not value:
        return RequestError(400, "messages", f"must be a non-empty list, not {_kind(value)}")
    if len(value) > context:
        return RequestError(400, "messages", f"{len(value)} messages cannot fit the model's "
                            f"context of {context} tokens", "context_length_exceeded")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            return RequestError(400, where, f"must be an object, not {_kind(m)}")
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role:
            return RequestError(400, f"{where}.role", f"must be a non-empty string, not "
                                f"{_kind(role)}")
        if isinstance(content, list):  # OpenAI's content parts: only text ones here
            if not all(isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str) for p in content):
                return RequestError(400, f"{where}.content", "only text parts "
                                    '({"type": "text", "text": ...}) are supported')
            content = "".join(p["text"] for p in content)
        if content is None:
            content = ""
        if not isinstance(content, str):
            return RequestError(400, f"{where}.content", f"must be a string, not "
                                f"{_kind(content)}")
        for name, text in (("role", role), ("content", content)):
            if (bad := _unpaired(text)) is not None:
                return RequestError(400, f"{where}.{name}", bad)
        out.append({"role": role, "content": content})
    return out


def _unpaired(text: str) -> str | None:
    """Why ``text`` is not text: a lone UTF-16 surrogate (JSON's ``\\ud800`` escapes decode to
    one), which no tokenizer or UTF-8 writer takes; None when it is fine."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"holds a lone surrogate \\u{ord(text[exc.start]):04x} at character "
                f"{exc.start}, which is not text")
    return None


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


def _int_in(low: int, high_of, why: str = "") -> callable:
    """A check: an integer (not a bool) in [low, high_of(context)]."""
    def check(v, context):
        high = high_of(context)
        if isinstance(v, bool) or not isinstance(v, int):
            return f"must be an integer, not {_kind(v)}"
        if not low <= v <= high:
            return f"{v} is outside [{low}, {high}]{why}"
        return None
    return check


def _number_in(low: float, high: float) -> callable:
    """A check: a finite number (not a bool) in [low, high]."""
    def check(v, _context):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"must be a number, not {_kind(v)}"
        if not (math.isfinite(v) and low <= v <= high):
            return f"{v} is outside [{low:g}, {high:g}]"
        return None
    return check


def _stop(v, _context):
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        return f"must be a string or a list of strings, not {_kind(v)}"
    if len(items) > MAX_STOPS:
        return f"{len(items)} stop strings; at most {MAX_STOPS}"
    return next((bad for s in items if (bad := _unpaired(s)) is not None), None)


def _seed(v, _context):
    if isinstance(v, bool) or not isinstance(v, int):
        return f"must be an integer, not {_kind(v)}"
    return None


def _flag(v, _context):
    return None if isinstance(v, bool) else f"must be true or false, not {_kind(v)}"


def _text(v, _context):
    return _unpaired(v) if isinstance(v, str) else f"must be a string, not {_kind(v)}"


_CHECKS = (("model", _text),
           ("max_tokens", _int_in(1, lambda c: c, " (the model's context)")),
           ("max_completion_tokens", _int_in(1, lambda c: c, " (the model's context)")),
           ("temperature", _number_in(0.0, 2.0)),
           ("top_p", _number_in(0.0, 1.0)),
           ("seed", _seed),
           ("stop", _stop),
           ("logprobs", _flag),
           ("top_logprobs", _int_in(0, lambda c: MAX_TOP_LOGPROBS)))
"""Each optional field and its check: None when fine, else what is wrong (the field is named by
the caller)."""
