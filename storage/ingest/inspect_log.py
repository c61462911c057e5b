"""Inspect AI evaluation logs (``.eval``, a zip of JSON, and ``.json``) as generic trajectory
records (storage/interchange.py), read with the standard library and pyarrow only.

Why not the ``inspect-ai`` package: it pulls in about fifty packages (boto3, aiobotocore, s3fs,
fastapi, textual, tiktoken, ...), and resolving them would move two of our pins (fsspec,
python-dateutil). The log is plain JSON in a zip; what we read of it is small and written down
here. ``inspect-ai`` is used only by the tests, to make real logs (requirements-inspect.txt).

The layout read (Inspect 0.3.x, log version 2): ``header.json`` (``eval``: task, model, scorers,
config...; ``plan``; ``results``; ``stats``; ``status``), written when the eval ends; before that
only ``_journal/start.json`` (``eval``, ``plan``), which is used in its place; and one member per
sample and epoch, ``samples/{id}_epoch_{epoch}.json`` (``messages``, ``scores``, ``output``,
``model_usage``, ``error``, ``limit``, ``target``, ``attachments``...). A ``.json`` log is the
same object with ``samples`` inline.

One trajectory per sample and epoch:
* ``task_id`` and ``group_id`` are the sample id, so a group is one sample across its epochs;
  ``traj_id`` is ``{id}:epoch{epoch}`` (prefixed with the eval id when a directory is imported,
  where two logs of one task and model may hold the same sample); step 0, split ``eval``.
* Turns: storage/ingest/messages.py's rules (assistant message = action, tool results = observation,
  the system and user messages before it = prompt). ``attachment://`` references are resolved.
* Scores: every scorer is a reward component ``score/{scorer}`` (``score/{scorer}/{key}`` for a
  dict or list value), converted by Inspect's ``value_to_float``. ``outcome`` (= the reward) is
  the primary scorer's value — the headline scorer, else the first — and success is that value
  being correct (1.0). A value of a type Inspect's ``Value`` does not allow fails the sample.
* ``finish_reason``: ``error`` (the sample errored), ``{type}_limit`` (a token, message, time,
  working, context, turn or cost limit cut it), ``refused`` (the last assistant message has a
  ``refusal`` part, or the output's ``stop_details`` type is ``refusal``), else from the final
  output's stop reason (``stop`` -> ``answered``/``done``, ``model_length`` -> ``context_full``,
  others as named).
* ``info.tools_offered``: whether the model was offered any tool (its model events' tool lists;
  absent when the log has no events), and ``info.inspect.tools`` their names.
* ``info.inspect``: sample id, epoch, uuid, scores (value, answer, explanation), usage summed
  over models and per model, times, error, limit, metadata. ``response_tokens`` is the eval
  model's output tokens.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Iterator

from storage.ingest.door import Refused, listing
from storage.ingest.inspect_scores import primary_scorer, score_components
from storage.interchange import LineError
from storage.ingest.messages import (MAX_MESSAGES, MAX_TRAJECTORY_CHARS, content_text,
                                     ended_refusing, refused_in, tool_error, render_call, turns_of)
from storage.recorder import clean_json
from storage.ingest.zip_members import (MAX_MEMBER_BYTES, MAX_TOTAL_BYTES, Archive, ZipError,
                                        check_parse_cost, json_error, parse_member)

MAX_JSON_LOG_BYTES = 1024 ** 3
SAMPLE_MEMBER = re.compile(r"^samples/(?P<id>.+)_epoch_(?P<epoch>\d+)\.json$")
USAGE_KEYS = ("input_tokens", "output_tokens", "total_tokens", "reasoning_tokens",
              "input_tokens_cache_read", "input_tokens_cache_write", "total_cost")
STOP_REASONS = {"model_length": "context_full", "max_tokens": "max_tokens",
                "tool_calls": "tool_calls", "content_filter": "content_filter"}
ATTACHMENT = "attachment://"


# -- messages --------------------------------------------------------------------------------------
def _resolve(value: Any, attachments: dict, budget: list[int]) -> Any:
    """``attachment://{hash}`` strings replaced by the text Inspect moved out of the message.
    ``budget``: [characters the sample's references may still bring in]; one attachment named
    many times is counted each time (LineError past it: a few KB could otherwise name a 4 MB
    text thousands of times)."""
    if isinstance(value, str):
        if value.startswith(ATTACHMENT):
            text = attachments.get(value[len(ATTACHMENT):], value)
            budget[0] -= len(text) if isinstance(text, str) else 0
            if budget[0] < 0:
                raise LineError(f"its attachments, as its messages name them, hold more than "
                                f"{MAX_TRAJECTORY_CHARS} characters")
            return text
        return value
    if isinstance(value, list):
        return [_resolve(v, attachments, budget) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(v, attachments, budget) for k, v in value.items()}
    return value


def inspect_message(m: Any, where: str, attachments: dict, budget: list[int]) -> dict:
    """An Inspect ChatMessage, normalised as storage/ingest/messages.py's ``turns_of`` reads them;
    ``budget`` as ``_resolve`` takes it."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise LineError(f"{where} must be a message object with a role")
    try:
        text = content_text(_resolve(m.get("content"), attachments, budget))
    except LineError as exc:
        raise LineError(f"{where}: {exc}") from None
    calls = []
    for i, c in enumerate(m.get("tool_calls") or []):
        if not isinstance(c, dict) or not isinstance(c.get("function"), str):
            raise LineError(f"{where}.tool_calls[{i}] must be an object naming its function")
        bad, arguments = c.get("parse_error"), _resolve(c.get("arguments"), attachments, budget)
        calls.append({"id": c.get("id"), "name": c["function"], "bad": bad if bad else None,
                      "text": render_call(c["function"], arguments), "arguments": arguments})
    return {"role": m["role"], "text": text, "name": m.get("function"),
            "call_id": m.get("tool_call_id"), "calls": calls,
            "error": tool_error(m, text) if m["role"] == "tool" else None,  # ChatMessageTool.error
            "refused": refused_in(m.get("content"))}


# -- one sample ------------------------------------------------------------------------------------
def _usage(model_usage: Any) -> dict[str, float]:
    total: dict[str, float] = {}
    for usage in (model_usage or {}).values():
        for key in USAGE_KEYS:
            v = usage.get(key) if isinstance(usage, dict) else None
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                total[key] = total.get(key, 0) + v
    return total


def _finish(sample: dict, answer: str | None, refused: bool) -> str:
    if sample.get("error"):
        return "error"
    limit = sample.get("limit")
    if isinstance(limit, dict) and isinstance(limit.get("type"), str):
        return f"{limit['type']}_limit"
    choices = (sample.get("output") or {}).get("choices") or [{}]
    choice = choices[0] if isinstance(choices, list) and isinstance(choices[0], dict) else {}
    reason, details = choice.get("stop_reason"), choice.get("stop_details")
    if refused or (isinstance(details, dict) and details.get("type") == "refusal"):
        return "refused"  # marked by the model or its provider (storage/failures.py: refused)
    if reason in STOP_REASONS:
        return STOP_REASONS[reason]
    return "answered" if answer else "done"


def offered_tools(events: Any) -> list[str] | None:
    """Names of the tools the model was offered (its first call to the model that lists any),
    [] when it was called without tools, None when the log has no model call (no events)."""
    calls = [e for e in events if isinstance(e, dict) and e.get("event") == "model"] \
        if isinstance(events, list) else []
    for event in calls:
        tools = event.get("tools")
        if isinstance(tools, list) and tools:
            return [str(t.get("name")) for t in tools if isinstance(t, dict)][:100]
    return [] if calls else None


def _short_id(value: Any, limit: int = 200) -> str:
    """The sample id as an id column holds it: a longer one is cut and tagged with its hash."""
    text = str(value)
    if 0 < len(text) <= limit:
        return text
    return f"{text[:limit - 13]}~{hashlib.sha1(text.encode('utf-8', 'replace')).hexdigest()[:12]}"


def _messages(sample: dict) -> list[dict]:
    """The sample's messages, normalised (``inspect_message``); a sample that errored before any
    generation has only its input."""
    attachments = sample.get("attachments") or {}
    messages = sample.get("messages") or []
    if not messages:  # errored before any generation: the input is all there is
        given = sample.get("input")
        messages = [{"role": "user", "content": given}] if isinstance(given, str) else given or []
    if not isinstance(messages, list) or len(messages) > MAX_MESSAGES:
        raise LineError(f"messages must be a list of at most {MAX_MESSAGES}")
    budget = [MAX_TRAJECTORY_CHARS]
    return [inspect_message(m, f"messages[{i}]", attachments, budget)
            for i, m in enumerate(messages)]


def _scores(sample: dict, log: "InspectLog", notes: list[str]) -> tuple:
    """(reward components, the scores kept in info, the primary scorer, outcome, success, the
    primary scorer's answer) of a sample; what was assumed is appended to ``notes``. The outcome
    is the mean of the primary scorer's values, success all of them correct (1.0)."""
    scores = sample.get("scores") or {}
    if not isinstance(scores, dict):
        raise LineError(f"scores must be an object, got {type(scores).__name__}")
    components, kept = {}, {}
    for name, score in scores.items():
        if not isinstance(score, dict) or "value" not in score:
            raise LineError(f"score {name!r} must be an object with a value")
        values, more = score_components(name, score["value"])
        components.update(values)
        notes += more
        kept[name] = {k: score.get(k) for k in ("value", "answer", "explanation")}
    primary = log.primary if log.primary in scores else next(iter(scores), None)
    answer = None
    if primary is None:
        outcome, success = 0.0, False
        notes.append("not scored" + (" (the sample errored)" if sample.get("error") else "")
                     + ": outcome 0.0, not a success")
    else:
        if primary != log.primary:
            notes.append(f"primary scorer {log.primary!r} absent: {primary!r} used")
        own = [v for k, v in components.items() if k == f"score/{primary}"
               or k.startswith(f"score/{primary}/")]
        outcome = sum(own) / len(own)
        success = all(v == 1.0 for v in own)
        if len(own) > 1:
            notes.append(f"outcome is the mean of scorer {primary!r}'s {len(own)} values; "
                         "success is all of them correct")
        answer = scores[primary].get("answer")
    return components, kept, primary, outcome, success, answer


def sample_record(sample: Any, log: "InspectLog", prefix: str = "") -> dict:
    """The generic record of one sample (see the module docstring), or LineError."""
    if not isinstance(sample, dict) or "id" not in sample:
        raise LineError("a sample must be an object with an id")
    sid, epoch = sample["id"], sample.get("epoch", 1)
    normal = _messages(sample)
    prompt, turns = turns_of(normal)
    notes: list[str] = []
    error = sample.get("error")
    if error and turns:  # what cut the episode short, beside the turn it cut (not in its text:
        message = error.get("message") if isinstance(error, dict) else error  # no model saw it)
        turns[-1]["error"] = "; ".join(filter(None, [turns[-1].get("error"),
                                                     f"sample error: {message}"]))
    components, kept, primary, outcome, success, answer = _scores(sample, log, notes)
    output = sample.get("output") or {}
    if not isinstance(answer, str) and turns and turns[-1]["action_type"] == "answer":
        # no scorer's answer: the final words, if the model ended on words and not on a call
        answer = output.get("completion") if isinstance(output.get("completion"), str) else None
    answer = answer if isinstance(answer, str) and answer else None
    usage, model_usage = _usage(sample.get("model_usage")), sample.get("model_usage") or {}
    tools = offered_tools(sample.get("events"))
    own_usage = model_usage.get(log.model) if isinstance(model_usage, dict) else None
    out_tokens = (own_usage or {}).get("output_tokens", usage.get("output_tokens", 0))
    notes.append("an evaluation log: no token was trained (tokens are whitespace pieces of the "
                 "messages' text, without ids or logprobs)")
    inspect_info = {
        "sample_id": sid, "epoch": epoch, "uuid": sample.get("uuid"), "scores": kept,
        "primary_scorer": primary, "usage": usage, "model_usage": model_usage,
        "total_time": sample.get("total_time"), "working_time": sample.get("working_time"),
        "error": {"message": error.get("message"),
                  "traceback": (error.get("traceback") or "")[-4000:]}
        if isinstance(error, dict) else error, "limit": sample.get("limit"),
        "error_retries": len(sample.get("error_retries") or []), "metadata": sample.get("metadata"),
        "log": log.path.name, "eval_id": log.spec.get("eval_id"), "tools": tools}
    task = _short_id(sid)
    rec = {"traj_id": f"{prefix}{task}:epoch{epoch}", "task_id": task, "group_id": task,
           "step": 0, "split": "eval", "prompt": prompt, "turns": turns, "reward": outcome,
           "rewards": {"outcome": outcome, **components}, "success": success,
           "finish_reason": _finish(sample, answer, ended_refusing(normal)),
           "info": clean_json({"inspect": inspect_info, "import_notes": notes})}
    if tools is not None:
        rec["info"]["tools_offered"] = bool(tools)
    if isinstance(out_tokens, int) and 0 <= out_tokens < 2 ** 31:
        rec["response_tokens"] = out_tokens
    if answer is not None:
        rec["answer"] = answer
    if sample.get("target") not in (None, "", []):
        target = sample["target"]
        rec["golds"] = target if isinstance(target, list) else [target]
    return rec


# -- one log file ----------------------------------------------------------------------------------
class InspectLog:
    """One log file: its header (``spec``, ``plan``, ``results``, ``stats``, ``status``) on
    opening, its samples one at a time from ``samples()``. ValueError (ZipError) if the file
    as a whole cannot be read. ``fp``: the file already open (a follower's), closed with the
    log; ``path`` then names it. ``keys``: the samples ``samples()`` came to, read or skipped
    (``{id}_epoch_{epoch}``)."""

    def __init__(self, path, max_member_bytes: int = MAX_MEMBER_BYTES,
                 max_total_bytes: int = MAX_TOTAL_BYTES, max_json_bytes: int = MAX_JSON_LOG_BYTES,
                 fp=None):
        self.path, self.archive, self._inline = Path(path), None, None
        self.keys: set[str] = set()
        if self.path.suffix == ".json":
            with fp if fp is not None else open(self.path, "rb") as f:
                header = self._read_json(f, max_json_bytes)
        else:
            self.archive = Archive(self.path, max_member_bytes, max_total_bytes, fp)
            header = self._eval_header()
        if not isinstance(header.get("eval"), dict):
            self.close()
            raise ValueError(f"{self.path.name}: not an Inspect log (no 'eval' object)")
        self.spec, self.plan = header["eval"], header.get("plan")
        self.results, self.stats = (v if isinstance(v, dict) else None  # a hostile header's
                                    for v in (header.get("results"), header.get("stats")))
        self.status = header.get("status", "started")
        self.task, self.model = str(self.spec.get("task")), str(self.spec.get("model"))
        self.primary = primary_scorer(self.spec, self.results)

    def _read_json(self, f, limit: int) -> dict:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise ValueError(f"{self.path.name}: {size} bytes, over the limit of {limit} for a "
                             "JSON log (read whole): convert it to .eval with `inspect log "
                             "convert --to eval` and import that")
        try:
            data = f.read(limit + 1)
            check_parse_cost(data, f"{self.path.name}")
            obj = json.loads(data)
        except Exception as exc:  # bad JSON, too deep (RecursionError), MemoryError
            raise ValueError(f"{self.path.name}: not valid JSON ({json_error(exc)})") from None
        finally:
            data = None
        if not isinstance(obj, dict):
            raise ValueError(f"{self.path.name}: not an Inspect log (not a JSON object)")
        self._inline = obj.pop("samples", None) or []
        if not isinstance(self._inline, list):
            raise ValueError(f"{self.path.name}: 'samples' is not a list")
        return obj

    @property
    def finished(self) -> bool:
        """Whether the eval has ended and the log is written through: a ``.eval`` has its
        ``header.json`` (Inspect writes it last; until then ``_journal/start.json`` stands in)
        and its directory, a ``.json`` a status other than ``started``."""
        if self.archive is not None:
            return "header.json" in self.archive.members and not self.archive.truncated
        return self.status != "started"

    def _eval_header(self) -> dict:
        errors = []
        for name in ("header.json", "_journal/start.json"):  # start.json: a log still running
            if name in self.archive.members:
                try:
                    header = parse_member(self.archive, name)
                    if isinstance(header, dict):
                        return header
                    errors.append(f"{name} is not an object")
                except Exception as exc:  # a member cut short, bad JSON, RecursionError...
                    errors.append(str(exc))
        self.archive.close()
        raise ValueError(f"{self.path.name}: no readable header.json or _journal/start.json"
                         + (f" ({'; '.join(errors)})" if errors else ""))

    def close(self) -> None:
        if self.archive is not None:
            self.archive.close()

    def __enter__(self) -> "InspectLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def samples(self, skip: frozenset[str] | set[str] = frozenset()
                ) -> Iterator[tuple[str, Any]]:
        """(where, sample dict or LineError), ``where`` naming the file, sample and epoch; the
        samples whose key is in ``skip`` are passed over unread (a follower took them before)."""
        if self.archive is None:
            for i, sample in enumerate(self._inline):
                sid = sample.get("id", f"#{i}") if isinstance(sample, dict) else f"#{i}"
                epoch = sample.get("epoch", "?") if isinstance(sample, dict) else "?"
                key = f"{sid}_epoch_{epoch}"
                self.keys.add(key)
                if key not in skip:
                    yield f"{self.path.name}: sample {sid} epoch {epoch}", sample
            return
        for name in self.archive.members:
            match = SAMPLE_MEMBER.match(name)
            if not match:
                continue
            key = f"{match['id']}_epoch_{match['epoch']}"
            self.keys.add(key)
            if key in skip:
                continue
            where = f"{self.path.name}: sample {match['id']} epoch {match['epoch']}"
            try:
                sample = parse_member(self.archive, name)
            except ZipError as exc:  # over the total: what is left of the log stays unread
                yield where, LineError(f"{exc}; this sample and those after it are not read")
                return
            except Exception as exc:  # this member only: cut, bad JSON, too deep, too costly
                yield where, LineError(str(exc))
                continue
            yield where, sample


def opening_error(path: Path, exc: BaseException) -> str:
    """Why the log at ``path`` could not be opened, naming it by its name, never its full path."""
    if isinstance(exc, OSError):
        return f"{path.name}: {exc.strerror or type(exc).__name__}"
    if isinstance(exc, ValueError) and str(exc).startswith(path.name):
        return str(exc)
    return f"{path.name}: {type(exc).__name__}: {exc}"


NOT_LOGS = ("logs.json", "eval-set.json")  # an eval set's listing files


def log_files(source: Path) -> list:
    """A log file itself, or every ``.eval``/``.json`` log under a directory, a log linking
    out of the directory as storage/ingest/door.py's ``Refused`` (never opened)."""
    if not source.is_dir():
        return [source]
    return [p for p in listing(source, ("*.eval", "*.json"))
            if isinstance(p, Refused) or (p.name not in NOT_LOGS and not p.is_dir())]


def finished(path: Path) -> bool:
    """Whether the log at ``path`` is finished being written (``InspectLog.finished``): what a
    follower (storage/ingest/follow_logs.py) tells apart; False for what is no readable log."""
    try:
        with InspectLog(path) as log:
            return log.finished
    except (ValueError, OSError):
        return False


def log_metrics(log: InspectLog) -> dict[str, float]:
    """Inspect's own metrics of the log (``inspect/{scorer}/{metric}``), as its header has them."""
    out = {}
    scores = (log.results or {}).get("scores")
    for score in scores if isinstance(scores, list) else ():
        metrics = score.get("metrics") if isinstance(score, dict) else None
        for metric in metrics.values() if isinstance(metrics, dict) else ():
            value = metric.get("value") if isinstance(metric, dict) else None
            if isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value):
                out[f"inspect/{score.get('name')}/{metric.get('name')}"] = float(value)
    return out
