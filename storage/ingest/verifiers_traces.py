"""verifiers' ``traces.jsonl`` (prime-rl's environments) as trajectories: the ``verifiers`` format.

verifiers 0.4.0 appends one ``Episode`` per line to ``{run dir}/traces.jsonl``
(``verifiers.v1.utils.trace_store.write_episode``: ``vf-eval``, and prime-rl's orchestrator for
the rollouts it trains on), a ``configs/eval.json`` beside it::

    {"id", "env": {"id"}, "task": {"type", "data", "key"?, "hash"?}, "group": {"id"}?,
     "run": {"type": "train", "id", "work": {"type": "train"|"eval", "step"}}
            | {"type": "eval", "id"}?, "ok", "errors": [...],
     "traces": [{"id", "agent": {"config", "name"}, "tools",
                 "nodes": [{"parent", "message": {"role", "content", "tool_calls"?},
                            "sampled", "token_ids", "mask", "logprobs",
                            "advantages"?, "trainer_logprobs"?, "reference_logprobs"?}],
                 "rewards": {name: {"score", "weight"}}, "metrics": {...},
                 "is_completed", "ok", "stop_condition"?, "error"?}]}

What is kept, per trace (one trajectory; an episode of several agents gives several):

* Its branch: the path from the last node up its ``parent`` links (verifiers'
  ``Branch``: one root-to-leaf path, one training sample). Its messages give the prompt and
  turns by the ``messages`` rules (storage/ingest/messages.py; verifiers' flat tool calls
  ``{"id", "name", "arguments"}`` read as OpenAI's).
* Tokens, when every node on the path has ``token_ids`` (a relay turn of an evaluation has
  none: then the text is all there is, rebuilt into pieces): each node's span, ``mask`` True
  being the sampled, trained tokens (the action), the rest scaffold and input messages (prompt
  before the first sampled token, observation after, never trained). ``logprobs``,
  ``advantages``, ``trainer_logprobs`` and ``reference_logprobs`` are per sampled token
  (verifiers' layout) and land on the mask's True positions. Token text needs the model's
  tokenizer (the file has ids only): ``read_verifiers(..., tokenizer=...)`` decodes them
  (storage/token_text.py; ``import``/``follow --tokenizer PATH`` reads the model's
  ``tokenizer.json``); without one each token's text is ``<id>``, noted.
* Step and split: ``run.work.step`` and ``run.work.type`` (prime-rl's in-training evaluations
  are ``eval``); a standalone ``vf-eval`` run (``run.type`` eval, or no run) is step 0, split
  ``eval``. Group: ``group.id``, else the task's key or hash, else its prompt's hash (as
  ``vf-eval -r N`` repeats one task N times).
* Reward: the sum of ``score * weight`` (``Trace.reward``); each reward a component by its
  name; success from a ``correct``/``accuracy``-style reward or metric (> 0), else reward >= 1.
  Trajectory id: the trace's ``id``.
"""
from __future__ import annotations

import math
from pathlib import Path
from functools import partial
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from storage.ingest.dumps import SUCCESS_FIELDS
from storage.ingest.messages import messages_record
from storage.ingest.rollout_tokens import rollout_columns
from storage.ingest.door import number, read, token_ids
from storage.ingest.registry import REGISTRY, Format, Records, Source, Unit, register
from storage.interchange import MAX_LINE_BYTES, LineError
from storage.token_columns import TokenColumns, token_text_array
from storage.token_rows import MAX_TRAJECTORY_TOKENS

TRACES_FILE = "traces.jsonl"
PER_TOKEN = {"logprobs": "logprob", "trainer_logprobs": "train_logprob",
             "advantages": "advantage"}


def step_split(episode: dict) -> tuple[int, str]:
    """(step, split) an episode's ``run`` says (module docstring)."""
    run = episode.get("run") if isinstance(episode.get("run"), dict) else {}
    work = run.get("work") if isinstance(run.get("work"), dict) else None
    if run.get("type") != "train" or work is None:
        return 0, "eval"
    step = work.get("step")
    step = step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else 0
    return step, "eval" if work.get("type") == "eval" else "train"


def episode_records(episode: Any, tokenizer=None) -> list[Any]:
    """The records of one ``traces.jsonl`` line, each made by a function of no arguments
    (storage/ingest/door.py: what one raises fails that trace alone, named ``[k]``)."""
    if not isinstance(episode, dict) or not isinstance(episode.get("traces"), list):
        return Records([LineError("line must be an object with a 'traces' list (one verifiers "
                                  "Episode)")])
    step, split = step_split(episode)
    task = episode.get("task") if isinstance(episode.get("task"), dict) else {}
    group = episode.get("group") if isinstance(episode.get("group"), dict) else {}
    return Records([partial(_trace, trace, step, split, task, group.get("id"), tokenizer)
                    for trace in episode["traces"]])  # each named by its index, ``[k]``


def _rewards(given: Any) -> dict[str, float]:
    """``{name: score * weight}`` of a trace's ``rewards``, each score and weight a number
    (``number``): a string or list weight would otherwise multiply into a huge value, a
    ``null`` one into a TypeError. A weight left out is verifiers' default, 1.0; a reward
    whose score is ``null`` was not computed and is left out."""
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise LineError(f"field 'rewards' must be an object, got {type(given).__name__}")
    out = {}
    for name, r in given.items():
        if not isinstance(r, dict) or r.get("score") is None:
            continue
        weight = number(r["weight"], f"rewards.{name}.weight") if "weight" in r else 1.0
        out[str(name)] = number(number(r["score"], f"rewards.{name}.score") * weight,
                                f"rewards.{name}")
    return out


def _path(nodes: list) -> list[dict]:
    """The nodes from the root to the last node, following ``parent``."""
    path, at, seen = [], len(nodes) - 1, set()
    while at is not None:
        if not isinstance(at, int) or not 0 <= at < len(nodes) or at in seen:
            raise LineError(f"node parent {at!r} is not an earlier node of the trace")
        seen.add(at)
        node = nodes[at]
        if not isinstance(node, dict) or not isinstance(node.get("message"), dict):
            raise LineError(f"nodes[{at}] must be an object with a 'message'")
        path.append(node)
        at = node.get("parent")
    return path[::-1]


def _message(m: dict) -> dict:
    """A verifiers message as OpenAI's (its tool calls are flat ``{"id", "name", "arguments"}``)."""
    calls = m.get("tool_calls")
    if isinstance(calls, list):
        m = {**m, "tool_calls": [{"id": c.get("id"), "type": "function",
                                  "function": {"name": c.get("name"),
                                               "arguments": c.get("arguments")}}
                                 if isinstance(c, dict) and "function" not in c else c
                                 for c in calls]}
    return m


def _trace(trace: Any, step: int, split: str, task: dict, group: Any, tokenizer) -> dict:
    if not isinstance(trace, dict) or not isinstance(trace.get("nodes"), list) \
            or not trace["nodes"]:
        raise LineError("must be an object with a non-empty 'nodes' list")
    path = _path(trace["nodes"])
    rewards = _rewards(trace.get("rewards"))
    metrics = trace.get("metrics") if isinstance(trace.get("metrics"), dict) else {}
    said = {**metrics, **rewards}
    success = next((said[f] > 0 for f in SUCCESS_FIELDS if isinstance(said.get(f), (int, float))
                    and not isinstance(said[f], bool) and _finite(said[f])), None)
    info = {"trainer": "verifiers", "metrics": metrics, "ok": trace.get("ok"),
            "stop_condition": trace.get("stop_condition"), "errors": trace.get("errors")}
    line = {"messages": [_message(n["message"]) for n in path], "reward": sum(rewards.values()),
            "step": step, "split": split, "info": {k: v for k, v in info.items() if v},
            "tools": trace.get("tools") or []}
    if success is not None:
        line["success"] = success
    trace_id = str(trace.get("id") or f"s{step}-{id(trace)}")
    rec = messages_record(line, trace_id)
    rec["group_id"] = str(group or task.get("key") or task.get("hash")
                          or f"{step}:{rec['task_id']}")
    if rewards:
        rec["rewards"] = rewards
    if all(isinstance(n.get("token_ids"), list) and n["token_ids"] for n in path):
        rec["tokens"], notes = _tokens(path, tokenizer)
        rec["advantage"] = rec["tokens"].first("advantage")
        rec["info"]["import_notes"] = rec["info"].get("import_notes", []) + notes
    return rec


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer no double holds
        return False


def _tokens(path: list[dict], tokenizer) -> tuple[TokenColumns, list[str]]:
    """Token rows of a branch whose nodes carry their spans (module docstring); refused, before
    a row is made, past ``MAX_TRAJECTORY_TOKENS`` (a 16 MiB line holds 8M one-digit ids: rows
    for them all would cost gigabytes)."""
    total = sum(len(n["token_ids"]) for n in path)
    if total > MAX_TRAJECTORY_TOKENS:
        raise LineError(f"{total} token ids on the branch, over the limit of "
                        f"{MAX_TRAJECTORY_TOKENS} per trajectory")
    ids, mask = [], []
    given = {name: [] for name in PER_TOKEN}  # per name: the values, each node's count of them
    for k, node in enumerate(path):
        span = token_ids(node["token_ids"], f"nodes[{k}].token_ids")
        kept = node.get("mask") or [False] * len(span)
        if not isinstance(kept, list) or not all(isinstance(m, (bool, int)) for m in kept):
            raise LineError("a node's mask must be a list of true/false")
        if len(kept) != len(span):
            raise LineError(f"a node's mask has {len(kept)} entries for {len(span)} token ids")
        sampled = sum(map(bool, kept))
        for name in PER_TOKEN:  # per sampled token, spread onto the mask's True positions
            values = node.get(name) or []
            if values and not isinstance(values, list):
                raise LineError(f"a node's {name} must be a list of numbers")
            if values and len(values) != sampled:
                raise LineError(f"a node's {name} has {len(values)} values for {sampled} "
                                "sampled tokens")
            given[name].append((values, len(span)))
        ids.append(span)
        mask += kept
    ids, mask = np.concatenate(ids), np.asarray(mask, np.float64) != 0
    notes = []
    if tokenizer is not None:
        texts = token_text_array(tokenizer, ids)  # an id outside the vocabulary raises:
                                                  # this trace fails alone
    else:
        texts = pa.array([f"<{i}>" for i in ids.tolist()], pa.string())
        notes.append("token text is each token's id: the file holds ids only (import with a "
                     "tokenizer to decode them)")
    hits = np.flatnonzero(mask)
    first = int(hits[0]) if len(hits) else len(ids)
    tokens, _ = rollout_columns(texts, ids, first, mask[first:], with_turns=False)
    for name, field in PER_TOKEN.items():
        nodes = given[name]
        if not any(values for values, _ in nodes):
            continue
        present = mask & np.repeat([bool(values) for values, _ in nodes],
                                   [size for _, size in nodes])
        full = np.zeros(len(ids))
        full[present] = [number(v, name) if type(v) is not float else v
                         for values, _ in nodes for v in values]
        tokens.values[field], tokens.present[field] = full, present
    return tokens, notes


class TokenizerFile:
    """A model's ``tokenizer.json`` (or the folder holding it) read with the ``tokenizers``
    library, shaped as storage/token_text.py's ``token_texts`` reads a tokenizer: what
    ``--tokenizer`` gives an import, without transformers."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        try:
            self.backend_tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # a missing or unreadable file: say which, and why
            raise ValueError(f"--tokenizer {file}: not a readable tokenizer.json "
                             f"({type(exc).__name__}: {exc})") from None

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.backend_tokenizer.id_to_token(int(i)) or "" for i in ids]

    def decode(self, ids: list[int]) -> str:
        return self.backend_tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


@register
class Verifiers(Format):
    """verifiers' ``traces.jsonl``: an episode a line, appended as they finish."""
    name = "verifiers"
    patterns = (TRACES_FILE,)
    followed = "appended"
    rank = 30

    def detect(self, source: Path, first: Any) -> bool:
        if source.is_dir():
            return any(source.rglob(TRACES_FILE))
        return isinstance(first, dict) and isinstance(first.get("traces"), list)

    def records(self, raw: Any, src: Source, unit: Unit) -> list[Any]:
        return episode_records(raw, src.tokenizer)


def read_verifiers(path: str | Path, max_line_bytes: int = MAX_LINE_BYTES, tokenizer=None
                   ) -> Iterator[tuple[str, Any]]:
    """(where, generic record or LineError) of every trace in a ``traces.jsonl``, or in every
    ``traces.jsonl`` under a folder, read by the framework (storage/ingest/door.py)."""
    return read(REGISTRY["verifiers"], Path(path), max_line_bytes, tokenizer)
