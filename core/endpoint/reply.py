"""One chat completion read from a server's JSON: every field the store keeps checked first, and
the completion held to the token budget the request asked for.

A server's answer is not taken as truth. ``parse`` raises ``BadField`` naming the first field
that is wrong (``choices[0].logprobs.content[3].logprob: inf is not ...``); the client makes it
that turn's ``malformed`` endpoint error. The rules:

* ``choices[0].message.content``: a string (valid Unicode: no lone surrogates, which JSON
  escapes can carry and the store cannot write) or null (read as "").
* ``choices[0].finish_reason``: one of ``FINISH_REASONS`` (OpenAI, vLLM / SGLang ``abort``,
  Together ``error``) or an alias of ``stop`` that TGI sends (``FINISH_ALIASES``).
* logprobs (``choices[0].logprobs.content[i]`` and its ``top_logprobs``): finite and <= 0. A
  value up to ``LOGPROB_SLACK`` above 0 is a probability of 1 rounded up and is stored as 0.0;
  above that it is no log-probability. ``token`` a string, ``bytes`` a list of 0..255.
* ``usage``: every numeric count a whole number in [0, ``COUNT_MAX``]; the standard counts, when
  present and not null, must be numbers; other non-numeric entries (``*_details``) are left out.

The budget: a server that ignores ``max_tokens`` must not put an unbounded action in the store.
More logprob entries than ``max_tokens``, or more characters than ``char_budget(max_tokens)``,
and the completion is cut to the budget, its finish reason reported as ``length`` (the
collection marks the turn ``action_truncated``) and the cut counted in ``Reply.cut_tokens`` /
``Reply.cut_chars``. ``body_cap`` bounds the bytes read before any of this (the transport).
"""
from __future__ import annotations

import codecs
import math
from dataclasses import dataclass, field

FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call",
                            "abort", "error"})
FINISH_ALIASES = {"eos_token": "stop", "stop_sequence": "stop", "eos": "stop"}
LOGPROB_SLACK = 1e-4
"""A float32 log-softmax of a near-certain token can print a hair above 0; this much is kept."""
COUNT_MAX = 10 ** 9
"""More tokens than any context window holds: a count above it is no count."""
COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")
CHARS_PER_TOKEN = 64
"""Characters one token may average over a whole completion: the longest vocabulary entries are
runs of spaces or symbols of a few dozen characters; real text averages about 4."""
CHAR_SLACK = 256
BODY_SLACK = 1 << 20
"""Bytes for the JSON around the completion (ids, usage, a long ``stop_reason``, whitespace)."""
BYTES_PER_TOKEN = 1 << 10
"""Bytes one token may take in the JSON, per place it appears (content, logprob entry, each
alternative): a common token's entry is ~100 bytes, a 64-space token's ~700 (token, bytes list)."""
_SHOWN = 60


class BadField(ValueError):
    """A field of the reply that cannot be stored: ``field`` is its JSON path."""

    def __init__(self, where: str, problem: str):
        super().__init__(f"{where}: {problem}")
        self.field = where


@dataclass
class Reply:
    """One chat completion as the collection needs it."""
    text: str
    """The message content as returned (the stop string left out by the server), cut to the
    budget when longer."""
    finish_reason: str
    """stop | length | ... as the server said; ``length`` when the completion was cut here."""
    tokens: list[tuple[str, float]] | None
    """(token text, logprob) of each returned token, when the server sent logprobs."""
    top: list[list[tuple[str, float]]] | None = None
    """Each token's top alternatives, when asked for (``top_logprobs``)."""
    stop_reason: str | None = None
    """The stop string that matched, where the server says (vLLM)."""
    usage: dict = field(default_factory=dict)
    latency_s: float = 0.0
    attempts: int = 1
    cut_chars: int = 0
    """Characters of the server's content past the budget, left out (0: none)."""
    cut_tokens: int = 0
    """Logprob entries past ``max_tokens``, left out (0: none)."""


def body_cap(max_tokens: int, top_logprobs: int = 0) -> int:
    """Most bytes a reply body may have: ``BODY_SLACK + max_tokens * (2 + top_logprobs) *
    BYTES_PER_TOKEN`` (the content, the token's logprob entry, and each alternative; 1 MiB +
    32 KiB for 16 tokens, 1 MiB + 28 MiB for 4096 tokens with 5 alternatives)."""
    return BODY_SLACK + max(max_tokens, 1) * (2 + max(top_logprobs, 0)) * BYTES_PER_TOKEN


def char_budget(max_tokens: int) -> int:
    """Most characters a ``max_tokens`` completion can hold: ``CHARS_PER_TOKEN * max_tokens +
    CHAR_SLACK`` (1,280 for 16 tokens)."""
    return CHARS_PER_TOKEN * max(max_tokens, 0) + CHAR_SLACK


def parse(data, max_tokens: int, top_logprobs: int = 0) -> Reply:
    """The Reply of a parsed chat-completion body (module docstring), or ``BadField``."""
    if not isinstance(data, dict):
        raise BadField("body", f"not a JSON object but {_kind(data)}")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise BadField("choices", f"not a non-empty list but {_shown(choices)}")
    choice = _object(choices[0], "choices[0]")
    message = _object(choice.get("message"), "choices[0].message")
    text = message.get("content")
    text = "" if text is None else _text(text, "choices[0].message.content")
    finish = _finish(choice.get("finish_reason"))
    stop_reason = choice.get("stop_reason")
    if stop_reason is not None and (isinstance(stop_reason, bool)
                                    or not isinstance(stop_reason, (str, int))):
        raise BadField("choices[0].stop_reason", f"{_shown(stop_reason)} is not a string, a token "
                                                 f"id or null")
    tokens, top, cut_tokens = _logprobs(choice.get("logprobs"), max_tokens, top_logprobs)
    usage = _usage(data.get("usage"))

    keep = len(text)
    if cut_tokens and tokens is not None:  # the kept tokens' text, where they spell the content
        spelled = "".join(t for t, _ in tokens)
        if text.startswith(spelled):
            keep = len(spelled)
    keep = min(keep, char_budget(max_tokens))
    cut_chars = len(text) - keep
    if cut_chars:
        text = text[:keep]
        if tokens is not None:
            kept, length = 0, 0
            while kept < len(tokens) and length + len(tokens[kept][0]) <= keep:
                length += len(tokens[kept][0])
                kept += 1
            cut_tokens += len(tokens) - kept
            tokens = tokens[:kept]
            top = top[:kept] if top else top
    if cut_chars or cut_tokens:
        finish = "length"
    return Reply(text=text, finish_reason=finish, tokens=tokens, top=top if top else None,
                 stop_reason=stop_reason if isinstance(stop_reason, str) else None,
                 usage=usage, cut_chars=cut_chars, cut_tokens=cut_tokens)


def _logprobs(block, max_tokens: int, top_k: int) -> tuple[list | None, list | None, int]:
    """(tokens, top, entries cut) from a choice's ``logprobs`` (``{"content": [{"token",
    "logprob", "bytes", "top_logprobs"}]}``); (None, None, 0) when the server sent none."""
    if block is None:
        return None, None, 0
    block = _object(block, "choices[0].logprobs")
    entries = block.get("content")
    if entries is None:
        return None, None, 0
    if not isinstance(entries, list):
        raise BadField("choices[0].logprobs.content", f"not a list but {_kind(entries)}")
    cut = max(len(entries) - max_tokens, 0)
    tokens, top = [], []
    # A token's text from its bytes where the server sends them: a character split across
    # tokens then reads "" for its first part and whole for the last (the texts spell the
    # content), where the token strings would hold a broken character each.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for i, entry in enumerate(entries[:max_tokens]):
        where = f"choices[0].logprobs.content[{i}]"
        entry = _object(entry, where)
        token = _text(entry.get("token"), where + ".token")
        raw = entry.get("bytes")
        if raw is not None and (not isinstance(raw, list) or not all(
                type(b) is int and 0 <= b <= 255 for b in raw)):
            raise BadField(where + ".bytes", f"{_shown(raw)} is not a list of bytes (0..255)")
        tokens.append((decoder.decode(bytes(raw)) if raw is not None else token,
                       _logprob(entry.get("logprob"), where + ".logprob")))
        alternatives = entry.get("top_logprobs") or []
        if not isinstance(alternatives, list):
            raise BadField(where + ".top_logprobs", f"not a list but {_kind(alternatives)}")
        row = []
        for j, alt in enumerate(alternatives[:top_k]):  # more than asked for: left out
            at = f"{where}.top_logprobs[{j}]"
            alt = _object(alt, at)
            row.append((_text(alt.get("token"), at + ".token"),
                        _logprob(alt.get("logprob"), at + ".logprob")))
        top.append(row)
    return tokens, (top if any(top) else None), cut


def _logprob(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadField(where, f"{_shown(value)} is not a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or number > LOGPROB_SLACK:
        raise BadField(where, f"{_shown(value)} is not a log-probability (finite and <= 0)")
    return min(number, 0.0)


def _usage(usage) -> dict:
    if usage is None:
        return {}
    usage = _object(usage, "usage")
    out = {}
    for key, value in usage.items():
        where = f"usage.{key}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if key in COUNTS and value is not None:
                raise BadField(where, f"{_shown(value)} is not a count")
            continue
        if isinstance(value, float) and not value.is_integer() or not 0 <= value <= COUNT_MAX:
            raise BadField(where, f"{_shown(value)} is not a count (a whole number in "
                                  f"0..{COUNT_MAX:,})")
        out[str(key)] = int(value)
    return out


def _finish(value) -> str:
    if isinstance(value, str):
        value = FINISH_ALIASES.get(value, value)
        if value in FINISH_REASONS:
            return value
    raise BadField("choices[0].finish_reason", f"{_shown(value)} is not one of "
                                               f"{', '.join(sorted(FINISH_REASONS))}")


def _text(value, where: str) -> str:
    if not isinstance(value, str):
        raise BadField(where, f"not a string but {_kind(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadField(where, f"not valid Unicode (a lone surrogate at character {exc.start})") \
            from None
    return value


def _object(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise BadField(where, f"not an object but {_kind(value)}")
    return value


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
