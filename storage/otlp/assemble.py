"""Spans -> trajectories, while the agent runs.

One trace is one trajectory, unless its spans name a conversation (``gen_ai.conversation.id``,
``session.id``, rl-insight's identity keys: storage/otlp/conventions.py ``conversation_key``),
which then gathers every trace that names it; its spans become a record in
storage/otlp/record.py (``build_record``).

``Assembler`` routes what arrives and holds the open conversations (``OpenTrace``). The raw
records are stored before the client is answered (storage/otlp/store.py): ``admit`` routes a
request's spans (their run and trajectory), drops a span already stored (a retried export) and
refuses one past the per-trajectory cap, without changing what the deriver sees; ``commit``
makes them visible once they are stored (``undo`` forgets them when the store refused them).
A conversation is *dirty* when something arrived since it was last derived; the deriver
(storage/otlp/writer.py) derives each dirty one every ``flush_s`` as it stands; it *closes*
``grace_s`` after its root span arrived (a root is exported when it ends) or after ``idle_s``
with nothing new, and is then derived one last time and dropped from memory. A span of a
trajectory already in the store (closed in this process, or stored before it started:
``known``) reopens it with ``reload``: the deriver reads all its stored spans back first, so
a late span never makes a shorter trajectory.

Bounds (``Bounds``): spans per trajectory (past it the span is rejected, naming the trace; a
conversation a trace joins counts the trace's spans too), open conversations (past it the one
idle longest is closed early: derived, nothing lost) and bytes held in all, charged by what a
span's values and events hold (past it the request is refused with 429 until the deriver
catches up).
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from storage.otlp.conventions import conversation_key
from storage.otlp.decode import LogRecord, Span

OPEN_EVERY_S, BUSY = 1.0, 64
MAX_KNOWN = 1_000_000
"""Trajectories of the store remembered by key (~250 bytes each); past it every new one is
treated as possibly stored (read back before it is derived, its spans deduplicated by the
store): slower, never wrong."""


@dataclass(frozen=True)
class Bounds:
    """How much the receiver holds (docs/threat-model.md has the measured figures)."""
    max_spans_per_trace: int = 10_000
    max_open_traces: int = 1_000
    max_held_bytes: int = 256 << 20
    idle_s: float = 30.0
    grace_s: float = 0.5
    flush_s: float = 0.5


@dataclass
class OpenTrace:
    """One conversation being received."""
    key: str
    run_id: str
    traj_id: str
    spans: dict[str, Span] = field(default_factory=dict)
    logs: list[LogRecord] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)        # span ids taken (stored or being stored)
    log_keys: set[tuple] = field(default_factory=set)
    last_seen: float = 0.0
    root_seen_at: float | None = None
    held: int = 0
    dirty: bool = False
    reload: bool = False                                # its stored spans are not read back yet
    absorbed: list[str] = field(default_factory=list)   # traces merged in (their rows move)
    derived_at: float = float("-inf")
    scored: dict | None = None  # a scores file's facts (storage/otlp/scores.py), kept on re-derive


@dataclass
class Admission:
    """One request's records routed (``Assembler.admit``): what to store, then commit."""
    spans: list[tuple[str, str, str, Span, bool]] = field(default_factory=list)
    logs: list[tuple[str, str, str, LogRecord]] = field(default_factory=list)  # key, run, traj
    rejected: list[str] = field(default_factory=list)
    duplicates: int = 0
    """spans: (key, run id, traj id, span, suspect); a suspect span's trajectory may hold it in
    the store already (not read back yet): the store inserts it only if absent."""


def value_bytes(v: Any, depth: int = 0) -> int:
    """About what a decoded value costs held in Python (objects, not their JSON text)."""
    if isinstance(v, str):
        return 50 + len(v)
    if isinstance(v, dict):
        return 100 + sum(50 + len(k) + 40 + value_bytes(x, depth + 1) if depth < 32 else 100
                         for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return 60 + sum(8 + value_bytes(x, depth + 1) if depth < 32 else 100 for x in v)
    return 32  # int, float, bool, None


def span_bytes(s: Span) -> int:
    """What a span costs held: its attributes and events as objects, and the span itself."""
    return 600 + len(s.name) + value_bytes(s.attributes) + (value_bytes(s.events)
                                                             if s.events else 0)


def log_bytes(r: LogRecord) -> int:
    return 400 + len(r.event_name) + value_bytes(r.body) + value_bytes(r.attributes)


def log_key(r: LogRecord) -> tuple:
    return (r.trace_id, r.span_id, r.time_ns, r.event_name)


def run_id_for(resource: dict, fixed: str | None) -> str:
    """``fixed``, else ``otlp-{service.name}`` (one run per instrumented service)."""
    if fixed:
        return fixed
    name = str(resource.get("service.name") or "unknown")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:60] or "unknown"
    return f"otlp-{slug}"


def key_of(trace_id: str, traj_id: str) -> str:
    """The assembler's key of a stored trajectory (a trace's own, else its conversation's)."""
    return f"trace:{trace_id}" if traj_id == trace_id else traj_id


class Assembler:
    """The open conversations; thread-safe (the store's appender admits and commits, the
    deriver takes)."""

    def __init__(self, bounds: Bounds = Bounds(), run_id: str | None = None,
                 clock=time.monotonic):
        self.bounds, self.fixed_run, self.clock = bounds, run_id, clock
        self.open: dict[str, OpenTrace] = {}
        self.trace_key: dict[str, str] = {}   # trace id -> conversation key, where not its own
        self.known: dict[str, tuple[str, str]] = {}  # key -> (run id, traj id) of stored ones
        self.complete = True                   # ``known`` holds every stored trajectory
        self.held = 0
        self.lock = threading.Lock()

    def remember(self, rows) -> None:
        """The store's (run id, traj id, trace id) rows: what a late span belongs to."""
        for run_id, traj_id, trace_id in rows:
            key = key_of(trace_id, traj_id)
            if key != f"trace:{trace_id}":
                self.trace_key[trace_id] = key
            self._know(key, run_id, traj_id)

    def _know(self, key: str, run_id: str, traj_id: str) -> None:
        if key in self.known:
            return
        if len(self.known) >= MAX_KNOWN:
            self.complete = False
            return
        self.known[key] = (run_id, traj_id)

    # -- receiving ---------------------------------------------------------------------------
    def over_memory(self) -> bool:
        return self.held > self.bounds.max_held_bytes

    def admit(self, spans: list[Span], logs: list[LogRecord]) -> Admission:
        """Route a request's records; call with ``lock`` held. Nothing the deriver reads
        changes until ``commit``."""
        out = Admission()
        refused: dict[str, int] = {}
        cap = self.bounds.max_spans_per_trace
        now = self.clock()
        for s in spans:
            try:
                conv = conversation_key(s)
            except Exception as exc:  # noqa: BLE001 (a value no convention expects)
                out.rejected.append(f"span {s.span_id} of trace {s.trace_id}: "
                                    f"{type(exc).__name__}: {str(exc)[:200]}")
                continue
            key = conv or self.trace_key.get(s.trace_id) or f"trace:{s.trace_id}"
            if conv:
                self._merge(f"trace:{s.trace_id}", conv, s.trace_id)
                if s.trace_id in self.trace_key or len(self.trace_key) < MAX_KNOWN:
                    self.trace_key[s.trace_id] = conv
            t = self._get(key, s.trace_id, s.resource, now)
            if s.span_id in t.ids:
                out.duplicates += 1
                continue  # a retried export: already stored
            if len(t.ids) >= cap:
                refused[s.trace_id] = refused.get(s.trace_id, 0) + 1
                continue
            t.ids.add(s.span_id)
            out.spans.append((t.key, t.run_id, t.traj_id, s, t.reload))
        for r in logs:
            key = self.trace_key.get(r.trace_id) or f"trace:{r.trace_id}"
            t = self._get(key, r.trace_id, r.resource, now)
            if log_key(r) in t.log_keys:
                continue
            out.logs.append((t.key, t.run_id, t.traj_id, r))
        out.rejected += [f"trace {tid}: {n} span(s) over the limit of {cap} spans per "
                         "trajectory" for tid, n in refused.items() for _ in range(n)]
        return out

    def resolve(self, a: Admission) -> None:
        """Spans admitted to a trace's own trajectory before a later span of the same group
        merged that trace into a conversation are stored under the conversation."""
        for i, (key, run_id, traj_id, s, maybe) in enumerate(a.spans):
            conv = self.trace_key.get(s.trace_id)
            if conv and key != conv and key.startswith("trace:") and conv in self.open:
                t = self.open[conv]
                a.spans[i] = (conv, t.run_id, t.traj_id, s, maybe or t.reload)
        for i, (key, run_id, traj_id, r) in enumerate(a.logs):
            conv = self.trace_key.get(r.trace_id)
            if conv and key != conv and key.startswith("trace:") and conv in self.open:
                t = self.open[conv]
                a.logs[i] = (conv, t.run_id, t.traj_id, r)

    def commit(self, a: Admission) -> None:
        """The admitted records are stored: the deriver may read them. Call with ``lock``."""
        now = self.clock()
        for key, run_id, traj_id, s, _ in a.spans:
            t = self._reopened(key, run_id, traj_id, now)
            t.ids.add(s.span_id)
            if s.span_id not in t.spans:
                t.spans[s.span_id] = s
                size = span_bytes(s)
                t.held += size
                self.held += size
            t.last_seen, t.dirty = now, True
            if not s.parent_span_id and key.startswith("trace:"):
                t.root_seen_at = now
            self._know(key, run_id, traj_id)
        for key, run_id, traj_id, r in a.logs:
            t = self._reopened(key, run_id, traj_id, now)
            if log_key(r) not in t.log_keys:
                t.log_keys.add(log_key(r))
                t.logs.append(r)
                size = log_bytes(r)
                t.held += size
                self.held += size
            t.last_seen, t.dirty = now, True
            self._know(key, run_id, traj_id)

    def undo(self, a: Admission) -> None:
        """The store refused the admitted records: forget them (the client retries)."""
        for key, _, _, s, _ in a.spans:
            t = self.open.get(key)
            if t is not None and s.span_id not in t.spans:
                t.ids.discard(s.span_id)

    def _reopened(self, key: str, run_id: str, traj_id: str, now: float) -> OpenTrace:
        """The open conversation ``key``; the deriver may have closed it since ``admit``."""
        t = self.open.get(key)
        if t is None:
            t = self.open[key] = OpenTrace(key, run_id, traj_id, last_seen=now, reload=True)
        return t

    def _get(self, key: str, trace_id: str, resource: dict, now: float) -> OpenTrace:
        t = self.open.get(key)
        if t is None:
            run_id, traj_id = self.known.get(key, (None, None))
            t = OpenTrace(key, run_id or run_id_for(resource, self.fixed_run),
                          traj_id or (trace_id if key.startswith("trace:") else key),
                          last_seen=now, reload=run_id is not None or not self.complete)
            self.open[key] = t
        return t

    def _merge(self, trace_key: str, conv: str, trace_id: str) -> None:
        """Spans first held under their trace join the conversation a later span names, unless
        that would take the conversation past the per-trajectory cap (the trace then stays a
        trajectory of its own)."""
        early = self.open.get(trace_key)
        if early is None:
            return
        into = self.open.get(conv)
        if into is not None and len(into.ids) + len(early.ids) > self.bounds.max_spans_per_trace:
            return
        del self.open[trace_key]
        if into is None:
            run_id, traj_id = self.known.get(conv, (early.run_id, conv))
            into = self.open[conv] = OpenTrace(conv, run_id, traj_id, last_seen=early.last_seen,
                                               reload=conv in self.known or not self.complete)
        into.spans.update(early.spans)
        into.ids |= early.ids
        for r in early.logs:
            if log_key(r) not in into.log_keys:
                into.log_keys.add(log_key(r))
                into.logs.append(r)
        into.held += early.held
        into.reload = into.reload or early.reload
        into.absorbed += [early.traj_id] + early.absorbed
        into.dirty = True
        self.known.pop(trace_key, None)

    # -- deriving ----------------------------------------------------------------------------
    def take(self, final: bool = False) -> tuple[list[OpenTrace], list[OpenTrace]]:
        """(dirty open conversations to derive as they stand, conversations that close now).
        Closed ones leave memory; ``final`` closes everything (SIGINT)."""
        now = self.clock()
        b = self.bounds
        with self.lock:
            closing = [t for t in self.open.values() if final
                       or now - t.last_seen >= b.idle_s
                       or (t.root_seen_at is not None and now - t.root_seen_at >= b.grace_s)]
            over = len(self.open) - len(closing) - b.max_open_traces
            if over > 0:  # the idlest close early: derived whole, nothing lost
                rest = sorted((t for t in self.open.values() if t not in closing),
                              key=lambda t: t.last_seen)
                closing += rest[:over]
            for t in closing:
                del self.open[t.key]
                self.held -= t.held
            # with many changing, an open one is derived at most every ``OPEN_EVERY_S`` (each
            # derivation rebuilds it from all its spans); with few, at every flush (a page
            # shows it live)
            dirty = [t for t in self.open.values() if t.dirty]
            if len(dirty) > BUSY:
                dirty = [t for t in dirty if t.reload or now - t.derived_at >= OPEN_EVERY_S]
            for t in dirty + closing:
                t.dirty = False
                t.derived_at = now
            return dirty, [t for t in closing if t.spans or t.logs or t.reload]

    def put_back(self, traces: list[tuple[OpenTrace, bool]]) -> None:
        """A derivation the store refused: derive these again at the next flush."""
        with self.lock:
            for t, closed in traces:
                t.dirty = True
                if closed and t.key not in self.open:
                    self.open[t.key] = t
                    self.held += t.held
                elif closed:  # reopened meanwhile: that one reads everything back
                    self.open[t.key].reload = self.open[t.key].dirty = True

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"open": len(self.open), "held_bytes": self.held}
