"""The JSON-lines door every importer reads through: lines read without loading a huge one,
parsed with NaN/Infinity refused, a file's reader that breaks off failing that file alone, and
the checks that bound what a parsed record costs (numbers a double cannot hold, the count of
JSON values). The trajectory format these lines carry: storage/interchange.py."""
from __future__ import annotations

import json
import math
import os
from collections import deque
from typing import Any, Callable, Iterator

MAX_LINE_BYTES = 16 * 1024 * 1024
MAX_RECORD_VALUES = 2_000_000


class LineError(ValueError):
    """What is wrong with one input line (the caller adds where it was)."""


# -- reading lines ---------------------------------------------------------------------------------
SKIP_CHUNK = 1 << 20


def lines(fd: int, start: int, stop: int, max_line_bytes: int,
          seen: Callable[[bytes], None] = lambda data: None, last_open: bool = False
          ) -> Iterator[tuple[int, int, bytes | None]]:
    """(offset, end offset, line) of each line in ``[start, stop)`` of the open file ``fd``: the
    one bounded line reader every door uses (import, follow). A line longer than
    ``max_line_bytes`` (newline not counted) comes as None: its bytes are skipped a MiB at a
    time, never held. A last line without a newline is given when ``last_open`` (a whole file
    being imported; ART writes its last line without one), else it ends the reading (a file
    still being written, or shorter now than where its newline was). Every byte read, skipped
    ones too, is passed to ``seen``."""
    with os.fdopen(os.dup(fd), "rb", buffering=SKIP_CHUNK) as f:
        f.seek(start)
        pos = start
        while pos < stop:
            line: bytes | None = f.readline(min(max_line_bytes + 1, stop - pos))
            if not line:
                return  # shorter than ``stop`` now
            seen(line)
            at = pos
            pos += len(line)
            if len(line) > max_line_bytes and not line.endswith(b"\n"):
                line = None
                while pos < stop and (more := f.readline(min(SKIP_CHUNK, stop - pos))):
                    seen(more)
                    pos += len(more)
                    if more.endswith(b"\n"):
                        break
            elif not line.endswith(b"\n") and not (last_open and pos >= stop):
                return  # no newline where one was: changed under us (or still being written)
            yield at, pos, line


def read_json_lines(path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object or LineError) for each non-blank line of the file ``path``;
    never loads a huge line (``lines``)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        for lineno, (_, _, line) in enumerate(lines(fd, 0, size, max_line_bytes,
                                                    last_open=True), 1):
            if line is None:
                yield lineno, LineError(f"line longer than the limit of {max_line_bytes} bytes")
            elif line.strip():
                yield lineno, parse_json(line)
    finally:
        os.close(fd)


def guarded(name: str, items: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """``items`` ((where, record or LineError) of one file named ``name``) until reading the file
    breaks off: any exception out of the reader (an unreadable file, a directory named like one,
    MemoryError) then ends it with one last item, (``name``, LineError saying why), so that file
    fails alone, named, and the import goes on with the next."""
    try:
        yield from items
    except Exception as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{exc}"
        yield name, LineError(f"could not be read: {type(exc).__name__}: {why}")


def _refuse_constant(name: str):
    raise LineError(f"{name} is not a JSON number")


def parse_json(line: bytes) -> Any:
    try:
        text = line.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        return LineError(f"not UTF-8 text (bad byte at offset {exc.start})")
    try:  # a lone surrogate escaped in a string (half an emoji) is kept: stored as U+FFFD
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        return LineError(f"not valid JSON: {exc.msg} at character {exc.pos + 1}")
    except LineError as exc:
        return exc
    except ValueError as exc:  # an integer of more than 4300 digits (Python's conversion limit)
        return LineError(f"not valid JSON: {exc}")
    except RecursionError:
        return LineError("JSON nested too deeply")
    except MemoryError:
        return LineError("out of memory parsing the line")


def refuse_non_finite(obj: Any) -> None:
    """LineError naming the first field holding a float no double holds (``1e999`` parses to inf).

    The C encoder finds out whether there is one; only then is the path looked for."""
    try:
        json.dumps(obj, allow_nan=False)
        return
    except ValueError:
        pass
    stack = deque([(obj, "")])
    while stack:
        value, where = stack.popleft()
        if isinstance(value, float) and not math.isfinite(value):
            raise LineError(f"field '{where}' must be a finite number (a double cannot hold it)")
        if isinstance(value, dict):
            stack += [(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, f"{where}[{i}]") for i, v in enumerate(value)]


def count_values(value: Any, limit: int) -> int:
    """JSON values in ``value`` (objects, lists and leaves), counted up to just past ``limit``."""
    stack, n = [value], 0
    while stack and n <= limit:
        v = stack.pop()
        n += 1
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return n


def refuse_many_values(obj: Any, where: str = "the record") -> None:
    """LineError when ``obj`` holds more than ``MAX_RECORD_VALUES`` JSON values: what a record
    costs past its parse is a few copies of each (about 100 bytes a value apiece), so the count,
    not the bytes, bounds it (16 MiB of ``[{},{},...]`` is 5.6M of them)."""
    if count_values(obj, MAX_RECORD_VALUES) > MAX_RECORD_VALUES:
        raise LineError(f"{where} holds more than {MAX_RECORD_VALUES} JSON values (objects, "
                        "lists, numbers, strings), the limit for one trajectory")
