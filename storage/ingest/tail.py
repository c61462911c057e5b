"""A file another process is still writing, read with bounded memory: which file it is, whether
the bytes already taken from it are still there, where its complete lines end, and its lines one
at a time (storage/ingest/follow.py).

* **Identity** ``(st_dev, st_ino)``: a name whose identity changed names a new file (an atomic
  rename over it, logrotate's fresh file), however large.
* **Mark** of ``[0, end)``: SHA-1 of the first ``MARK_BYTES`` bytes and of the ``MARK_BYTES``
  bytes before ``end``, 16 hex digits. Appending leaves it unchanged; truncating, or rewriting
  the head or the bytes before ``end``, changes it. It costs two small reads whatever the size,
  so it can be checked on every change of an appended file; a rewrite keeping both ends of
  ``[0, end)`` byte for byte is the one it cannot see.
* **Digest** of ``[0, end)``: SHA-1 of all of it, read in ``CHUNK`` pieces, for files taken
  whole (verl, TRL), checked only when such a file changes after its import.
* Both are written into the ``imports`` row's source, ``{file}#{start}-{end}~{mark or digest}``,
  so a restarted follower checks the file it finds against what was imported.

Nothing here holds more than one line (at most ``max_line_bytes + 1`` bytes) or one ``CHUNK``.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Callable, Iterator

from storage import json_lines

CHUNK = 1 << 20
MARK_BYTES = 4096
SOURCE = re.compile(r"^(?P<file>.+)#(?P<start>\d+)-(?P<end>\d+)(?:~(?P<mark>[0-9a-f]{16}))?$")


class Outside(PermissionError):
    """A file whose real path is not inside the followed directory (a link out of it)."""


def identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _under(real: str, root_real: str) -> bool:
    return real.startswith(root_real.rstrip(os.sep) + os.sep)


def inside(path: Path, root_real: str) -> bool:
    """Whether ``path``'s real path (every link followed) lies inside the directory whose real
    path is ``root_real``."""
    return _under(os.path.realpath(path), root_real)


def open_inside(path: Path, root_real: str) -> int:
    """A read-only descriptor of the regular file ``path``, refused (``Outside``) when its real
    path is outside ``root_real``: checked before opening, so such a file is never opened, and on
    the open descriptor, so a link swapped in between is still caught before any read.
    Non-blocking, so a FIFO named like a dump cannot hang the follower."""
    if not inside(path, root_real):
        raise Outside(f"{path.name} links outside the followed directory")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path.name} is not a regular file")
        proc = f"/proc/self/fd/{fd}"
        if os.path.islink(proc) and not _under(os.readlink(proc), root_real):
            raise Outside(f"{path.name} links outside the followed directory")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _mark(head: bytes, before_end: bytes) -> str:
    return hashlib.sha1(head + b"|" + before_end).hexdigest()[:16]


def mark(fd: int, end: int) -> str:
    """Mark of ``[0, end)`` (module docstring) as the file is now; a file now shorter than
    ``end`` gets another."""
    n = min(end, MARK_BYTES)
    return _mark(os.pread(fd, n, 0), os.pread(fd, n, end - n))


class Marker:
    """The mark of ``[0, end)`` for bytes as they were read from ``start`` on: the head and the
    bytes before ``start`` are read first, the rest taken from what the reader got (``add``).
    A file rewritten meanwhile therefore gets a mark that matches neither version, so it is read
    again (duplicates are skipped), never one of the new bytes that were not read."""

    def __init__(self, fd: int, start: int):
        before = min(start, MARK_BYTES)
        self.head = os.pread(fd, MARK_BYTES, 0)
        self.last = os.pread(fd, before, start - before)

    def add(self, data: bytes) -> None:
        self.last = (self.last + data)[-MARK_BYTES:]

    def mark(self, end: int) -> str:
        n = min(end, MARK_BYTES)
        return _mark(self.head[:n], self.last[len(self.last) - n:])


def digest(fd: int, end: int) -> tuple[str, int]:
    """(SHA-1 of ``[0, end)``, 16 hex digits; number of newlines in it), one ``CHUNK`` at a time."""
    h, pos, lines = hashlib.sha1(), 0, 0
    while pos < end:
        buf = os.pread(fd, min(CHUNK, end - pos), pos)
        if not buf:
            break  # shorter now: the digest differs from the one of the full length
        h.update(buf)
        lines += buf.count(b"\n")
        pos += len(buf)
    return h.hexdigest()[:16], lines


def complete_end(fd: int, lo: int, hi: int) -> int | None:
    """The offset just after the last newline in ``[lo, hi)``, or None when there is none.
    Read backwards one ``CHUNK`` at a time: a finished append is found in the first chunk, and
    a caller that remembers ``hi`` of a fruitless search reads each byte of a line still being
    written only once."""
    pos = hi
    while pos > lo:
        start = max(lo, pos - CHUNK)
        at = os.pread(fd, pos - start, start).rfind(b"\n")
        if at >= 0:
            return start + at + 1
        pos = start
    return None


def lines(fd: int, start: int, stop: int, max_line_bytes: int,
          seen: Callable[[bytes], None] = lambda data: None
          ) -> Iterator[tuple[int, int, bytes | None]]:
    """(offset, end offset, line) of each complete line in ``[start, stop)`` (``stop`` just
    after a newline): storage/json_lines.py's bounded reader, which stops early if the file
    no longer holds a whole line where one was (it was rewritten meanwhile)."""
    return json_lines.lines(fd, start, stop, max_line_bytes, seen)


def source_name(file: str, start: int, end: int, check: str) -> str:
    return f"{file}#{start}-{end}~{check}"


def parse_source(source: str) -> tuple[str, int, int, str | None] | None:
    """(file, start, end, mark or digest) of a follower's ``imports`` source; the mark is None in
    rows written before marks were (``{file}#{start}-{end}``); None for a whole file's bare name
    (such rows are older still)."""
    m = SOURCE.match(source)
    return m and (m["file"], int(m["start"]), int(m["end"]), m["mark"])
