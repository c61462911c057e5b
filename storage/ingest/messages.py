"""Chat conversations with tool calls as trajectories: the ``messages`` import format, and the
turn rules Inspect logs (storage/ingest/inspect_log.py) share.

``--format messages`` reads JSONL, one conversation per line, from any agent framework::

    {"messages": [{"role": "system", "content": "You can call tools."},
                  {"role": "user", "content": "What is 2+3?"},
                  {"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
                   "type": "function",
                   "function": {"name": "add", "arguments": "{\\"x\\": 2, \\"y\\": 3}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "5"},
                  {"role": "assistant", "content": "5"}],
     "reward": 1.0, "task_id": "add-2-3", "group_id": "add-2-3@0"}

Optional besides ``messages``: ``reward`` (else 0.0, noted), ``task_id`` (else a hash of the
prompt), ``group_id`` (else ``{step}:{task_id}``), ``traj_id`` (else ``{file}:{byte offset of
the line}``, stable however the file is read, whole or followed in pieces), ``rewards``,
``success`` (else reward >= 1, noted), ``step``, ``split``, ``finish_reason`` and ``answer``
(else ``answered`` and the final assistant message's text, when the conversation ends on one),
``info``. A line may also be the bare array of messages. Other keys are kept under
``info.extra``.

Turns (the same for Inspect): the messages before the first assistant message (system, user) are
the prompt; each assistant message is one turn, its action the text (reasoning as ``<think>``)
then each tool call on its own line, ``name(arg=value, ...)``; the tool results and any other
messages up to the next assistant message are its observation, each as ``name -> result``. A turn
that calls tools has action type ``tool`` (so the failure rules see tool use), else ``answer``.
A call whose arguments are not valid JSON (OpenAI sends them as a string) or that the framework
says it could not parse makes the action invalid; a tool result marked as an error is the turn's
``error`` (``tool_error``: the marks frameworks write), so a failed last call is classed
``tool_error_unrecovered``. A result's text alone ("ERROR: ...") marks nothing: tools answer
in every form, and only the mark says the call failed. A content part other than text (an image) is shown as ``[image]``. The calls are also
kept as data in the turn's ``parsed``: ``{"tool_calls": [{"id", "function", "arguments"}]}``.
A conversation whose last assistant message is a marked refusal (OpenAI's ``refusal`` field,
shown in the text; Inspect's ``refusal`` content part) finishes ``refused``; a line's ``tools``
(the request's tool list) says whether any tool was offered (``info.tools_offered``), which the
failure rules read (storage/failures.py).
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from storage.ingest.registry import Format, Source, Unit, register
from storage.interchange import LineError, run_said
from storage.protocol import render_call

MAX_MESSAGES = 10_000
MAX_MESSAGE_CHARS = 4_000_000
MAX_TRAJECTORY_CHARS = 16 << 20
"""Characters of one conversation's messages in all (a generic JSONL line holds at most its
16 MiB; an Inspect sample's attachments could otherwise repeat one text thousands of times)."""
KNOWN_KEYS = {"messages", "reward", "task_id", "group_id", "traj_id", "rewards", "success", "step",
              "split", "finish_reason", "answer", "info"}


# -- one message, normalised ---------------------------------------------------------------------
def content_text(content: Any) -> str:
    """Text of a message's content: a string, or a list of parts (text, reasoning, media)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise LineError(f"content must be text or a list of parts, got {type(content).__name__}")
    out = []
    for part in content:
        if isinstance(part, str):
            out.append(part)
        elif not isinstance(part, dict):
            raise LineError(f"a content part must be an object, got {type(part).__name__}")
        elif part.get("type") == "reasoning":  # Inspect's reasoning blocks
            if part.get("redacted"):
                out.append("<think>[redacted]</think>\n")
            else:
                out.append(f"<think>{part.get('reasoning') or part.get('summary') or ''}</think>\n")
        elif isinstance(part.get("text"), str):
            out.append(part["text"])
        elif part.get("type") == "tool_result":  # Anthropic: the result's text, one level down
            inner = part.get("content")
            out.append(inner if isinstance(inner, str) else "".join(
                p["text"] for p in inner or () if isinstance(p, dict)
                and isinstance(p.get("text"), str)) if isinstance(inner, (list, type(None)))
                else "")
        else:
            out.append(f"[{part.get('type') or 'part'}]")
    return "".join(out)


def _openai_call(call: Any, where: str) -> dict:
    """OpenAI ``{"id", "type": "function", "function": {"name", "arguments": "<JSON text>"}}``."""
    if not isinstance(call, dict):
        raise LineError(f"{where} must be an object, got {type(call).__name__}")
    fn = call.get("function") if isinstance(call.get("function"), dict) else call
    name, raw = fn.get("name"), fn.get("arguments")
    if not isinstance(name, str):
        raise LineError(f"{where} has no function name")
    bad = None
    if isinstance(raw, str):
        try:
            args = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            bad = f"arguments of {name} are not valid JSON: {exc}"
            return {"id": call.get("id"), "name": name, "text": f"{name}({raw})", "bad": bad,
                    "arguments": raw}
    else:
        args = raw
    return {"id": call.get("id"), "name": name, "text": render_call(name, args), "bad": bad,
            "arguments": args}


def openai_message(m: Any, where: str) -> dict:
    """An OpenAI-style chat message, normalised (see ``turns_of``)."""
    if not isinstance(m, dict):
        raise LineError(f"{where} must be an object, got {type(m).__name__}")
    role = m.get("role")
    if not isinstance(role, str):
        raise LineError(f"{where} has no role")
    try:
        text = content_text(m.get("content"))
    except LineError as exc:
        raise LineError(f"{where}: {exc}") from None
    if isinstance(m.get("reasoning_content"), str) and m["reasoning_content"]:
        text = f"<think>{m['reasoning_content']}</think>\n{text}"
    refusal = m.get("refusal") if isinstance(m.get("refusal"), str) else ""
    if refusal:  # OpenAI's refusal field: the model declined, in these words
        text = "\n".join(filter(None, [text, refusal]))
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        raise LineError(f"{where}.tool_calls must be a list")
    if isinstance(m.get("function_call"), dict):  # the legacy single call
        calls = [*calls, {"function": m["function_call"]}]
    return {"role": role, "text": text, "name": m.get("name"), "call_id": m.get("tool_call_id"),
            "calls": [_openai_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)],
            "error": tool_error(m, text) if role != "assistant" else None,
            "refused": bool(refusal) or refused_in(m.get("content"))}


ERROR_CHARS = 500  # of a result's own text, when it is the only message a failed call left


def tool_error(m: dict, text: str) -> str | None:
    """Why a tool result failed, when the message is marked as failed, else None. The marks
    (docs/formats.md, "Tool errors"): our ``"error": "message"`` (also Inspect's ToolCallError
    ``{"type", "message"}``), LangChain's ``ToolMessage.status == "error"``, Anthropic's
    ``is_error: true`` on a ``tool_result`` (the message or one of its content parts) and MCP's
    ``isError: true``. With a bare mark, the result's own text is the reason."""
    error = m.get("error")
    if isinstance(error, dict):  # ToolCallError: a type (timeout, permission, ...) and a message
        kind = error.get("type")
        error = f"{'' if kind in (None, 'unknown') else f'{kind}: '}{error.get('message') or ''}" \
            or True  # a ToolCallError with nothing in it still says the call failed
    if isinstance(error, str) and error.strip():
        return error
    parts = m.get("content") if isinstance(m.get("content"), list) else []
    marked = error is True or m.get("status") == "error" or m.get("is_error") is True \
        or m.get("isError") is True or any(isinstance(p, dict) and (
            p.get("is_error") is True or p.get("isError") is True) for p in parts)
    return (text.strip()[:ERROR_CHARS] or "the tool reported an error") if marked else None


def refused_in(content: Any) -> bool:
    """Whether a message's content parts mark a refusal (Inspect's ``ContentText.refusal``)."""
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("refusal") is True
                                             for p in content)


def ended_refusing(messages: list[dict]) -> bool:
    """Whether the last assistant message of normalised ``messages`` is a marked refusal."""
    said = [m for m in messages if m["role"] == "assistant"]
    return bool(said) and bool(said[-1].get("refused"))


# -- a conversation as turns -----------------------------------------------------------------------
def turns_of(messages: list[dict]) -> tuple[str, list[dict]]:
    """(prompt, turns) of normalised messages ``{role, text, name, calls, error}`` (see above).
    LineError for a message of more than ``MAX_MESSAGE_CHARS`` or a conversation of more than
    ``MAX_TRAJECTORY_CHARS``."""
    prompt, turns, called, total, seen = [], [], {}, 0, []
    for i, m in enumerate(messages):
        size = len(m["text"]) + sum(len(c["text"]) for c in m["calls"])
        if size > MAX_MESSAGE_CHARS:
            raise LineError(f"message {i} ({m['role']}) holds {size} characters, over "
                            f"the limit of {MAX_MESSAGE_CHARS}")
        total += size
        if total > MAX_TRAJECTORY_CHARS:
            raise LineError(f"messages 0-{i} hold more than {MAX_TRAJECTORY_CHARS} characters, "
                            "the limit for one conversation")
        if m["role"] == "assistant":
            called.update({c["id"]: c["name"] for c in m["calls"] if isinstance(c.get("id"), str)})
            bad = [c["bad"] for c in m["calls"] if c["bad"]]
            parts = [m["text"]] * bool(m["text"]) + [c["text"] for c in m["calls"]]
            seen = []  # the observation's parts, joined once (not copied once per message)
            turn = {"action": "\n".join(parts), "observation": seen,
                    "action_type": "tool" if m["calls"] else "answer", "action_valid": not bad}
            if m["calls"]:  # the calls as data: Replay shows each as a call, name and arguments
                turn["parsed"] = {"tool_calls": [{"id": c.get("id"), "function": c["name"],
                                                  "arguments": c.get("arguments")}
                                                 for c in m["calls"]]}
            if bad:
                turn["action_type"], turn["error"] = "invalid", "; ".join(bad)
            turns.append(turn)
        elif not turns:
            prompt.append(f"{m['role']}: {m['text']}\n")
        elif m["role"] in ("tool", "function"):
            call_id = m.get("call_id")
            name = m.get("name") or (called.get(call_id) if isinstance(call_id, str) else None) \
                or "tool"
            shown = "\n".join(filter(None, [m["text"], m.get("error") and f"error: {m['error']}"]))
            seen.append(f"{name} -> {shown}\n")
            if m.get("error"):
                turns[-1]["error"] = "; ".join(filter(None, [turns[-1].get("error"), m["error"]]))
        else:  # a user message may carry tool results too (Anthropic's tool_result parts)
            seen.append(f"{m['role']}: {m['text']}\n")
            if m.get("error"):
                turns[-1]["error"] = "; ".join(filter(None, [turns[-1].get("error"), m["error"]]))
    for turn in turns:
        turn["observation"] = "".join(turn["observation"])
    return "".join(prompt), turns


def task_of(prompt: str) -> str:
    return "p" + hashlib.sha1(prompt.encode("utf-8", "replace")).hexdigest()[:12]


# -- the messages JSONL format ---------------------------------------------------------------------
def messages_record(obj: Any, default_id: str) -> dict:
    """A generic record (storage/interchange.py) of one conversation line, or LineError."""
    if isinstance(obj, list):
        obj = {"messages": obj}
    if not isinstance(obj, dict):
        raise LineError(f"line must be an object with 'messages' or an array of messages, got "
                        f"{type(obj).__name__}")
    msgs = obj.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise LineError("field 'messages' must be a non-empty list of messages")
    if len(msgs) > MAX_MESSAGES:
        raise LineError(f"{len(msgs)} messages, over the limit of {MAX_MESSAGES}")
    normal = [openai_message(m, f"messages[{i}]") for i, m in enumerate(msgs)]
    prompt, turns = turns_of(normal)
    notes = []
    rec = {k: obj[k] for k in KNOWN_KEYS - {"messages"} if obj.get(k) is not None}
    rec.update(prompt=prompt, turns=turns, traj_id=str(rec.get("traj_id", default_id)))
    rec["task_id"] = str(rec.get("task_id", task_of(prompt)))  # an integer id is an id too
    if "group_id" in rec:
        rec["group_id"] = str(rec["group_id"])
    last = turns[-1] if turns else None
    final = content_text(msgs[-1].get("content")) if msgs[-1].get("role") == "assistant" else ""
    if msgs[-1].get("role") == "assistant" and ended_refusing(normal):
        rec.setdefault("finish_reason", "refused")  # the model's refusal field, not a guess
    if last and last["action_type"] == "answer" and final.strip():
        rec.setdefault("finish_reason", "answered")  # it ended on its own words, no call pending
        rec.setdefault("answer", final)  # without the reasoning
    if "reward" not in rec:
        rec["reward"] = 0.0
        notes.append("no reward given: recorded as 0.0")
    if "success" not in rec and isinstance(rec["reward"], (int, float)) \
            and not isinstance(rec["reward"], bool):
        rec["success"] = rec["reward"] >= 1.0
        notes.append("success inferred as reward >= 1")
    if "info" in rec and not isinstance(rec["info"], dict):
        raise LineError(f"field 'info' must be an object, got {type(rec['info']).__name__}")
    info = dict(rec.get("info") or {})
    if isinstance(obj.get("tools"), list):  # the request's tool list: whether any was offered
        info["tools_offered"] = bool(obj["tools"])
    extra = {k: v for k, v in obj.items() if k not in KNOWN_KEYS}
    if extra:
        info["extra"] = extra
    if notes:
        info["import_notes"] = list(info.get("import_notes", [])) + notes
    if info:
        rec["info"] = info
    if run_said(obj):  # a request log names its model: the run says it, not "unknown"
        rec["run"] = run_said(obj)
    return rec


PIECE = re.compile(r"^(?P<name>.+)#(?P<start>\d+)-\d+$")


def _origin(path: Path) -> tuple[str, int]:
    """(file stem, byte offset of this file's first byte in it): a follower imports a file's
    new lines as a piece named ``{file}#{start}-{end}`` (storage/ingest/follow.py)."""
    match = PIECE.match(path.name)
    if match:
        return Path(match["name"]).stem, int(match["start"])
    return path.stem, 0


@register
class Messages(Format):
    """OpenAI-style conversations, one a line; followed a complete line at a time."""
    name = "messages"
    patterns = ("*.jsonl",)
    followed = "appended"
    rank = 60
    exported = "conversations"

    def detect(self, source: Path, first: Any) -> bool:
        return not source.is_dir() and (isinstance(first, list) or (
            isinstance(first, dict) and "messages" in first and "turns" not in first))

    def where(self, src: Source, unit: Unit) -> str:
        return f"{src.name}: line {unit.number}" if src.in_folder else f"line {unit.number}"

    def records(self, raw: Any, src: Source, unit: Unit) -> dict:
        stem, base = _origin(Path(src.name))
        return messages_record(raw, f"{stem}:{base + unit.at}")

    def export(self, db_path, run_id: str, out, filters) -> int:
        from storage.chat_export import write_messages  # the store's reader: only exporting
        return write_messages(db_path, run_id, out, filters)
