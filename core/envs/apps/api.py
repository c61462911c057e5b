"""The API surface of the apps world: endpoint registry, argument checking, documentation.

Every endpoint is a plain function ``fn(world, **arguments)`` registered with its app, a
description and typed parameters; ``call_api`` is the single entry point used by both the
``<tool>`` action and the ``<code>`` sandbox, so the two paths change the database identically.
Bad calls raise ``ApiError`` with a message meant for the agent (which endpoint, which
argument, what was expected): the environment turns it into an error observation.

The endpoints live in ``endpoints/``; importing that package fills ``ENDPOINTS``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from core.envs.apps.world import World, parse_time

TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
         "array": (list,)}
APPS = {
    "apis": "Documentation of every app and endpoint.",
    "contacts": "The user's address book.",
    "calendar": "Events with times, places and attendees.",
    "email": "Inbox, sent and archived mail.",
    "notes": "Free-text notes with tags.",
    "todo": "Todo lists with due dates.",
    "wallet": "Balance, money transfers and payment requests.",
}


class ApiError(Exception):
    """A failed call (unknown endpoint, bad arguments, missing record): shown to the agent."""


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    required: bool
    description: str
    default: Any = None

    def doc(self) -> dict[str, Any]:
        out = {"name": self.name, "type": self.type, "required": self.required,
               "description": self.description}
        if not self.required and self.default is not None:
            out["default"] = self.default
        return out


@dataclass(frozen=True)
class Endpoint:
    name: str
    description: str
    params: tuple[Param, ...]
    returns: str
    mutates: bool
    fn: Callable[..., Any]

    @property
    def app(self) -> str:
        return self.name.split(".", 1)[0]

    def signature(self) -> str:
        args = ", ".join(p.name + ("" if p.required else "?") for p in self.params)
        return f"{self.name}({args})"

    def doc(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "parameters": [p.doc() for p in self.params], "returns": self.returns}


ENDPOINTS: dict[str, Endpoint] = {}


def endpoint(name: str, description: str, *params: Param, returns: str = "",
             mutates: bool = False):
    """Register ``fn(world, **arguments)`` as endpoint ``name`` ("app.endpoint")."""
    def wrap(fn):
        if name in ENDPOINTS:
            raise ValueError(f"endpoint {name} registered twice")
        ENDPOINTS[name] = Endpoint(name, description, params, returns, mutates, fn)
        return fn
    return wrap


def req(name: str, type_: str, description: str) -> Param:
    return Param(name, type_, True, description)


def opt(name: str, type_: str, description: str, default: Any = None) -> Param:
    return Param(name, type_, False, description, default)


# ---- argument checking ---------------------------------------------------------------------------
def _type_ok(value: Any, type_: str) -> bool:
    if isinstance(value, bool) and type_ in ("integer", "number"):
        return False  # JSON true is not a number, though Python says bool is an int
    if type_ == "array":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, TYPES[type_])


def _encodable(value: Any) -> bool:
    """False for text with lone surrogates (JSON allows "\\ud800"; UTF-8 and SQLite do not)."""
    try:
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str):
                text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def check_arguments(ep: Endpoint, arguments: Any) -> dict[str, Any]:
    """The arguments with defaults filled in, or ApiError naming the first problem."""
    if not isinstance(arguments, dict):
        raise ApiError(f"{ep.name}: 'arguments' must be a JSON object, "
                       f"got {type(arguments).__name__}")
    known = {p.name: p for p in ep.params}
    unknown = sorted(set(arguments) - set(known))
    if unknown:
        raise ApiError(f"{ep.name}: unknown argument {unknown[0]!r}; expected one of "
                       f"{sorted(known) or 'no arguments'}")
    out = {}
    for p in ep.params:
        if p.name not in arguments or arguments[p.name] is None:
            if p.required:
                raise ApiError(f"{ep.name}: missing required argument {p.name!r} ({p.type})")
            out[p.name] = p.default
            continue
        value = arguments[p.name]
        if p.type in ("string", "array") and not _encodable(value):
            raise ApiError(f"{ep.name}: argument {p.name!r} contains characters that are not "
                           "valid Unicode (lone surrogates)")
        if not _type_ok(value, p.type):
            want = "array of strings" if p.type == "array" else p.type
            raise ApiError(f"{ep.name}: argument {p.name!r} must be {want}, "
                           f"got {type(value).__name__} {value!r:.40}")
        out[p.name] = value
    return out


_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def as_time(value: str, arg: str, end_of_day: bool = False) -> str:
    """Normalise 'YYYY-MM-DD' or 'YYYY-MM-DD HH:MM' (a 'T' and seconds allowed) to the world's
    format; a bare date means the start of that day, or its last minute with ``end_of_day``."""
    text = value.strip().replace("T", " ")
    if _DATE.match(text):
        text += " 23:59" if end_of_day else " 00:00"
    if len(text) == 19:  # drop seconds
        text = text[:16]
    try:
        return parse_time(text).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        raise ApiError(f"argument {arg!r}: expected 'YYYY-MM-DD' or 'YYYY-MM-DD HH:MM', "
                       f"got {value!r:.40}") from None


def as_email(value: str, arg: str) -> str:
    text = value.strip().lower()
    if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[a-z]+", text):
        raise ApiError(f"argument {arg!r}: {value!r:.60} is not an email address")
    return text


def as_cents(amount: float, arg: str = "amount") -> int:
    cents = round(amount * 100)
    if cents <= 0 or abs(amount * 100 - cents) > 1e-6:
        raise ApiError(f"argument {arg!r}: expected a positive amount with at most 2 decimals, "
                       f"got {amount!r}")
    return int(cents)


def limit_of(value: int, most: int = 20) -> int:
    if value < 1:
        raise ApiError("argument 'limit' must be at least 1")
    return min(value, most)


def like(text: str | None) -> str:
    """A case-insensitive SQL LIKE pattern for 'contains text' (compare against lower(...))."""
    return f"%{(text or '').strip().lower()}%"


def found(row: dict | None, what: str, key: int) -> dict:
    if row is None:
        raise ApiError(f"no {what} with id {key}")
    return row


# ---- dispatch ----------------------------------------------------------------------------------
def show_docs(app: str | None = None, endpoint: str | None = None) -> Any:
    """apis.show_docs: no arguments -> apps; app -> its endpoints; endpoint -> its full doc."""
    if endpoint is not None:
        full = endpoint if "." in endpoint else f"{app}.{endpoint}"
        if full not in ENDPOINTS:
            raise ApiError(f"apis.show_docs: unknown endpoint {full!r}; list an app's endpoints "
                           f"with {{\"app\": \"{full.split('.')[0]}\"}}")
        return ENDPOINTS[full].doc()
    if app is None:
        return [{"app": a, "description": d} for a, d in APPS.items()]
    if app not in APPS:
        raise ApiError(f"apis.show_docs: unknown app {app!r}; apps are {sorted(APPS)}")
    return [f"{ep.signature()}: {ep.description}" for ep in ENDPOINTS.values() if ep.app == app]


def call_api(world: World, name: Any, arguments: Any) -> Any:
    """Run endpoint ``name`` with ``arguments`` on ``world``; the JSON-able result or ApiError."""
    if not isinstance(name, str) or name not in ENDPOINTS:
        hint = ""
        if isinstance(name, str) and name.split(".")[0] in APPS:
            hint = f"; see apis.show_docs with {{\"app\": \"{name.split('.')[0]}\"}}"
        elif isinstance(name, str):
            hint = f"; apps are {sorted(APPS)}"
        raise ApiError(f"unknown endpoint {name!r:.60}{hint}")
    ep = ENDPOINTS[name]
    args = check_arguments(ep, {} if arguments is None else arguments)
    return ep.fn(world, **args)
