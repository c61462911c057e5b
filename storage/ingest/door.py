"""The framework every import door goes through (``import``, ``follow``, the trainer-side
recorders): what each format would otherwise have to get right on its own, written once.

* **One item fails alone, named.** A format's conversion of a unit (``Format.records``) runs
  under a guard: whatever it raises (a LineError, a TypeError on a ``null`` where a number
  was, an OverflowError, MemoryError, RecursionError) becomes that item's error, named by
  file and line (or row, byte offset, rollout), and the next item is read. A reader that
  breaks off mid-file (an unreadable file) fails that file alone (``guarded``).
* **Bounds.** Lines are read by one bounded reader (storage/json_lines.py ``lines``: at most
  ``--max-line-bytes`` held, a longer line skipped a MiB at a time); JSON nesting is bounded
  by the parser (RecursionError is that line's error); a unit gives at most ``MAX_ITEMS``
  records; a record holds at most ``MAX_RECORD_VALUES`` JSON values and its sizes are capped
  (storage/interchange.py ``validate``, which every record passes).
* **Folders.** ``import DIR`` reads only files whose real path is inside DIR: a link out of it
  is refused, named, and never opened (``follow`` refuses the same, storage/ingest/tail.py);
  a FIFO named like a dump is not waited on.
* **Numbers and token ids** (``number``, ``token_ids``): a boolean is not a number, a float
  or a boolean is not a token id, a number a double cannot hold is refused, and token ids
  are checked against the tokenizer's vocabulary whatever its kind (storage/token_text.py).
"""
from __future__ import annotations

import errno
import fnmatch
import os
import stat
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from storage.failures import classify
from storage.ingest import tail
from storage.ingest.registry import Format, Records, Source, Unit
from storage.interchange import number, to_rows, validate  # noqa: F401 (number: the formats')
from storage.json_lines import LineError, guarded

MAX_ITEMS = 10_000
"""Records one unit (a line) may give: a verifiers episode's traces, an ART group's
trajectories."""
Item = tuple[str, Any]  # (where, generic record or LineError)


# -- one item fails alone ---------------------------------------------------------------------
def failure(exc: BaseException) -> LineError:
    """The LineError an item gets for ``exc``: itself, or what raised it and why."""
    if isinstance(exc, LineError):
        return exc
    if isinstance(exc, RecursionError):
        return LineError("could not be read: nested too deeply")
    return LineError(f"could not be read: {type(exc).__name__}: {str(exc)[:500]}")


def convert(where: str, make: Callable[[], Any]) -> list[Item]:
    """``make()``'s records, each with where it came from (``where``, ``where[k]`` for a unit
    giving several); anything ``make`` or an entry's own maker raises becomes that item's
    LineError."""
    try:
        got = make()
    except Exception as exc:
        return [(where, failure(exc))]
    if not isinstance(got, Records):
        return [(where, got)]
    if len(got) > MAX_ITEMS:
        return [(where, LineError(f"{len(got)} records in one line, over the limit of "
                                  f"{MAX_ITEMS}"))]
    out = []
    for k, item in enumerate(got):
        if callable(item):
            try:
                item = item()
            except Exception as exc:
                item = failure(exc)
        out.append((f"{where}[{k}]", item))
    return out


def unit_items(fmt: Format, src: Source, unit: Unit, where: str | None = None) -> list[Item]:
    """The items of one unit of ``fmt``: its LineError, or its records, converted under the
    guard."""
    where = where or fmt.where(src, unit)
    if isinstance(unit.raw, LineError):
        return [(where, unit.raw)]
    return convert(where, lambda: fmt.records(unit.raw, src, unit))


def checked(where: str, obj: Any, first_seen: dict[str, str], run: dict) -> dict:
    """The table rows of one item, every door's rules applied: its LineError raised, the record
    validated (storage/interchange.py), a ``traj_id`` taken once per import (``first_seen``:
    id -> where), the run's configuration from the first record that has one. Raises for an
    item that fails; the caller reports it (``failure``) and goes on."""
    if isinstance(obj, LineError):
        raise obj
    rec = validate(obj)
    if rec["traj_id"] in first_seen:
        raise LineError(f"duplicate traj_id {rec['traj_id']!r} "
                        f"(first at {first_seen[rec['traj_id']]})")
    first_seen[rec["traj_id"]] = where
    if run["config"] is None and "run" in rec:
        run["config"] = rec["run"]
    return to_rows(rec, classify)


# -- files of a folder ------------------------------------------------------------------------
class Refused:
    """A file of a folder that is not read: why, said once, as that file's error."""

    def __init__(self, path: Path, why: str):
        self.path, self.why = path, why


def listing(source: Path, patterns: tuple[str, ...], recursive: bool = True
            ) -> list[Path | Refused]:
    """The files of ``source`` (a folder) whose names match ``patterns``, sorted by depth then
    path; a match whose real path lies outside ``source`` (a link out of it) as ``Refused``.
    Linked folders are not descended into."""
    root_real = os.path.realpath(source)
    found: list[Path | Refused] = []
    for folder, dirs, names in os.walk(source, followlinks=False):
        dirs.sort()
        for name in names + dirs:  # a folder named like a file fails alone, named
            if name.startswith(".") or not any(fnmatch.fnmatch(name, p) for p in patterns):
                continue
            path = Path(folder) / name
            if not tail.inside(path, root_real):
                found.append(Refused(path, "links outside the imported folder: never opened"))
            else:
                found.append(path)
        if not recursive:
            break
    return sorted(found, key=lambda p: _key(p.path if isinstance(p, Refused) else p))


def _key(path: Path) -> tuple:
    return len(path.parts), str(path)


def open_file(path: Path, root_real: str | None) -> int:
    """A read-only descriptor of the regular file ``path``; inside ``root_real`` when given
    (storage/ingest/tail.py ``open_inside``). Non-blocking: a FIFO is refused, not waited on."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path.name)
    if root_real is not None:
        return tail.open_inside(path, root_real)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path.name} is not a regular file")
    return fd


def source_of(file: Path, root: Path | None, tokenizer=None) -> Source:
    """What a format's records know of ``file``, imported alone (``root`` None) or as part of
    the folder ``root``."""
    if root is None:
        return Source(file.name, file.stem, (file.resolve().parent.name,), tokenizer)
    rel = file.relative_to(root)
    return Source(file.name, rel.with_suffix("").as_posix(),
                  (root.resolve().name, *rel.parts[:-1]), tokenizer, in_folder=True)


def read(fmt: Format, source: Path, max_line_bytes: int, tokenizer=None) -> Iterator[Item]:
    """(where, generic record or LineError) of every item of ``source`` (a file, or a folder
    of ``fmt``'s files): the framework's rules above, for ``import``."""
    if not source.is_dir():
        src = source_of(source, None, tokenizer)
        yield from guarded(source.name, _file(fmt, source, None, src, max_line_bytes))
        return
    root_real = os.path.realpath(source)
    for entry in listing(source, fmt.patterns, fmt.recursive):
        if isinstance(entry, Refused):
            yield entry.path.name, LineError(entry.why)
            continue
        src = source_of(entry, source, tokenizer)
        yield from guarded(entry.name, _file(fmt, entry, root_real, src, max_line_bytes))


def _file(fmt: Format, path: Path, root_real: str | None, src: Source, max_line_bytes: int
          ) -> Iterator[Item]:
    fd = open_file(path, root_real)
    try:
        for unit in fmt.units(fd, os.fstat(fd).st_size, src, max_line_bytes):
            yield from unit_items(fmt, src, unit)
    finally:
        os.close(fd)


# -- numbers and token ids --------------------------------------------------------------------
# ``number`` (a finite float, else LineError naming the field) is storage/interchange.py's, the
# one check the generic record's ``num`` fields and every format's numbers share.
MAX_TOKEN_ID = 2**31 - 1


def token_ids(values: Any, field: str = "token_ids") -> np.ndarray:
    """``values`` (a list, tuple or integer array of token ids) as an int64 array, else
    LineError naming the first bad entry: a float or a boolean is not a token id, nor is one
    outside [0, 2^31)."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "iu":
            raise LineError(f"field '{field}' must hold integers, got {values.dtype}")
        arr = values.astype(np.int64, copy=False).reshape(-1)
    else:
        if not isinstance(values, (list, tuple)):
            raise LineError(f"field '{field}' must be a list of token ids, got "
                            f"{'null' if values is None else type(values).__name__}")
        for k, v in enumerate(values):
            if type(v) is not int and not (isinstance(v, (int, np.integer))
                                           and not isinstance(v, (bool, np.bool_))):
                raise LineError(f"field '{field}[{k}]' must be an integer token id, got "
                                f"{type(v).__name__}")
            if not 0 <= v <= MAX_TOKEN_ID:
                raise LineError(f"field '{field}[{k}]' must be a token id between 0 and "
                                f"2^31-1, got {v if abs(v) < 10**20 else 'a larger one'}")
        arr = np.asarray(values, np.int64).reshape(-1)
    bad = np.flatnonzero((arr < 0) | (arr > MAX_TOKEN_ID))
    if len(bad):
        raise LineError(f"field '{field}[{bad[0]}]' must be a token id between 0 and 2^31-1, "
                        f"got {int(arr[bad[0]])}")
    return arr
