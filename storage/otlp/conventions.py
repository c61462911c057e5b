"""What the span conventions of agent frameworks say, read into one shape.

An LLM call (``Call``) is one turn: its input messages, its output (text and tool calls), model,
token counts, finish reason and latency. A tool execution (``ToolRun``) is part of the
observation that follows a turn. Read here:

* **OpenTelemetry GenAI** (``opentelemetry-instrumentation-openai-v2`` through util-genai):
  span ``chat {model}`` with ``gen_ai.operation.name``; in span mode the messages are JSON in
  ``gen_ai.input.messages`` / ``gen_ai.output.messages``, each ``{"role", "parts": [{"type":
  "text", "content"} | {"type": "tool_call", "id", "name", "arguments"} | {"type":
  "tool_call_response", "id", "response"}]}``; in event mode they come in a log record
  ``gen_ai.client.inference.operation.details`` of the span (``apply_event``). Tools: span
  ``execute_tool {name}`` (``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
  ``gen_ai.tool.call.arguments``, ``gen_ai.tool.call.result``).
* **OpenInference** (``openinference-instrumentation-openai``): ``openinference.span.kind`` LLM
  with ``llm.input_messages.{i}.message.{role,content,tool_call_id}``, ``...tool_calls.{j}.
  tool_call.{id,function.name,function.arguments}``, the same under ``llm.output_messages``,
  ``llm.token_count.{prompt,completion}``, ``llm.model_name``; kind TOOL spans (``tool.name``,
  ``input.value``, ``output.value``). A message's text may come as parts instead,
  ``message.contents.{k}.message_content.{type,text}`` (``openinference-instrumentation-
  smolagents``), whose messages also carry smolagents' roles ``tool-call`` / ``tool-response``
  (``smolagents_roles``); its AGENT and CHAIN (``Step N``) spans are neither calls nor tools.
* **rl-insight's agent-loop spans** (verl ``trainer.logger=["rl_insight"]``): each turn a root
  span ``gateway_generation`` (``traj``, ``turn``, ``content``, ``prompt_tokens``,
  ``completion_tokens``, ``finish_reason``); ``agent_task`` carries ``reward``, ``accuracy``,
  ``status``. Their spans share no trace: ``conversation_key`` groups them by identity keys.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

from storage.protocol import render_call

CONVERSATION_KEYS = ("gen_ai.conversation.id", "session.id")
RL_INSIGHT_SPANS = ("gateway_generation", "agent_task", "agent_session")
EVENT_DETAILS = "gen_ai.client.inference.operation.details"
GENAI_LLM_OPERATIONS = ("chat", "text_completion", "generate_content", "completion")


@dataclass
class Call:
    """One LLM call: a turn."""
    span_id: str
    start_ns: int
    end_ns: int
    convention: str
    inputs: list[dict] = field(default_factory=list)   # {role, text, calls, call_id, name}
    text: str = ""
    calls: list[dict] = field(default_factory=list)    # {id, name, arguments}
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    order: float = 0.0                                  # rl-insight's ``turn``, else start time


@dataclass
class ToolRun:
    """One tool execution span."""
    span_id: str
    start_ns: int
    end_ns: int
    name: str
    call_id: str | None
    result: str
    error: str | None = None
    arguments: Any = None


# -- small readers --------------------------------------------------------------------------------
def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value
    return value


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError, OverflowError):  # Infinity is a float, not a step
        return None


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _id(value: Any) -> str | None:
    """A tool-call id as text (ids are dictionary keys: a list or an object is not one)."""
    if value is None or isinstance(value, (str, int)) and not isinstance(value, bool):
        return None if value is None else str(value)
    return None


def _opt_text(value: Any) -> str | None:
    return None if value is None else _text(value)[:200]


def _float(value: Any) -> float | None:
    try:
        number = float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None
    return number if number is not None and number == number and abs(number) != float("inf") \
        else None


def render(call: dict) -> str:
    args = call.get("arguments")
    parsed = _json(args)
    if isinstance(parsed, dict):
        return render_call(call["name"], parsed)
    return f"{call['name']}({_text(args)})"


# -- GenAI messages (span mode JSON, or the event's structured value) ------------------------------
def genai_message(m: Any) -> dict | None:
    """A GenAI ``{"role", "parts"}`` message (or an OpenAI-shaped one) normalised."""
    if not isinstance(m, dict):
        return None
    role = str(m.get("role") or "user")
    texts, calls, call_id = [], [], None
    for part in _list(m.get("parts")):
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text":
            texts.append(_text(part.get("content")))
        elif kind == "reasoning":
            texts.append(f"<think>{_text(part.get('content'))}</think>\n")
        elif kind == "tool_call":
            calls.append({"id": _id(part.get("id")), "name": _text(part.get("name") or "tool"),
                          "arguments": part.get("arguments")})
        elif kind == "tool_call_response":
            call_id = _id(part.get("id"))
            texts.append(_text(part.get("response", part.get("result"))))
        else:
            texts.append(f"[{kind or 'part'}]")
    if "content" in m and not m.get("parts"):  # OpenAI-shaped
        texts.append(_text(m.get("content")))
        for c in _list(m.get("tool_calls")):
            fn = c.get("function") if isinstance(c, dict) else None
            if isinstance(fn, dict):
                calls.append({"id": _id(c.get("id")), "name": _text(fn.get("name") or "tool"),
                              "arguments": fn.get("arguments")})
        call_id = _id(m.get("tool_call_id"))
    return {"role": role, "text": "".join(texts), "calls": calls, "call_id": call_id,
            "name": _opt_text(m.get("name")), "finish_reason": _opt_text(m.get("finish_reason"))}


def genai_messages(value: Any) -> list[dict]:
    value = _json(value)
    if not isinstance(value, list):
        return []
    return [m for m in (genai_message(x) for x in value) if m]


def _set_output(call: Call, outputs: list[dict]) -> None:
    said = [m for m in outputs if m["role"] == "assistant"] or outputs
    if said:
        call.text = "".join(m["text"] for m in said)
        call.calls = [c for m in said for c in m["calls"]]
        call.finish_reason = call.finish_reason or said[-1].get("finish_reason")


# -- OpenInference's flattened messages ------------------------------------------------------------
_OI_KEY = re.compile(r"^llm\.(input|output)_messages\.(\d+)\.message\.(.+)$")
_OI_CALL = re.compile(r"^tool_calls\.(\d+)\.tool_call\.(.+)$")
_OI_PART = re.compile(r"^contents\.(\d+)\.message_content\.(.+)$")
_SMOL_RESPONSE = re.compile(r"^(?:Call id: (\S+)\n)?(?:Observation:\n)?")
SMOL_CALLS_MAX = 64 << 10
"""smolagents' ``Calling tools:`` text longer than this is kept as text, its calls not parsed."""


def _oi_text(m: dict) -> str:
    """``message.content``, else the ``message.contents`` parts in order (text parts' text,
    other parts as ``[type]``), as smolagents' instrumentor writes them."""
    if m.get("content") is not None or not m["parts"]:
        return _text(m.get("content"))
    return "".join(_text(p.get("text")) if p.get("type", "text") == "text"
                   else f"[{p.get('type')}]" for _, p in sorted(m["parts"].items()))


def _smolagents_calls(text: str) -> list[dict]:
    """The calls of smolagents' ``Calling tools:\n[{'id', 'type', 'function': {'name',
    'arguments'}}]`` (a Python literal); [] when it is not one."""
    body = text[len("Calling tools:"):].strip()
    if len(body) > SMOL_CALLS_MAX:
        return []
    try:
        value = ast.literal_eval(body)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return []
    calls = []
    for c in value if isinstance(value, list) else []:
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict):
            calls.append({"id": _id(c.get("id")), "name": _text(fn.get("name") or "tool"),
                          "arguments": fn.get("arguments")})
    return calls


def smolagents_roles(msgs: list[dict]) -> list[dict]:
    """smolagents' own roles read as chat roles: ``tool-call`` (the calls the previous assistant
    message made, ``Calling tools:\n[...]``) is an assistant message with those calls;
    ``tool-response`` (``[Call id: ID\n]Observation:\nRESULT``, one per step, or ``Call id: ID
    \nError:\n...``) is a tool message, its text what follows those prefixes, named by the step's
    calls."""
    calls: list[dict] = []
    for m in msgs:
        if m["role"] == "tool-call":
            m["role"] = "assistant"
            calls = m["calls"] = m["calls"] or (_smolagents_calls(m["text"])
                                                if m["text"].startswith("Calling tools:") else [])
        elif m["role"] == "tool-response":
            m["role"] = "tool"
            match = _SMOL_RESPONSE.match(m["text"])
            m["text"] = m["text"][match.end():]
            m["call_id"] = m["call_id"] or match.group(1)
            if calls:
                m["name"] = m["name"] or ", ".join(c["name"] for c in calls)
                m["call_id"] = m["call_id"] or (calls[0]["id"] if len(calls) == 1 else None)
            calls = []
    return msgs


def openinference_messages(attrs: dict) -> tuple[list[dict], list[dict]]:
    """(input, output) messages of an OpenInference LLM span's flattened attributes."""
    found: dict[str, dict[int, dict]] = {"input": {}, "output": {}}
    for key, value in attrs.items():
        match = _OI_KEY.match(key)
        if not match:
            continue
        side, index, rest = match.group(1), int(match.group(2)), match.group(3)
        msg = found[side].setdefault(index, {"calls": {}, "parts": {}})
        call, part = _OI_CALL.match(rest), _OI_PART.match(rest)
        if call:
            msg["calls"].setdefault(int(call.group(1)), {})[call.group(2)] = value
        elif part:
            msg["parts"].setdefault(int(part.group(1)), {})[part.group(2)] = value
        else:
            msg[rest] = value
    out = []
    for side in ("input", "output"):
        msgs = []
        for _, m in sorted(found[side].items()):
            calls = [{"id": _id(c.get("id")), "name": _text(c.get("function.name") or "tool"),
                      "arguments": c.get("function.arguments")}
                     for _, c in sorted(m["calls"].items())]
            msgs.append({"role": _text(m.get("role") or "user"), "text": _oi_text(m),
                         "calls": calls, "call_id": _id(m.get("tool_call_id")),
                         "name": _opt_text(m.get("name")),
                         "finish_reason": None})
        out.append(smolagents_roles(msgs))
    return out[0], out[1]


# -- spans -> calls and tool runs ------------------------------------------------------------------
def llm_call(span) -> Call | None:
    """The LLM call a span records, by whichever convention it follows; None if it is not one."""
    a = span.attributes
    if a.get("openinference.span.kind") == "LLM":
        call = Call(span.span_id, span.start_ns, span.end_ns, "openinference",
                    model=_opt_text(a.get("llm.model_name")),
                    input_tokens=_int(a.get("llm.token_count.prompt")),
                    output_tokens=_int(a.get("llm.token_count.completion")),
                    finish_reason=_opt_text(a.get("llm.finish_reason")))
        call.inputs, outputs = openinference_messages(a)
        if not outputs and a.get("output.value") is not None:
            outputs = [{"role": "assistant", "text": _text(a["output.value"]), "calls": []}]
        _set_output(call, outputs)
        call.order = span.start_ns
        return call
    if a.get("gen_ai.operation.name") in GENAI_LLM_OPERATIONS:
        reasons = a.get("gen_ai.response.finish_reasons")
        call = Call(span.span_id, span.start_ns, span.end_ns, "genai",
                    model=_opt_text(a.get("gen_ai.response.model")
                                    or a.get("gen_ai.request.model")),
                    input_tokens=_int(a.get("gen_ai.usage.input_tokens")),
                    output_tokens=_int(a.get("gen_ai.usage.output_tokens")),
                    finish_reason=_opt_text(reasons[-1]) if isinstance(reasons, list)
                    and reasons else None)
        call.inputs = genai_messages(a.get("gen_ai.input.messages"))
        _set_output(call, genai_messages(a.get("gen_ai.output.messages")))
        call.order = span.start_ns
        return call
    if span.name == "gateway_generation":
        call = Call(span.span_id, span.start_ns, span.end_ns, "rl-insight",
                    text=_text(a.get("content")), model=_opt_text(a.get("model")),
                    input_tokens=_int(a.get("prompt_tokens")),
                    output_tokens=_int(a.get("completion_tokens")),
                    finish_reason=_opt_text(a.get("finish_reason")))
        turn = _int(a.get("turn"))
        call.order = turn if turn is not None else span.start_ns
        return call
    return None


def apply_event(call: Call, log) -> None:
    """Fill a call's messages from its event-mode log record (GenAI ``operation.details``, or the
    older per-message events ``gen_ai.choice`` / ``gen_ai.*.message``)."""
    values = {**(log.body if isinstance(log.body, dict) else {}), **log.attributes}
    if log.event_name == EVENT_DETAILS or "gen_ai.input.messages" in values:
        if not call.inputs:
            call.inputs = genai_messages(values.get("gen_ai.input.messages"))
        if not call.text and not call.calls:
            _set_output(call, genai_messages(values.get("gen_ai.output.messages")))
    elif log.event_name == "gen_ai.choice" and isinstance(log.body, dict):
        message = genai_message(log.body.get("message") or {})
        if message and not call.text and not call.calls:
            call.text, call.calls = message["text"], message["calls"]
            call.finish_reason = call.finish_reason or _opt_text(log.body.get("finish_reason"))
    elif log.event_name.startswith("gen_ai.") and log.event_name.endswith(".message"):
        message = genai_message({"role": log.event_name.split(".")[1],
                                 **(log.body if isinstance(log.body, dict) else {})})
        if message:
            call.inputs.append(message)


def tool_run(span) -> ToolRun | None:
    a = span.attributes
    if a.get("gen_ai.operation.name") == "execute_tool":
        return ToolRun(span.span_id, span.start_ns, span.end_ns,
                       _text(a.get("gen_ai.tool.name") or span.name),
                       _id(a.get("gen_ai.tool.call.id")),
                       _text(a.get("gen_ai.tool.call.result")),
                       span.status_message or None if span.status_code == 2 else None,
                       a.get("gen_ai.tool.call.arguments"))
    if a.get("openinference.span.kind") == "TOOL":
        return ToolRun(span.span_id, span.start_ns, span.end_ns,
                       _text(a.get("tool.name") or span.name), _id(a.get("tool_call.id")),
                       _text(a.get("output.value")),
                       span.status_message or None if span.status_code == 2 else None,
                       a.get("input.value"))
    return None


# -- what a trace says about the whole trajectory -------------------------------------------------
AGENTRL = {"agentrl.reward": _float, "agentrl.success": lambda v: v if isinstance(v, bool) else None,
           "agentrl.task_id": lambda v: str(v) if v not in (None, "") else None,
           "agentrl.group_id": lambda v: str(v) if v not in (None, "") else None,
           "agentrl.split": lambda v: str(v) if v not in (None, "") else None,
           "agentrl.step": _int,
           "agentrl.prompt": lambda v: v if isinstance(v, str) else None}
REWARD_PREFIX = "rl.reward."
"""``rl.reward.<component>`` (float): one reward component each (export --format otlp writes
them on the root); read like ``agentrl.*``, the root's value winning."""


IDENTITY = ("agentrl.task_id", "agentrl.group_id", "agentrl.split", "agentrl.step")
"""The facts an agent knows when it starts, so that they can arrive with its first span, not
only on the root span that ends last: on every span (storage/otlp/carry.py copies them from the
parent span or the baggage onto each span as it starts), or on the resource of an agent
process that runs one trajectory."""


def trace_facts(spans: list) -> dict:
    """reward, success, task_id, group_id, split, step read from a trace's spans: the
    ``agentrl.*`` attributes (on any span, a root's value winning over any other span's; the
    IDENTITY ones also on a span's resource, any span's attribute winning), rl-insight's
    ``agent_task`` (``reward``, ``accuracy``) and identity keys, Agent Lightning 0.3's
    ``agentlightning.reward.0.value`` (the last one wins). ``source`` says where the reward
    came from."""
    facts: dict = {}
    ordered = sorted(spans, key=lambda s: (s.parent_span_id == "", s.end_ns))  # roots last
    for s in ordered:
        a = s.attributes
        if s.name == "agent_task" and _float(a.get("reward")) is not None:
            facts["reward"], facts["source"] = _float(a["reward"]), "rl-insight agent_task.reward"
            if _float(a.get("accuracy")) is not None:
                facts["success"] = _float(a["accuracy"]) >= 1.0
        if _float(a.get("agentlightning.reward.0.value")) is not None:
            facts["reward"] = _float(a["agentlightning.reward.0.value"])
            facts["source"] = "agentlightning.reward.0.value"
        if s.name in RL_INSIGHT_SPANS:
            if a.get("sample") not in (None, "") and "task_id" not in facts:
                facts["task_id"] = str(a["sample"])
            if _int(a.get("global_steps")) is not None:
                facts["step"] = _int(a["global_steps"])
    for s in ordered:
        for key, read in AGENTRL.items():
            value = read(s.attributes.get(key)) if key in s.attributes else None
            if value is not None:
                facts[key.split(".", 1)[1]] = value
                if key == "agentrl.reward":
                    facts["source"] = "agentrl.reward"
        for key, value in s.attributes.items():
            if key.startswith(REWARD_PREFIX) and _float(value) is not None:
                facts.setdefault("rewards", {})[key[len(REWARD_PREFIX):][:64]] = _float(value)
    for resource in {id(s.resource): s.resource for s in spans}.values():
        for key in IDENTITY:
            value = AGENTRL[key](_resource_id(resource.get(key))) \
                if isinstance(resource, dict) else None
            if value is not None:
                facts.setdefault(key.split(".", 1)[1], value)
    return facts


MAX_RESOURCE_ID_CHARS = 256
"""The longest resource identity read (storage/interchange.py ``MAX_ID_CHARS``)."""


def _resource_id(value: Any) -> Any:
    """A resource's identity value if it can name something (text of at most
    ``MAX_RESOURCE_ID_CHARS``, a number), else None: a resource is shared by every trajectory
    of its process, and one unusable value (a long text, a list) failed them all, where the
    trajectories are then named as without it (by their spans or their prompt)."""
    if isinstance(value, str):
        return value if len(value) <= MAX_RESOURCE_ID_CHARS else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def conversation_key(span) -> str | None:
    """The conversation a span belongs to when a framework spreads one over several traces:
    ``gen_ai.conversation.id`` / ``session.id``, or rl-insight's identity keys."""
    a = span.attributes
    for key in CONVERSATION_KEYS:
        if a.get(key) not in (None, ""):
            return f"conv:{_text(a[key])[:200]}"
    if span.name in RL_INSIGHT_SPANS and any(a.get(k) not in (None, "")
                                             for k in ("session", "traj")):
        parts = [a.get(k) for k in ("experiment_name", "global_steps", "sample", "session", "traj")]
        if a.get("session") not in (None, ""):
            parts = [a.get("experiment_name"), a.get("session")]
        return "rl:" + "/".join(_text(p) for p in parts)[:200]
    return None
