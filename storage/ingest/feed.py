"""Records of a followed file, read from an open descriptor, and their import into a run
(storage/ingest/follow.py): the importer's rules (storage/io.py: validate, one traj_id once, batches
written by storage/ingest/import_batch.py) for input that is not a whole file at a path -- a byte range
of an appended JSONL file, or a file already opened and checked to lie inside the directory.

Memory: lines come one at a time (storage/ingest/tail.py) and a batch is written once it holds
``BATCH_RECORDS`` records or ``BATCH_BYTES`` bytes of input, so what is held is one batch and one
line, however large the range or the file.
Ids and steps are the ones ``python -m storage.io import`` gives the same file (storage/ingest/dumps.py):
verl ``{stem}:{line}``, TRL ``{stem}:{row}``, the step from the last number in the name;
``messages`` ``{stem}:{byte offset}`` (storage/ingest/messages.py).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from storage.failures import classify
from storage.ingest import art_logs, tail
from storage.ingest.dumps import trl_record, verl_record
from storage.ingest.import_batch import write_batch
from storage.ingest.messages import messages_record
from storage.ingest.verifiers_traces import episode_records
from storage.interchange import LineError, parse_json, to_rows, validate
from storage.token_rows import BatchSize

APPENDED = ("jsonl", "messages", "verifiers")  # formats followed a complete line at a time
BATCH_RECORDS = 200
BATCH_BYTES = 8 << 20
Item = tuple[str, Any, int]  # (where, record or LineError, bytes of input it came from)


def step_of(stem: str) -> int:
    """The step a dump's file name gives (``12.jsonl``, ``completions_00012.parquet``): its last
    number, else 0 -- storage/ingest/dumps.py's rule, so following and importing agree."""
    digits = re.findall(r"\d+", stem)
    return int(digits[-1]) if digits else 0


def jsonl_items(fd: int, start: int, stop: int, max_line_bytes: int, until: int,
                progress: list, record: Callable[[Any, int], Any] | None = None
                ) -> Iterator[Item]:
    """Generic JSONL records of ``[start, stop)``, ending with the line that reaches ``until``;
    ``progress`` is kept at [end offset of the last line taken, mark of the file up to it].
    ``record(obj, offset)`` turns each parsed line into the generic record (another format's
    lines), or raises LineError; a list of them is a line holding several (a verifiers
    episode of several agents' traces), each yielded in turn."""
    marker = tail.Marker(fd, start)
    for at, end, line in tail.lines(fd, start, stop, max_line_bytes, marker.add):
        progress[:] = [end, marker.mark(end)]
        if line is None:
            yield (f"byte {at}", LineError(f"line longer than the limit of {max_line_bytes} "
                                           "bytes (--max-line-bytes)"), end - at)
        elif line.strip():
            got = _converted(parse_json(line), at, record)
            if isinstance(got, list):
                for k, rec in enumerate(got):
                    yield f"byte {at}[{k}]", rec, len(line) // len(got)
            else:
                yield f"byte {at}", got, len(line)
        if end >= until:
            return


def _converted(obj: Any, at: int, record: Callable[[Any, int], Any] | None) -> Any:
    if record is None or isinstance(obj, LineError):
        return obj
    try:
        return record(obj, at)
    except LineError as exc:
        return exc
    except Exception as exc:  # a reader tripping on one record fails that record only
        return LineError(f"could not be read: {type(exc).__name__}: {exc}")


def appended_items(fmt: str, fd: int, name: str, start: int, stop: int, max_line_bytes: int,
                   until: int, progress: list, tokenizer=None) -> Iterator[Item]:
    """``jsonl_items`` of a file appended line by line in ``fmt`` (``APPENDED``): generic JSONL,
    or OpenAI-style conversations (storage/ingest/messages.py) with the trajectory ids
    ``import`` gives them, ``{file stem}:{byte offset of the line}``."""
    if fmt == "jsonl":
        return jsonl_items(fd, start, stop, max_line_bytes, until, progress)
    if fmt == "verifiers":  # an episode a line, its traces' own ids
        return jsonl_items(fd, start, stop, max_line_bytes, until, progress,
                           lambda obj, at: episode_records(obj, tokenizer))
    stem = Path(name).stem
    return jsonl_items(fd, start, stop, max_line_bytes, until, progress,
                       lambda obj, at: messages_record(obj, f"{stem}:{at}"))


def verl_items(fd: int, name: str, size: int, max_line_bytes: int) -> Iterator[Item]:
    """verl samples of the file's first ``size`` bytes, as storage/ingest/dumps.py's ``read_verl``."""
    stem = Path(name).stem
    for lineno, (at, end, line) in enumerate(tail.lines(fd, 0, size, max_line_bytes), 1):
        where = f"{name}:{lineno}"
        if line is None:
            yield where, LineError(f"line longer than the limit of {max_line_bytes} bytes"), 0
            continue
        if not line.strip():
            continue
        obj = _converted(parse_json(line), lineno,
                         lambda o, n: verl_record(o, f"{stem}:{n}", step_of(stem)))
        yield where, obj, len(line)


def art_items(fd: int, name: str, size: int, max_line_bytes: int, folder: str
              ) -> Iterator[Item]:
    """The trajectories of an ART log file (storage/ingest/art_logs.py) in ``folder`` (its
    split), as ``read_art`` gives them."""
    step, split = step_of(Path(name).stem), art_logs.art_split(folder)
    lineno, done = 0, 0
    for lineno, (at, done, line) in enumerate(tail.lines(fd, 0, size, max_line_bytes), 1):
        yield from _art_line(line, f"{folder}/{name}:{lineno}", name, lineno, step, split,
                             max_line_bytes)
    if done < size:  # ART's last line has no newline
        line = os.pread(fd, size - done, done) if size - done <= max_line_bytes else None
        yield from _art_line(line, f"{folder}/{name}:{lineno + 1}", name, lineno + 1, step,
                             split, max_line_bytes)


def _art_line(line: bytes | None, where: str, name: str, lineno: int, step: int, split: str,
              max_line_bytes: int) -> Iterator[Item]:
    """The records of one line of an ART log (a LineError alone for a line over the limit)."""
    if line is None:
        yield where, LineError(f"line longer than the limit of {max_line_bytes} bytes"), 0
        return
    obj = parse_json(line) if line.strip() else None
    records = [obj] if isinstance(obj, LineError) else [] if obj is None else \
        art_logs.art_records(obj, Path(name).stem, lineno, step, split)
    for k, rec in enumerate(records):
        yield f"{where}[{k}]", rec, len(line) // max(len(records), 1)


def whole_items(fmt: str, fd: int, name: str, size: int, max_line_bytes: int, folder: str
                ) -> Iterator[Item]:
    """The records of a file followed whole once stable: verl, TRL or ART (``folder``: the
    followed directory's name, ART's split)."""
    if fmt == "verl":
        return verl_items(fd, name, size, max_line_bytes)
    if fmt == "art":
        return art_items(fd, name, size, max_line_bytes, folder)
    return trl_items(fd, name)


def trl_items(fd: int, name: str) -> Iterator[Item]:
    """TRL completions of a Parquet file, as storage/ingest/dumps.py's ``read_trl``, a row group
    batch at a time instead of the whole table."""
    # deferred: pyarrow (large), only on the Arrow/Parquet path
    import pyarrow as pa
    import pyarrow.parquet as pq
    stem = Path(name).stem
    with os.fdopen(os.dup(fd), "rb") as f:
        try:
            parquet = pq.ParquetFile(f)
        except Exception as exc:
            yield name, LineError(f"not a readable Parquet file: {exc}"), 0
            return
        schema = parquet.schema_arrow
        missing = [c for c in ("prompt", "completion") if c not in schema.names]
        if missing:
            yield name, LineError(f"missing column(s) {missing}; found {schema.names}"), 0
            return
        numeric = [f.name for f in schema if pa.types.is_integer(f.type)
                   or pa.types.is_floating(f.type)]
        reward_cols = [c for c in numeric if c not in ("step", "advantage", "reward")]
        if "reward" not in schema.names and not reward_cols:
            yield name, LineError("no reward column (neither 'reward' nor a numeric "
                                  "reward-function column)"), 0
            return
        row, batches = 0, parquet.iter_batches(batch_size=BATCH_RECORDS)
        while True:
            try:
                batch = next(batches, None)
                if batch is None:
                    return
                rows = batch.to_pandas().to_dict("records")
            except Exception as exc:  # a corrupt row group: the rest of this file fails, named
                yield name, LineError(f"could not be read from row {row} on: "
                                      f"{type(exc).__name__}: {exc}"), 0
                return
            for values in rows:
                where = f"{name}:row {row}"
                yield where, _converted(values, row, lambda v, n: trl_record(
                    v, f"{stem}:{n}", step_of(stem), reward_cols)), 0
                row += 1


def write_records(items: Iterable[Item], db_path, fmt: str, run_id: str, run: dict, report,
                  check: Callable[[], None] = lambda: None,
                  records: int = BATCH_RECORDS) -> None:
    """Validate each record and write them in bounded batches into ``run_id``, counting into
    ``report`` (an ``ImportReport``); a bad record fails alone. ``check`` runs before each write
    (the follower's: is the store still the one it started with). ``records``: a batch's cap
    in trajectories, beside its caps in token rows and characters (storage/token_rows.py)."""
    first_seen, batch, held, rows_held = {}, [], 0, BatchSize(records)
    for where, obj, size in items:
        report.lines += 1
        try:
            if isinstance(obj, LineError):
                raise obj
            rec = validate(obj)
            if rec["traj_id"] in first_seen:
                raise LineError(f"duplicate traj_id {rec['traj_id']!r} "
                                f"(first at {first_seen[rec['traj_id']]})")
            first_seen[rec["traj_id"]] = where
            if run["config"] is None and "run" in rec:
                run["config"] = rec["run"]
            batch.append((where, to_rows(rec, classify)))
            held += size
            rows_held.add(batch[-1][1])
        except LineError as exc:
            report.fail(where, str(exc))
        except Exception as exc:  # a reader or rule tripping on a record fails that one only
            report.fail(where, f"could not be read: {type(exc).__name__}: {exc}")
        if rows_held.full() or held >= BATCH_BYTES:
            check()
            write_batch(db_path, run_id, fmt, run, batch, False, report)
            batch, held = [], 0
            rows_held.clear()
    if batch:
        check()
        write_batch(db_path, run_id, fmt, run, batch, False, report)
