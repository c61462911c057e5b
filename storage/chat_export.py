"""Trajectories out as a chat dataset with tool calls: ``export --format messages``.

One JSON line per trajectory, in the OpenAI chat form that TRL's ``SFTTrainer`` loads as it is
(a conversational language-modelling dataset: ``messages``, and ``tools`` handed to the chat
template)::

    {"messages": [{"role": "user", "content": "Question: Which river flows through Sagravek?"},
                  {"role": "assistant", "content": "<think>...</think>", "tool_calls": [
                      {"id": "call_0", "type": "function",
                       "function": {"name": "search", "arguments": "{\\"query\\": \\"...\\"}"}}]},
                  {"role": "tool", "tool_call_id": "call_0", "name": "search",
                   "content": "<information>...</information>"},
                  {"role": "assistant", "content": "<answer>Biajis River</answer>"}],
     "tools": [{"type": "function", "function": {"name": "search", ...}}],
     "traj_id": "...", "task_id": "...", "step": 30, "split": "train", "reward": 1.0,
     "success": true}

How a turn becomes messages, read from what the environment parsed (``turns.parsed``):

* a tool call -- the search env's ``<search>q</search>`` (``search(query=q)``), the apps env's
  ``<tool>{"name", "arguments"}</tool>`` and ``<code>`` (``code(code=...)``), an imported
  conversation's calls (``parsed.tool_calls``) -- is an assistant message with ``tool_calls``
  (``arguments`` a JSON string, as OpenAI sends them) and its text without the call as
  ``content``; the observation is the ``tool`` message answering the first call (an imported
  turn's ``name -> result`` parts, one per call, are split back into one message each); a failed
  call's message carries our ``"error"`` mark (storage/ingest/messages.py reads it back);
* any other turn is a plain assistant message, and its observation, if any, a ``user`` message.

Observations are the environment's text with the chat template's markers the trainer kept around
them (ChatML ``<|im_end|>``/``<|im_start|>user``) taken off. The prompt is one ``user`` message,
or, for a run imported from chat messages (``role: text`` lines), those messages again. For any
other run (trained here, or imported with tokens) the ``system`` message the policy saw comes
first: it is not a column, so it is read back from the trajectory's prompt tokens (the context
as the chat template rendered it) in the templates ``SYSTEM_TURNS`` knows -- ChatML (SmolLM2,
Qwen), Llama 3, Phi-3/Zephyr, Llama 2/Mistral ``<<SYS>>`` -- a chat template's default system
prompt included (SmolLM2's when the environment gives none); another template gives none.
``tools``: the conversation's own list when it was imported with one (``info.extra.tools``),
else one schema per function it calls (the search env's documented; others with the argument
names seen), else left out (whether a tool was offered is not known; the failure rules read
it). Importing the file with ``--format messages`` gives back the conversations of an imported
run turn for turn, failure classes included (``tests/test_chat_export.py``); the metadata keys
(traj_id, task_id, step, split, reward, success) are ones that importer reads.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Iterator

from storage import db
from storage.export import Filters, selected_ids
from storage.protocol import render_call
from storage.recorder import from_json
from storage.trajectory import select

SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search the knowledge base; returns the top documents.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                   "required": ["query"]}}}
TAG = {"search": re.compile(r"<search>.*?</search>", re.DOTALL),
       "tool": re.compile(r"<tool>.*?</tool>", re.DOTALL),
       "code": re.compile(r"<code>(.*?)</code>", re.DOTALL)}
CHAT_MARKERS_START = re.compile(r"^\s*(?:<\|im_end\|>\s*)?(?:<\|im_start\|>(\w+)\n)?")
CHAT_MARKERS_END = re.compile(r"(?:<\|im_end\|>\s*)?(?:<\|im_start\|>assistant\n?)?\s*$")
PROMPT_ROLE = re.compile(r"^(system|developer|user): ", re.MULTILINE)
CHAT_SOURCES = ("import:messages", "import:inspect", "otlp")
LINE_KEYS = ("traj_id", "task_id", "step", "split", "reward", "success")
"""The trajectory's fields a line carries beside its messages (the messages importer reads
them)."""
SYSTEM_TURNS = (re.compile(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", re.DOTALL),
                re.compile(r"<\|start_header_id\|>system<\|end_header_id\|>\n\n(.*?)<\|eot_id\|>",
                           re.DOTALL),
                re.compile(r"<\|system\|>\n(.*?)(?:<\|end\|>|</s>)", re.DOTALL),
                re.compile(r"<<SYS>>\n(.*?)\n<</SYS>>", re.DOTALL))
"""The system turn of a rendered prompt, per chat template family (module docstring)."""
JSON_TYPES = {str: "string", bool: "boolean", int: "integer", float: "number", list: "array",
              dict: "object"}


# -- one trajectory ------------------------------------------------------------------------------
def _calls(turn: dict) -> list[dict]:
    """The turn's tool calls ``{"name", "arguments"}``, read from what the env parsed."""
    parsed, kind, action = from_json(turn.get("parsed")) or {}, turn.get("action_type"), \
        turn.get("action") or ""
    if not isinstance(parsed, dict):
        return []
    if isinstance(parsed.get("tool_calls"), list):  # an imported conversation's
        return [{"id": c.get("id"), "name": str(c.get("function")),
                 "arguments": c.get("arguments")} for c in parsed["tool_calls"]
                if isinstance(c, dict) and c.get("function")]
    if kind == "search" and isinstance(parsed.get("query"), str) and TAG["search"].search(action):
        return [{"name": "search", "arguments": {"query": parsed["query"]}}]
    if isinstance(parsed.get("name"), str) and TAG["tool"].search(action):  # apps: tool, docs
        return [{"name": parsed["name"], "arguments": parsed.get("arguments") or {}}]
    if kind == "code" and isinstance(parsed.get("code"), str) and TAG["code"].search(action):
        return [{"name": "code", "arguments": {"code": parsed["code"]}}]
    return []


def _text_without_calls(action: str, calls: list[dict], imported: bool) -> str:
    """The action's own words: an env's tag element taken out, or an import's rendered calls."""
    if imported:
        rendered = "\n".join(render_call(c["name"], c["arguments"]) for c in calls)
        if action.endswith(rendered):
            return action[:len(action) - len(rendered)].removesuffix("\n")
        return action
    for tag in TAG.values():
        action = tag.sub("", action, count=1) if tag.search(action) else action
    return action.strip()


def _observation(text: str) -> tuple[str, str]:
    """(role, text) of an observation without the chat markers the trainer kept around it."""
    start = CHAT_MARKERS_START.match(text)
    role = start.group(1) if start and start.group(1) in ("user", "tool", "system") else "user"
    body = text[start.end():] if start else text
    return role, CHAT_MARKERS_END.sub("", body).strip("\n")


def _results(observation: str, calls: list[dict], imported: bool) -> list[str]:
    """One result per call: an import's ``name -> result`` parts split back, else the whole
    observation for the first call (and empty ones after it)."""
    if imported and calls:
        out, rest = [], observation
        for i, c in enumerate(calls):
            head = f"{c['name']} -> "
            if not rest.startswith(head):
                break
            rest = rest[len(head):]
            nxt = f"\n{calls[i + 1]['name']} -> " if i + 1 < len(calls) else None
            cut = rest.find(nxt) + 1 if nxt and nxt in rest else len(rest)
            out.append(rest[:cut].removesuffix("\n"))
            rest = rest[cut:]
        if len(out) == len(calls) and not rest:
            return out
    _, text = _observation(observation)
    return [text] + [""] * (len(calls) - 1)


ERROR_LINE = re.compile(r"(?:^|\n)error: (.*)\Z", re.DOTALL)


def _errors(results: list[str], error: str | None, imported: bool) -> list[tuple[str, str | None]]:
    """(result, error) per call, the failure marked with our ``"error"`` key (docs/formats.md,
    Tool errors), so an import of the file classes it as the store did. An import showed a
    marked result's error after its text (``error: why``): taken back out of the text. An env's
    error (an apps endpoint's, invalid JSON) stays beside the observation, on the first call."""
    if not error:
        return [(r, None) for r in results]
    if not imported:
        return [(r, error if k == 0 else None) for k, r in enumerate(results)]
    out = []
    for r in results:
        found = ERROR_LINE.search(r)
        if found and found.group(1) in error:
            out.append((r[:found.start()], found.group(1)))
        else:
            out.append((r, None))
    return out


def _prompt_messages(prompt: str, chat: bool) -> list[dict]:
    """The prompt as messages: ``role: text`` lines of an imported conversation, else one user
    message."""
    if chat and PROMPT_ROLE.match(prompt):
        starts = [m.start() for m in PROMPT_ROLE.finditer(prompt)] + [len(prompt)]
        out = []
        for a, b in zip(starts, starts[1:]):
            role, _, text = prompt[a:b].partition(": ")
            out.append({"role": role, "content": text.removesuffix("\n")})
        return out
    return [{"role": "user", "content": prompt}] if prompt else []


def _schema(name: str, arguments: Any) -> dict:
    if name == "search":
        return SEARCH_TOOL
    props = {k: {"type": JSON_TYPES.get(type(v), "string")} for k, v in arguments.items()} \
        if isinstance(arguments, dict) else {}
    return {"type": "function", "function": {"name": name, "description": "",
                                             "parameters": {"type": "object",
                                                            "properties": props}}}


def system_prompt(rendered: str | None) -> str | None:
    """The system message inside a prompt as its chat template rendered it, None if it holds
    none this module can read (``SYSTEM_TURNS``).

    >>> system_prompt("<|im_start|>system\\nBe brief.<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>")
    'Be brief.'
    """
    for pattern in SYSTEM_TURNS:
        found = pattern.search(rendered or "")
        if found:
            return found.group(1)
    return None


def conversation(traj: dict, turns: list[dict], chat: bool, system: str | None = None) -> dict:
    """One trajectory (``trajectories`` row, its ``turns`` rows in order) as a dataset line;
    ``chat``: the run was imported from chat messages (see the module docstring); ``system``:
    the system prompt the policy saw, where the run is not a chat import."""
    info = from_json(traj.get("info")) or {}
    messages = _prompt_messages(traj.get("prompt") or "", chat)
    if system is not None and not chat:
        messages.insert(0, {"role": "system", "content": system})
    tools: dict[str, dict] = {}
    for turn in turns:
        action, calls = turn.get("action") or "", _calls(turn)
        if not calls:
            messages.append({"role": "assistant", "content": action})
            observation = turn.get("observation") or ""
            if chat and PROMPT_ROLE.match(observation):  # an import's "user: text" lines
                messages.extend(_prompt_messages(observation, True))
                continue
            role, text = _observation(observation)
            if text:
                messages.append({"role": "user" if role == "tool" else role, "content": text})
            continue
        ids = [c.get("id") or f"call_{turn['turn']}_{i}" for i, c in enumerate(calls)]
        messages.append({"role": "assistant", "content": _text_without_calls(action, calls, chat),
                         "tool_calls": [{"id": i, "type": "function", "function": {
                             "name": c["name"], "arguments": c["arguments"]
                             if isinstance(c["arguments"], str)
                             else json.dumps(c["arguments"], ensure_ascii=False)}}
                             for i, c in zip(ids, calls)]})
        results = _results(turn.get("observation") or "", calls, chat)
        for i, c, (result, error) in zip(ids, calls, _errors(results, turn.get("error"), chat)):
            messages.append({"role": "tool", "tool_call_id": i, "name": c["name"],
                             "content": result} | ({"error": error} if error else {}))
            tools.setdefault(c["name"], _schema(c["name"], from_json(c["arguments"])))
    own = (info.get("extra") or {}).get("tools") if isinstance(info.get("extra"), dict) else None
    line = {"messages": messages}
    if isinstance(own, list) or tools:  # none called and no list given: whether any tool was
        line["tools"] = own if isinstance(own, list) else list(tools.values())  # offered is unknown
    for key in LINE_KEYS:
        value = traj.get(key)
        if value is not None and not (isinstance(value, float) and not math.isfinite(value)):
            line[key] = value  # (a NaN would make the line JSON no loader reads)
    return line


# -- a run's selection ---------------------------------------------------------------------------
_TRAJ = select("trajectories", *LINE_KEYS, "prompt", "info")
_TURN = select("turns", "traj_id", "turn", "action", "observation", "action_type", "parsed",
               "error")
TRAJ_SQL = (f"SELECT {_TRAJ} FROM trajectories WHERE run_id = ? "
            "AND traj_id IN (SELECT unnest(?))")
TURN_SQL = (f"SELECT {_TURN} FROM turns WHERE run_id = ? AND traj_id IN (SELECT unnest(?)) "
            "ORDER BY traj_id, turn")
PROMPT_SQL = ("SELECT traj_id, string_agg(text, '' ORDER BY pos) FROM tokens WHERE run_id = ? "
              "AND traj_id IN (SELECT unnest(?)) AND role = 'prompt' GROUP BY traj_id")
"""Each trajectory's prompt tokens as the model saw them (its system prompt is read from them)."""


def _lines(con, run_id: str, ids: list[str], chat: bool) -> Iterator[dict]:
    def rows(sql: str) -> list[dict]:
        cur = con.execute(sql, [run_id, ids])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]

    trajs = {r["traj_id"]: r for r in rows(TRAJ_SQL)}
    turns: dict[str, list[dict]] = {}
    for r in rows(TURN_SQL):
        turns.setdefault(r["traj_id"], []).append(r)
    systems = {} if chat else {tid: system_prompt(text) for tid, text in
                               con.execute(PROMPT_SQL, [run_id, ids]).fetchall()}
    for tid in ids:
        yield conversation(trajs[tid], turns.get(tid, []), chat, systems.get(tid))


def _chat_source(con, run_id: str) -> bool:
    row = con.execute("SELECT source FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        raise db.StoreError(f"no run {run_id!r} in this store")
    return (row[0] or "") in CHAT_SOURCES


def write_messages(db_path, run_id: str, out, filters: Filters = Filters(),
                   traj_ids: list[str] | None = None, chunk: int = 200) -> int:
    """Write the selected trajectories (``filters``, or exactly ``traj_ids``) as the chat
    dataset to ``out``; return how many. Read in short transactions, a chunk at a time, and
    written under a temporary name first: a reader of ``out`` never sees half a file."""
    with db.reading(db_path) as con:
        chat = _chat_source(con, run_id)
        ids = selected_ids(con, run_id, filters) if traj_ids is None else list(traj_ids)
    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    with open(partial, "w", encoding="utf-8") as f:
        for start in range(0, len(ids), chunk):
            with db.reading(db_path) as con:
                for line in _lines(con, run_id, ids[start:start + chunk], chat):
                    f.write(json.dumps(line, ensure_ascii=False, default=str,
                                       allow_nan=False) + "\n")
    partial.replace(out)
    return len(ids)


def messages_bytes(db_path, run_id: str, traj_ids: list[str]) -> bytes:
    """The same dataset in memory, for the app's download button (storage/queries.py)."""
    with db.reading(db_path) as con:
        chat = _chat_source(con, run_id)
        return "".join(json.dumps(line, ensure_ascii=False, default=str) + "\n"
                       for line in _lines(con, run_id, list(traj_ids), chat)).encode("utf-8")
