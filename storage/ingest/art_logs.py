"""OpenPipe ART's trajectory logs as trajectories: the ``art`` import format.

ART's backend (``LocalBackend._log``, art 0.5.0) writes each logged step to
``{art_path}/{project}/models/{model}/trajectories/{split}/{step:04d}.jsonl`` with
``art.utils.trajectory_logging.serialize_trajectory_groups``: one ``TrajectoryGroup`` per line,
``{"trajectories": [...]}``, lines joined by newlines (the last has none), the whole file written
at once. Each trajectory::

    {"reward": 1.0, "metrics": {"correct": 1}, "metadata": {"task": "q17"},
     "messages_and_choices": [{"role": "system", ...}, {"role": "user", ...},
                              {"finish_reason": "stop", "index": 0,
                               "message": {"role": "assistant", "content": "...",
                                           "tool_calls": [...]}}, {"role": "tool", ...}],
     "tools": [...], "additional_histories": null, "logs": []}

What is kept:

* Turns: a ``Choice`` (an object with ``message``) is the model's own output, which ART trains;
  its message and the plain messages are read as OpenAI chat messages by the ``messages`` rules
  (storage/ingest/messages.py: prompt, one turn per assistant message, tool results as
  observations, tool calls parsed). ART drops the choices' logprobs when it logs, so tokens are
  rebuilt from the text (no ids or logprobs: the file has none).
* Step: the file's number; split: its folder, ART's ``val`` read as ``eval`` (held-out), other
  names as they are. Group: the line, ``{split}-{step}-g{line}`` -- exactly the trajectories ART
  normalised rewards over. Trajectory id ``{split}/{step:04d}:{line}:{k}``.
* ``reward``; numeric ``metrics`` are reward components by their name (``correct``/``acc`` also
  give success, storage/ingest/dumps.py's rule), the rest of ``metrics``, ``metadata`` and
  ``logs`` stay in ``info``.
"""
from __future__ import annotations

import os
import re
from functools import partial
from pathlib import Path
from typing import Any

from storage.ingest.dumps import components_and_info
from storage.ingest.messages import messages_record
from storage.ingest.registry import Format, Records, Source, Unit, register
from storage.interchange import LineError

MAX_GROUP = 10_000


def art_split(folder: str) -> str:
    """The split ART's folder name denotes: ``val`` (ART's default for ``model.log``) is
    ``eval``; a name that is no split name is ``train``."""
    if folder == "val":
        return "eval"
    return folder if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", folder) else "train"


def art_records(obj: Any, stem: str, line: int, step: int, split: str) -> list[Any]:
    """The records of one logged ``TrajectoryGroup`` line, each made by a function of no
    arguments (storage/ingest/door.py: what one raises fails that trajectory alone)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("trajectories"), list):
        return Records([LineError("line must be an object with a 'trajectories' list (one "
                                  "ART TrajectoryGroup)")])
    if len(obj["trajectories"]) > MAX_GROUP:
        return Records([LineError(f"{len(obj['trajectories'])} trajectories in one group, "
                                  f"over the limit of {MAX_GROUP}")])
    return Records([partial(_trajectory, traj, f"{split}/{stem}:{line}:{k}",
                            f"{split}-{step}-g{line}", step, split)
                    for k, traj in enumerate(obj["trajectories"])])  # each named ``[k]``


def _trajectory(traj: Any, traj_id: str, group_id: str, step: int, split: str) -> dict:
    if not isinstance(traj, dict) or not isinstance(traj.get("messages_and_choices"), list):
        raise LineError("must be an object with a 'messages_and_choices' list")
    messages = [m["message"] if isinstance(m, dict) and isinstance(m.get("message"), dict)
                else m for m in traj["messages_and_choices"]]
    metrics = traj.get("metrics") if isinstance(traj.get("metrics"), dict) else {}
    notes: list[str] = []
    components, other, success = components_and_info(metrics, notes)
    info = {"trainer": "art", "metrics": metrics} if metrics else {"trainer": "art"}
    for key in ("metadata", "logs"):
        if traj.get(key):
            info[key] = traj[key]
    line = {"messages": messages, "reward": traj.get("reward"), "traj_id": traj_id,
            "group_id": group_id, "step": step, "split": split, "info": info,
            "tools": traj.get("tools") or []}
    if success is not None:
        line["success"] = success
    rec = messages_record(line, traj_id)
    if components:
        rec["rewards"] = components
    if notes:
        rec["info"]["import_notes"] = rec["info"].get("import_notes", []) + notes
    return rec


@register
class Art(Format):
    """ART's logs: one file written at once, its last line without a newline, so a file is
    followed whole (complete once it has any bytes and two polls see it unchanged)."""
    name = "art"
    patterns = ("*.jsonl",)
    followed = "whole"
    rank = 40

    def detect(self, source: Path, first: Any) -> bool:
        return isinstance(first, dict) and isinstance(first.get("trajectories"), list)

    def complete(self, fd: int) -> bool:
        return os.fstat(fd).st_size > 0

    def where(self, src: Source, unit: Unit) -> str:
        return f"{src.folder}/{src.name}:{unit.number}"

    def records(self, raw: Any, src: Source, unit: Unit) -> list[Any]:
        return art_records(raw, src.stem, unit.number, src.step, art_split(src.folder))
