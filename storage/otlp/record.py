"""One conversation's spans -> a generic trajectory record (storage/interchange.py).

Each LLM span, in time order (rl-insight: by its ``turn``), is a turn: its action the output text
then each tool call as ``name(arg=value)`` (when the span does not carry its calls, the tool
spans that ran before the next call, whatever their convention: a tool turn); its observation
what the next call was given after the last assistant message (tool results, as ``name ->
result``), else the tool spans that ran between the two calls. Model, token counts, finish
reason and latency go to the turn's ``info`` (a field of the trajectory model's turn); reward, success, task, group, split and step to
the trajectory (conventions.py ``trace_facts``). Used by the deriver (storage/otlp/writer.py) and
``agentrl otlp-scores`` alike.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from storage.ingest.messages import task_of
from storage.otlp.conventions import (Call, ToolRun, apply_event, llm_call, render, tool_run,
                                      trace_facts)

if TYPE_CHECKING:
    from storage.otlp.assemble import OpenTrace


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


def build_record(t: OpenTrace, closed: bool, given: dict | None = None) -> dict:
    """The generic record of a conversation as it stands (validated by the caller); each turn's
    ``info`` holds its span, convention, model, token counts and finish reason. ``given``: facts
    that win over what the spans say (a scores file's reward, success, task and ``source``); a
    None there unsays the spans' fact (success is then inferred from the reward)."""
    spans = list(t.spans.values())
    calls = sorted(filter(None, (llm_call(s) for s in spans)), key=lambda c: (c.order, c.start_ns))
    by_span = {c.span_id: c for c in calls}
    for log in t.logs:
        if log.span_id in by_span:
            apply_event(by_span[log.span_id], log)
    tools = sorted(filter(None, (tool_run(s) for s in spans)), key=lambda r: r.start_ns)
    names = {c["id"]: c["name"] for call in calls for c in call.calls if c.get("id")}
    names.update({r.call_id: r.name for r in tools if r.call_id})
    turns = []
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
        # a call whose span does not carry its tool calls (message content not captured, a
        # convention without them) made the calls of the tool spans that ran after it
        made = call.calls or [{"id": r.call_id, "name": r.name, "arguments": r.arguments}
                              for r in ran]
        # the text of a call without calls of its own already says them (smolagents' JSON)
        parts = [call.text] * bool(call.text) + [render(c) for c in call.calls
                                                 or ([] if call.text else made)]
        turn = {"action": "\n".join(parts), "observation": observation,
                "action_type": "tool" if made else "answer", "action_valid": True,
                "latency_s": max(call.end_ns - call.start_ns, 0) / 1e9}
        if made:
            turn["parsed"] = {"tool_calls": [{"id": c.get("id"), "function": c["name"],
                                              "arguments": c.get("arguments")}
                                             for c in made]}
        if errors:
            turn["error"] = "; ".join(errors)[:4000]
        turn["info"] = {"span_id": call.span_id, "convention": call.convention,
                        "model": call.model, "input_tokens": call.input_tokens,
                        "output_tokens": call.output_tokens, "finish_reason": call.finish_reason}
        turns.append(turn)
    facts = trace_facts(spans)
    if given:
        facts.update(given)
        facts = {k: v for k, v in facts.items() if v is not None}
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
    models = [c.model for c in calls if c.model]
    rec["run"] = {"env": "otel", "model": models[0] if models else "unknown", "algo": "none"}
    return rec
