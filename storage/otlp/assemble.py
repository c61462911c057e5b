"""Spans -> trajectories, while the agent runs.

One trace is one trajectory, unless its spans name a conversation (``gen_ai.conversation.id``,
``session.id``, rl-insight's identity keys: storage/otlp/conventions.py ``conversation_key``),
which then gathers every trace that names it. Each LLM span, in time order (rl-insight: by its
``turn``), is a turn: its action the output text then each tool call as ``name(arg=value)``;
its observation what the next call was given after the last assistant message (tool results,
as ``name -> result``), else the tool spans that ran between the two calls. Model, token counts,
finish reason and latency go to the turn's ``info``; reward, success, task, group, split and
step to the trajectory (conventions.py ``trace_facts``).

``Assembler`` holds the open conversations (``OpenTrace``). Spans arrive out of order and across
requests: a conversation is *dirty* when something arrived since it was last written, and the
writer (storage/otlp/writer.py) writes each dirty one every ``flush_s`` as it stands (the page
shows a running agent's trajectory); it *closes* ``grace_s`` after its root span arrived (a root
is exported when it ends) or after ``idle_s`` with nothing new, and is then written one last time
and dropped from memory. A span that arrives after that reopens it: its stored spans are read
back (``OpenTrace.reload``) and the trajectory is assembled again from all of them.

Bounds (``Bounds``): spans per conversation (past it the span is rejected, naming the trace),
open conversations (past it the one idle longest is closed early: written, nothing lost) and
bytes held in all (past it the request is refused with 429 until the writer catches up).
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from storage.otlp.conventions import (Call, ToolRun, apply_event, conversation_key, llm_call,
                                      render, tool_run, trace_facts)
from storage.ingest.messages import task_of
from storage.otlp.decode import LogRecord, Span


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
    new_spans: list[Span] = field(default_factory=list)
    new_logs: list[LogRecord] = field(default_factory=list)
    last_seen: float = 0.0
    root_seen_at: float | None = None
    held: int = 0
    dirty: bool = True
    reload: bool = False


def span_bytes(s: Span) -> int:
    """About what a span costs held (its attribute text and the objects around it)."""
    return 600 + len(s.name) + sum(len(k) + len(v) if isinstance(v, str) else len(k) + 16
                                   for k, v in s.attributes.items())


def run_id_for(resource: dict, fixed: str | None) -> str:
    """``fixed``, else ``otlp-{service.name}`` (one run per instrumented service)."""
    if fixed:
        return fixed
    name = str(resource.get("service.name") or "unknown")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:60] or "unknown"
    return f"otlp-{slug}"


class Assembler:
    """The open conversations; thread-safe (receiver threads add, the writer takes)."""

    def __init__(self, bounds: Bounds = Bounds(), run_id: str | None = None,
                 clock=time.monotonic):
        self.bounds, self.fixed_run, self.clock = bounds, run_id, clock
        self.open: dict[str, OpenTrace] = {}
        self.trace_key: dict[str, str] = {}       # trace id -> conversation key (bounded below)
        self.closed: dict[str, tuple[str, str]] = {}  # key -> (run id, traj id) of closed ones
        self.held = 0
        self.lock = threading.Lock()

    # -- receiving ---------------------------------------------------------------------------
    def over_memory(self) -> bool:
        return self.held > self.bounds.max_held_bytes

    def add(self, spans: list[Span], logs: list[LogRecord]) -> list[str]:
        """Take a request's records; returns why each refused span was refused."""
        refused: dict[str, int] = {}
        now = self.clock()
        with self.lock:
            for s in spans:
                conv = conversation_key(s)
                key = conv or self.trace_key.get(s.trace_id) or f"trace:{s.trace_id}"
                if conv:
                    self._merge(f"trace:{s.trace_id}", conv)
                self._remember(s.trace_id, key)
                t = self._get(key, s.trace_id, s.resource, now)
                if s.span_id in t.spans:
                    continue  # a retried export: already held
                if len(t.spans) >= self.bounds.max_spans_per_trace:
                    refused[s.trace_id] = refused.get(s.trace_id, 0) + 1
                    continue
                t.spans[s.span_id] = s
                t.new_spans.append(s)
                size = span_bytes(s)
                t.held += size
                self.held += size
                t.last_seen, t.dirty = now, True
                if not s.parent_span_id and not conv:
                    t.root_seen_at = now
            for log in logs:
                key = self.trace_key.get(log.trace_id) or f"trace:{log.trace_id}"
                t = self._get(key, log.trace_id, log.resource, now)
                t.logs.append(log)
                t.new_logs.append(log)
                size = 600 + len(str(log.body)) + sum(len(str(v)) for v in log.attributes.values())
                t.held += size
                self.held += size
                t.last_seen, t.dirty = now, True
        return [f"trace {tid}: {n} span(s) over the limit of {self.bounds.max_spans_per_trace} "
                "spans per trajectory" for tid, n in refused.items() for _ in range(n)]

    def _remember(self, trace_id: str, key: str) -> None:
        self.trace_key[trace_id] = key
        if len(self.trace_key) > 4 * self.bounds.max_open_traces + 10_000:
            for old in list(self.trace_key)[: len(self.trace_key) // 2]:
                if self.trace_key[old] not in self.open:
                    del self.trace_key[old]

    def _get(self, key: str, trace_id: str, resource: dict, now: float) -> OpenTrace:
        t = self.open.get(key)
        if t is None:
            run_id, traj_id = self.closed.pop(key, (None, None))
            t = OpenTrace(key, run_id or run_id_for(resource, self.fixed_run),
                          traj_id or (trace_id if key.startswith("trace:") else key),
                          last_seen=now, reload=run_id is not None)
            self.open[key] = t
        return t

    def _merge(self, trace_key: str, conv: str) -> None:
        """Spans first held under their trace join the conversation a later span names."""
        early = self.open.pop(trace_key, None)
        if early is None:
            return
        into = self.open.setdefault(conv, OpenTrace(conv, early.run_id, conv,
                                                    last_seen=early.last_seen))
        into.spans.update(early.spans)
        into.logs += early.logs
        into.new_spans += early.new_spans
        into.new_logs += early.new_logs
        into.held += early.held
        into.dirty = True

    # -- writing -----------------------------------------------------------------------------
    def take(self, final: bool = False) -> tuple[list[OpenTrace], list[OpenTrace]]:
        """(dirty open conversations to write as they stand, conversations that close now).
        Closed ones leave memory; ``final`` closes everything (SIGINT)."""
        now = self.clock()
        b = self.bounds
        with self.lock:
            closing = [t for t in self.open.values() if final
                       or now - t.last_seen >= b.idle_s
                       or (t.root_seen_at is not None and now - t.root_seen_at >= b.grace_s)]
            over = len(self.open) - len(closing) - b.max_open_traces
            if over > 0:  # the idlest close early: written whole, nothing lost
                rest = sorted((t for t in self.open.values() if t not in closing),
                              key=lambda t: t.last_seen)
                closing += rest[:over]
            for t in closing:
                del self.open[t.key]
                self.closed[t.key] = (t.run_id, t.traj_id)
                self.held -= t.held
            if len(self.closed) > 100_000:
                for old in list(self.closed)[:50_000]:
                    del self.closed[old]
            dirty = [t for t in self.open.values() if t.dirty]
            for t in dirty + closing:
                t.dirty = False
            return dirty, closing

    @staticmethod
    def drain_new(t: OpenTrace) -> tuple[list[Span], list[LogRecord]]:
        spans, logs = t.new_spans, t.new_logs
        t.new_spans, t.new_logs = [], []
        return spans, logs

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"open": len(self.open), "held_bytes": self.held}


# -- one conversation -> a generic trajectory record (storage/interchange.py) -----------------------
def _prompt(first: Call | None) -> str:
    if first is None:
        return ""
    lines = []
    for m in first.inputs:
        if m["role"] == "assistant":
            break
        lines.append(f"{m['role']}: {m['text']}\n")
    return "".join(lines)


def _seen_after_last_assistant(call: Call, names: dict[str, str]) -> str:
    last = max((i for i, m in enumerate(call.inputs) if m["role"] == "assistant"), default=None)
    if last is None:
        return ""
    out = []
    for m in call.inputs[last + 1:]:
        if m["role"] in ("tool", "function"):
            out.append(f"{m.get('name') or names.get(m.get('call_id')) or 'tool'} -> {m['text']}\n")
        else:
            out.append(f"{m['role']}: {m['text']}\n")
    return "".join(out)


def _tools_between(tools: list[ToolRun], start: int, end: int | None) -> list[ToolRun]:
    return [r for r in tools if r.start_ns >= start and (end is None or r.start_ns < end)]


def build_record(t: OpenTrace, closed: bool) -> dict:
    """The generic record of a conversation as it stands (validated by the caller), plus
    ``_turn_info`` (per turn: model, tokens, finish reason, span) for the turns' ``info``."""
    spans = list(t.spans.values())
    calls = sorted(filter(None, (llm_call(s) for s in spans)), key=lambda c: (c.order, c.start_ns))
    by_span = {c.span_id: c for c in calls}
    for log in t.logs:
        if log.span_id in by_span:
            apply_event(by_span[log.span_id], log)
    tools = sorted(filter(None, (tool_run(s) for s in spans)), key=lambda r: r.start_ns)
    names = {c["id"]: c["name"] for call in calls for c in call.calls if c.get("id")}
    names.update({r.call_id: r.name for r in tools if r.call_id})
    turns, turn_info = [], []
    for i, call in enumerate(calls):
        nxt = calls[i + 1] if i + 1 < len(calls) else None
        observation = _seen_after_last_assistant(nxt, names) if nxt else ""
        ran = _tools_between(tools, call.start_ns, nxt.start_ns if nxt else None)
        exact = t.spans[call.span_id].attributes.get("agentrl.observation") \
            if call.span_id in t.spans else None
        if isinstance(exact, str):  # the environment's own text (export --format otlp)
            observation = exact
        elif not observation and ran:
            observation = "".join(f"{r.name} -> {r.result}\n" for r in ran)
        errors = [f"{r.name}: {r.error}" for r in ran if r.error]
        parts = [call.text] * bool(call.text) + [render(c) for c in call.calls]
        turn = {"action": "\n".join(parts), "observation": observation,
                "action_type": "tool" if call.calls else "answer", "action_valid": True,
                "latency_s": max(call.end_ns - call.start_ns, 0) / 1e9}
        if call.calls:
            turn["parsed"] = {"tool_calls": [{"id": c.get("id"), "function": c["name"],
                                              "arguments": c.get("arguments")}
                                             for c in call.calls]}
        if errors:
            turn["error"] = "; ".join(errors)[:4000]
        turns.append(turn)
        turn_info.append({"span_id": call.span_id, "convention": call.convention,
                          "model": call.model, "input_tokens": call.input_tokens,
                          "output_tokens": call.output_tokens,
                          "finish_reason": call.finish_reason})
    facts = trace_facts(spans)
    notes = []
    prompt = facts.get("prompt") or _prompt(calls[0] if calls else None)
    rec: dict[str, Any] = {"traj_id": t.traj_id, "prompt": prompt, "turns": turns,
                           "step": facts.get("step", 0), "split": facts.get("split", "train")}
    rec["task_id"] = facts.get("task_id") or task_of(prompt)
    if "group_id" in facts:
        rec["group_id"] = facts["group_id"]
    if "reward" in facts:
        rec["reward"] = facts["reward"]
        rec["success"] = facts.get("success", facts["reward"] >= 1.0)
        if "success" not in facts:
            notes.append("success inferred as reward >= 1")
    else:
        rec["reward"] = 0.0
        notes.append("no reward in the trace (agentrl.reward, agent_task.reward, "
                     "agentlightning.reward.0.value) or a scores file: recorded as 0.0")
    if "success" in facts:
        rec["success"] = facts["success"]
    if facts.get("rewards"):
        rec["rewards"] = facts["rewards"]
    if any(s.status_code == 2 for s in spans):
        rec["finish_reason"] = "error"
    elif closed and turns and turns[-1]["action_type"] == "answer" and calls[-1].text.strip():
        rec["finish_reason"], rec["answer"] = "answered", calls[-1].text
    trace_ids = sorted({s.trace_id for s in spans})
    resource = spans[0].resource if spans else {}
    rec["info"] = {"otel": {
        "key": t.key, "trace_ids": trace_ids[:100], "spans": len(spans), "log_records": len(t.logs),
        "open": not closed, "service": resource.get("service.name"),
        "conventions": sorted({c.convention for c in calls}),
        "reward_source": facts.get("source"),
        "orphans": sorted({s.parent_span_id for s in spans if s.parent_span_id
                           and s.parent_span_id not in t.spans})[:20]}}
    if notes:
        rec["info"]["import_notes"] = notes
    rec["_turn_info"] = turn_info
    models = [c.model for c in calls if c.model]
    rec["run"] = {"env": "otel", "model": models[0] if models else "unknown", "algo": "none"}
    return rec
