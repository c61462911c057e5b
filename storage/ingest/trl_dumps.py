"""TRL's completion logs as trajectories: the ``trl`` format.

``completions_{step:05d}.parquet`` (``GRPOTrainer`` with ``log_completions=True``): columns
``step``, ``prompt``, ``completion``, one column per reward function, ``advantage``, sometimes
``mode`` -- a directory (searched recursively) or one file. The rules (turns, rewards, success,
ids ``{file}:{row}``, the split from ``mode``) are storage/ingest/dumps.py's. Read a row group
at a time, never the whole table; followed whole once the file ends with its ``PAR1`` footer.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterator

from storage.ingest.dumps import (chat_turns, components_and_info, finish, message_text,
                                  messages_of, split_tagged, task_id_of)
from storage.ingest.registry import Format, Source, Unit, register, last_bytes
from storage.interchange import LineError

ROW_BATCH = 200


def trl_record(row: dict, traj_id: str, default_step: int, reward_cols: list[str]) -> dict:
    prompt, completion = row.get("prompt"), row.get("completion")
    prompt_msgs, completion_msgs = messages_of(prompt), messages_of(completion)
    if prompt_msgs is not None:
        prompt = "".join(f"{m['role']}: {message_text(m.get('content'))}\n" for m in prompt_msgs)
    if not isinstance(prompt, str):
        raise LineError(f"column 'prompt' must be text or chat messages, got "
                        f"{type(prompt).__name__}")
    if completion_msgs is None and not isinstance(completion, str):
        raise LineError(f"column 'completion' must be text or chat messages, got "
                        f"{type(completion).__name__}")
    notes: list[str] = []
    extra = {k: v for k, v in row.items() if k not in ("prompt", "completion", "step", "advantage",
                                                        "mode", "reward")}
    extra = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in extra.items()}
    components, info, success = components_and_info(extra, notes)
    total = row.get("reward")
    if not isinstance(total, (int, float)) or isinstance(total, bool) or not math.isfinite(total):
        total = sum(v for c in reward_cols if isinstance(v := row.get(c), (int, float))
                    and math.isfinite(v))
        notes.append("reward = sum of the reward-function columns")
    if completion_msgs is not None:
        turns, answer = chat_turns(completion_msgs), None
    else:
        turns, answer = split_tagged(completion)
    step = row.get("step", default_step)
    try:
        step = int(step)
    except (TypeError, ValueError):
        raise LineError(f"column 'step' must be an integer, got {step!r:.40}") from None
    rec = {"traj_id": traj_id, "task_id": task_id_of(prompt), "step": step, "prompt": prompt,
           "turns": turns, "reward": float(total),
           "split": "eval" if row.get("mode") == "eval" else "train"}
    advantage = row.get("advantage")
    if isinstance(advantage, (int, float)) and math.isfinite(advantage):
        rec["advantage"] = float(advantage)
    if answer is not None:
        rec["answer"], rec["finish_reason"] = answer, "answered"
    return finish(rec, components, info, success, notes)


@register
class Trl(Format):
    name = "trl"
    patterns = ("completions_*.parquet",)
    followed = "whole"
    rank = 10

    def detect(self, source: Path, first: Any) -> bool:
        if source.is_dir():
            return any(source.rglob("completions_*.parquet"))
        return source.suffix == ".parquet"

    def complete(self, fd: int) -> bool:
        return last_bytes(fd, 4) == b"PAR1"

    def where(self, src: Source, unit: Unit) -> str:
        return f"{src.name}:row {unit.number}" if unit.number >= 0 else src.name

    def units(self, fd: int, size: int, src: Source, max_line_bytes: int) -> Iterator[Unit]:
        """A unit per row, ``(values, reward columns)``; a file that is no readable Parquet
        or lacks the columns is one LineError (row -1)."""
        # deferred: pyarrow (large), only on the Arrow/Parquet path
        import pyarrow as pa
        import pyarrow.parquet as pq
        with os.fdopen(os.dup(fd), "rb") as f:
            try:
                parquet = pq.ParquetFile(f)
            except Exception as exc:
                yield Unit(LineError(f"not a readable Parquet file: {exc}"), number=-1)
                return
            schema = parquet.schema_arrow
            missing = [c for c in ("prompt", "completion") if c not in schema.names]
            if missing:
                yield Unit(LineError(f"missing column(s) {missing}; found {schema.names}"),
                           number=-1)
                return
            numeric = [f.name for f in schema if pa.types.is_integer(f.type)
                       or pa.types.is_floating(f.type)]
            reward_cols = [c for c in numeric if c not in ("step", "advantage", "reward")]
            if "reward" not in schema.names and not reward_cols:
                yield Unit(LineError("no reward column (neither 'reward' nor a numeric "
                                     "reward-function column)"), number=-1)
                return
            row, batches = 0, parquet.iter_batches(batch_size=ROW_BATCH)
            while True:
                try:
                    batch = next(batches, None)
                    if batch is None:
                        return
                    rows = batch.to_pandas().to_dict("records")
                except Exception as exc:  # a corrupt row group: the rest of this file fails
                    yield Unit(LineError(f"could not be read from row {row} on: "
                                         f"{type(exc).__name__}: {exc}"), number=-1)
                    return
                for values in rows:
                    yield Unit((values, reward_cols), number=row)
                    row += 1

    def records(self, raw: Any, src: Source, unit: Unit) -> dict:
        values, reward_cols = raw
        return trl_record(values, f"{src.ident}:{unit.number}", src.step, reward_cols)
