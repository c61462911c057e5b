"""The import format protocol and its registry: every door in (``import``, ``follow``) reads a
format only through this interface, and a format is registered in its own module with
``@register``. The catalogue that imports every format module is storage/ingest/formats.py;
the framework that calls them, and keeps the rules every door must keep, is
storage/ingest/door.py.

A format says *what* its records are; the framework owns *how* they are read safely: opening
files (links out of an imported folder refused), the one bounded line reader, each item
converted under a guard (anything it raises fails that item alone, named), and the bounds.

    @register
    class Verl(Format):
        name = "verl"
        patterns = ("*.jsonl",)
        followed = "whole"
        def records(self, raw, src, unit): return verl_record(raw, ...)
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from storage import json_lines
from storage.json_lines import LineError

REGISTRY: dict[str, "Format"] = {}


@dataclass
class Source:
    """One file of a format being read, as its records need to know it."""
    name: str                    # the file's name
    ident: str                   # its path under the imported folder, without suffix (ids)
    folders: tuple[str, ...]     # folder names from the imported one down to the file's
    tokenizer: Any = None        # decodes token ids into text (verifiers), or None
    in_folder: bool = False      # read as one file of an imported folder

    @property
    def stem(self) -> str:
        return Path(self.name).stem

    @property
    def folder(self) -> str:
        """The name of the folder the file is in."""
        return self.folders[-1] if self.folders else ""

    @property
    def step(self) -> int:
        """The last number in the file's name (``12.jsonl``, ``completions_00012.parquet``)."""
        digits = re.findall(r"\d+", self.stem)
        return int(digits[-1]) if digits else 0


@dataclass
class Unit:
    """One unit of input (a line, a Parquet row): its parsed value or a LineError, where it is
    (byte offset ``at``, 1-based ``number``) and the bytes it came from."""
    raw: Any
    at: int = 0
    number: int = 0
    size: int = 0


class Records(list):
    """Several records from one unit (a verifiers episode's traces, an ART group's
    trajectories): what ``Format.records`` returns for them, so that a unit that *is* a JSON
    list is never taken for several records."""


class Format:
    """One import format. Subclass it, set the attributes, override what differs, and
    decorate the class with ``@register`` in the format's own module."""

    name: str = ""
    patterns: tuple[str, ...] = ("*.jsonl",)
    """Its files in a folder: ``import DIR`` looks for them, ``follow DIR`` watches them."""
    recursive: bool = True
    """``import DIR`` looks in the folders below DIR too (``follow`` only in DIR itself)."""
    followed: str = "appended"
    """How ``follow`` takes a file: ``appended`` a complete line at a time, ``whole`` once it
    is stable and ``complete``, ``log`` by the format's own poller (Inspect)."""
    rank: int = 100
    """Order in which ``detect`` is asked (lower first); the generic format answers last."""
    exported: str = "trajectories"
    """What ``export`` counts, in the message it prints."""
    multi_run: bool = False
    """A file may hold several runs: ``import_runs`` is the format's own (Inspect)."""

    # -- what a format may override --------------------------------------------------------
    def detect(self, source: Path, first: Any) -> bool:
        """Whether ``source`` (a file or a folder) is of this format; ``first`` is the first
        parsed line of a JSON-lines file (None for a folder or another kind of file)."""
        return False

    def units(self, fd: int, size: int, src: Source, max_line_bytes: int) -> Iterator[Unit]:
        """The units of ``[0, size)`` of the open file ``fd``: by default JSON lines, read by
        the framework's bounded reader."""
        return json_units(fd, 0, size, max_line_bytes, last_open=True)

    def records(self, raw: Any, src: Source, unit: Unit) -> Any:
        """The generic record (storage/interchange.py) of one parsed unit, or ``Records`` (a
        unit holding several); an entry of ``Records`` may be a function of no arguments that
        makes the record, so that what it raises fails that entry alone. Raise anything for a
        unit that is not one: the framework names it."""
        return raw

    def where(self, src: Source, unit: Unit) -> str:
        """How an error names the unit."""
        return f"{src.name}:{unit.number}"

    def complete(self, fd: int) -> bool:
        """Whether the open file ends as a finished file of the format does (``follow``,
        ``whole`` formats): by default with a newline."""
        return last_bytes(fd, 1) == b"\n"

    def own_split(self, folders: tuple[str, ...]) -> str | None:
        """The split every record of a file under ``folders`` has, when the folder says it
        (verl's validation dumps); None: the records' own."""
        return None

    def import_runs(self, source: Path, db_path, run_name: str | None, run_id: str | None,
                    replace: bool, live: bool, split: str | None):
        """A ``multi_run`` format's own import: (reports, errors)."""
        raise NotImplementedError(f"{self.name} is read through the framework")

    def export(self, db_path, run_id: str, out, filters) -> int:
        """Write one run (or the ``filters``' selection) in this format; the count written."""
        raise NotImplementedError(f"{self.name} has no export")

    @property
    def exports(self) -> bool:
        return type(self).export is not Format.export


def json_units(fd: int, start: int, stop: int, max_line_bytes: int, last_open: bool = False,
               seen=lambda data: None) -> Iterator[Unit]:
    """A unit per non-blank line of ``[start, stop)``: the parsed JSON, or a LineError for a
    line that is not JSON or is longer than ``max_line_bytes`` (storage/json_lines.py's bounded
    reader and parser, the one every door reads lines with)."""
    for number, (at, end, line) in enumerate(
            json_lines.lines(fd, start, stop, max_line_bytes, seen, last_open), 1):
        if line is None:
            yield Unit(LineError(f"line longer than the limit of {max_line_bytes} bytes "
                                 "(--max-line-bytes)"), at, number, end - at)
        elif line.strip():
            yield Unit(json_lines.parse_json(line), at, number, len(line))


def last_bytes(fd: int, n: int) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, n, max(size - n, 0)) if size else b""


def register(cls: type[Format]) -> type[Format]:
    """Class decorator: one instance of ``cls`` is the format named ``cls.name``."""
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"format name {cls.name!r} is empty or taken")
    REGISTRY[cls.name] = cls()
    return cls
