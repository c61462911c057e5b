"""Readers for other trainers' rollout dumps, turning each sample into a generic record
(storage/interchange.py), so their runs can be debugged here.

* ``verl``: the files of ``trainer.rollout_data_dir`` — ``{step}.jsonl``, one sample per line,
  ``{"input", "output", "gts", "score", "step", ...extra reward fields}`` — a directory of them
  or one file. Search-R1 and RAGEN runs are verl runs.
* ``trl`` (storage/ingest/trl_dumps.py): TRL's completion logs ``completions_{step:05d}.parquet`` (columns ``step``, ``prompt``,
  ``completion``, one column per reward function, ``advantage``, sometimes ``mode``) — a
  directory (searched recursively) or one file.

What is reconstructed, and how:
* Turns: text inside ``<information>...</information>`` (Search-R1's retrieval results) is an
  observation, the text between is the model's action; without such blocks the whole output is one
  action. An action's type is its first ``<search>``/``<answer>`` element (Search-R1's rule); in an
  output that uses these tags, an action with neither is invalid. Chat-message completions
  (TRL, conversational) give one turn per assistant message, tool/user messages being observations.
* Groups: identical prompts at the same step form a group (``task_id`` is a hash of the prompt).
* Rewards: ``score`` (verl) or ``reward`` (TRL; else the sum of the reward-function columns, NaN
  skipped as TRL does) is the trajectory's reward. Numeric extra fields are components, named
  ``outcome``/``format``/``cost``/``process`` when their name says so (``format_reward`` ->
  ``format``, ``accuracy``/``acc``/``correctness``/``em`` -> ``outcome``), else kept as named.
* Success: a ``success``/``acc``/``correct`` field if present (> 0), else reward >= 1 (exact-match
  style rewards); the trajectory's ``info.import_notes`` says which.
* ``traj_id`` is ``{file}:{line or row}``: importing the same dump again finds the same ids.
* Split: verl writes ``trainer.validation_data_dir`` in the same form as ``rollout_data_dir``
  (``{global_step}.jsonl``), so the folder's name tells them apart: a file under a folder named
  as validation's (``val``, ``valid``, ``validation``, ``eval``, ``evaluation``, alone or as a
  ``_``/``-``/``.`` separated part: ``val_generations``, ``outputs/validation``), counting the
  imported folder itself and the folders below it, never those above, is split ``eval``; any
  other is ``train``. ``--split`` overrides it. TRL's ``mode`` column says ``eval``/``train``.
"""
from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Any

from storage.ingest.registry import Format, Source, Unit, register
from storage.interchange import LineError, run_said

INFO_RE = re.compile(r"<information>.*?</information>", re.DOTALL)
ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
TAG_RE = re.compile(r"</?(search|answer|information|think)>")
ALIASES = {"outcome": ("outcome", "accuracy", "acc", "correctness", "correct", "exact_match", "em"),
           "format": ("format", "formatting"), "cost": ("cost",), "process": ("process", "prm")}
SUCCESS_FIELDS = ("success", "acc", "accuracy", "correct")
VALIDATION_DIR = re.compile(r"(?:^|[_.-])(?:val|valid|validation|eval|evaluation)(?:[_.-]|$)",
                            re.IGNORECASE)


# -- shared helpers ------------------------------------------------------------------------------------
def standard_component(name: str) -> str | None:
    """The standard component a reward field's name denotes, if any (``format_reward`` -> format)."""
    base = name.lower().rsplit("/", 1)[-1]
    base = re.sub(r"_(reward|rewards|score|func|fn)$", "", base)
    return next((std for std, names in ALIASES.items() if base in names), None)


def task_id_of(prompt: str) -> str:
    return "p" + hashlib.sha1(prompt.encode("utf-8", "replace")).hexdigest()[:12]


def split_tagged(output: str) -> tuple[list[dict], str | None]:
    """Turns of a Search-R1/RAGEN-style output, and its final answer (last <answer> element)."""
    tagged = bool(TAG_RE.search(output))
    turns, start = [], 0
    for block in INFO_RE.finditer(output):
        turns.append({"action": output[start:block.start()], "observation": block.group(0)})
        start = block.end()
    if start < len(output) or not turns:
        turns.append({"action": output[start:], "observation": ""})
    for turn in turns:
        if tagged:
            match = ACTION_RE.search(turn["action"])
            turn["action_type"] = match.group(1) if match else "invalid"
            turn["action_valid"] = match is not None
    answers = ANSWER_RE.findall(output)
    return turns, answers[-1].strip() if answers else None


def components_and_info(extra: dict[str, Any], notes: list[str]) -> tuple[dict, dict, bool | None]:
    """Split extra fields into reward components, info, and an explicit success flag."""
    components, info, success = {}, {}, None
    for key, value in extra.items():
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key.lower() in SUCCESS_FIELDS and isinstance(value, (bool, int, float)) and success is None:
            if not (isinstance(value, float) and math.isnan(value)):
                success = bool(value > 0)
        if numeric:
            if isinstance(value, float) and not math.isfinite(value):
                continue  # TRL logs NaN for "not applicable"
            std = standard_component(key)
            name = std if std and std not in components else key
            if name != key:
                notes.append(f"reward field {key!r} recorded as component {name!r}")
            components[name] = _double(value, key)
        else:
            info[key] = value
    return components, info, success


def _double(value: int | float, field: str) -> float:
    """``float(value)``, or LineError naming ``field`` for an integer no double holds."""
    try:
        return float(value)
    except OverflowError:
        raise LineError(f"field '{field}' must be a number a double can hold, got an integer "
                        f"of {value.bit_length()} bits") from None


def finish(rec: dict, components: dict, info: dict, success: bool | None, notes: list[str]) -> dict:
    if components:
        rec["rewards"] = components
    if success is None:
        success = rec["reward"] >= 1.0
        notes.append("success inferred as reward >= 1")
    rec["success"] = success
    if notes:
        info["import_notes"] = notes
    if info:
        rec["info"] = info
    return rec


# -- verl ------------------------------------------------------------------------------------------------
def verl_split(*folders: str) -> str:
    """``eval`` when one of ``folders`` is named as verl's validation dumps are (see the module
    docstring), else ``train``."""
    return "eval" if any(VALIDATION_DIR.search(f) for f in folders) else "train"


def verl_record(obj: Any, traj_id: str, default_step: int, split: str = "train") -> dict:
    if not isinstance(obj, dict):
        raise LineError("line must be a JSON object")
    for key, kinds in (("input", str), ("output", str)):
        if not isinstance(obj.get(key), kinds):
            raise LineError(f"field '{key}' must be a string, got "
                            f"{'null' if obj.get(key) is None else type(obj.get(key)).__name__}")
    score = obj.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)) \
            or not math.isfinite(_double(score, "score")):
        raise LineError(f"field 'score' must be a finite number, got {score!r:.40}")
    step = obj.get("step", default_step)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise LineError(f"field 'step' must be a non-negative integer, got {step!r:.40}")
    notes: list[str] = []
    extra = {k: v for k, v in obj.items() if k not in ("input", "output", "gts", "score", "step")}
    components, info, success = components_and_info(extra, notes)
    turns, answer = split_tagged(obj["output"])
    rec = {"traj_id": traj_id, "task_id": task_id_of(obj["input"]), "step": step, "split": split,
           "prompt": obj["input"], "turns": turns, "reward": _double(score, "score"),
           "finish_reason": "answered" if answer is not None else None}
    if answer is not None:
        rec["answer"] = answer
    if obj.get("gts") is not None:
        rec["golds"] = obj["gts"]
    if run_said(obj):  # verl's data_source names the task set, adv_estimator the algorithm
        rec["run"] = run_said(obj)
    return finish(rec, components, info, success, notes)


@register
class Verl(Format):
    """verl's rollout dumps: a file is taken whole once complete (``follow``); a folder's
    files are searched recursively, each one's split from its folders (``verl_split``)."""
    name = "verl"
    patterns = ("*.jsonl",)
    followed = "whole"
    rank = 50  # a folder no other format claims is a rollout_data_dir

    def detect(self, source: Path, first: Any) -> bool:
        if source.is_dir():
            return True
        return isinstance(first, dict) and {"input", "output", "score"} <= first.keys() \
            and "traj_id" not in first

    def records(self, raw: Any, src: Source, unit: Unit) -> dict:
        return verl_record(raw, f"{src.ident}:{unit.number}", src.step, verl_split(*src.folders))


# -- chat messages (TRL's logs, the TRL callback) ----------------------------------------
def message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def messages_of(value: Any) -> list[dict] | None:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value):
        return value
    return None


def chat_turns(messages: list[dict]) -> list[dict]:
    """One turn per assistant message; the messages after it (tool, user) are its observation."""
    turns: list[dict] = []
    for m in messages:
        text = message_text(m.get("content"))
        if m.get("role") == "assistant":
            turns.append({"action": text, "observation": ""})
        elif turns:
            turns[-1]["observation"] += f"{m.get('role')}: {text}\n"
    return turns or [{"action": "", "observation": ""}]
