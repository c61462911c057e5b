"""Records of a followed file, read from an open descriptor, and their import into a run
(storage/ingest/follow.py): the importer's rules (storage/io.py: validate, one traj_id once, batches
written by storage/ingest/import_batch.py) for input that is not a whole file at a path -- a byte range
of an appended JSONL file, or a file already opened and checked to lie inside the directory.

Memory: lines come one at a time (storage/ingest/tail.py) and a batch is written once it holds
``BATCH_RECORDS`` records or ``BATCH_BYTES`` bytes of input, so what is held is one batch and one
line, however large the range or the file.
Ids and steps are the ones ``python -m storage.io import`` gives the same file: both ask the
same format (storage/ingest/registry.py) for the records of the same units (verl
``{stem}:{line}``, TRL ``{stem}:{row}``, ``messages`` ``{stem}:{byte offset}``).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from storage.ingest import tail
from storage.ingest.door import checked, failure, unit_items
from storage.ingest.import_batch import write_batch
from storage.ingest.registry import Format, Source, Unit
from storage.interchange import LineError, parse_json
from storage.token_rows import BatchSize

BATCH_RECORDS = 200
BATCH_BYTES = 8 << 20
Item = tuple[str, Any, int]  # (where, record or LineError, bytes of input it came from)


def appended_items(fmt: Format, fd: int, src: Source, start: int, stop: int,
                   max_line_bytes: int, until: int, progress: list) -> Iterator[Item]:
    """The records of the complete lines of ``[start, stop)`` of a file ``fmt`` appends a line
    at a time, ending with the line that reaches ``until``; ``progress`` is kept at [end offset
    of the last line taken, mark of the file up to it]. Each line is converted under the
    framework's guard (storage/ingest/door.py), named ``byte {offset}``."""
    marker = tail.Marker(fd, start)
    for at, end, line in tail.lines(fd, start, stop, max_line_bytes, marker.add):
        progress[:] = [end, marker.mark(end)]
        if line is None:
            yield (f"byte {at}", LineError(f"line longer than the limit of {max_line_bytes} "
                                           "bytes (--max-line-bytes)"), end - at)
        elif line.strip():
            unit = Unit(parse_json(line), at, 0, len(line))
            got = unit_items(fmt, src, unit, f"byte {at}")
            for where, rec in got:
                yield where, rec, len(line) // len(got)
        if end >= until:
            return


def whole_items(fmt: Format, fd: int, src: Source, size: int, max_line_bytes: int
                ) -> Iterator[Item]:
    """The records of a file followed whole once stable (verl, TRL, ART): the format's units
    of its first ``size`` bytes, as ``import`` reads them."""
    for unit in fmt.units(fd, size, src, max_line_bytes):
        got = unit_items(fmt, src, unit)
        for where, rec in got:
            yield where, rec, unit.size // max(len(got), 1)


def write_records(items: Iterable[Item], db_path, fmt: str, run_id: str, run: dict, report,
                  check: Callable[[], None] = lambda: None,
                  records: int = BATCH_RECORDS, then=None) -> bool:
    """Validate each record and write them in bounded batches into ``run_id``, counting into
    ``report`` (an ``ImportReport``); a bad record fails alone. ``check`` runs before each write
    (the follower's: is the store still the one it started with). ``records``: a batch's cap
    in trajectories, beside its caps in token rows and characters (storage/token_rows.py).
    ``then``: work for the last batch's transaction (storage/ingest/import_batch.py
    ``write_batch``); returns whether it ran there."""
    first_seen, batch, held, rows_held = {}, [], 0, BatchSize(records)
    for where, obj, size in items:
        report.lines += 1
        try:
            batch.append((where, checked(where, obj, first_seen, run)))
            held += size
            rows_held.add(batch[-1][1])
        except Exception as exc:  # whatever it raised: this item fails alone, named
            report.fail(where, str(failure(exc)))
        if rows_held.full() or held >= BATCH_BYTES:
            check()
            write_batch(db_path, run_id, fmt, run, batch, False, report)
            batch, held = [], 0
            rows_held.clear()
    if batch:
        check()
        return write_batch(db_path, run_id, fmt, run, batch, False, report, then)
    return False
