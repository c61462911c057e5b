"""The catalogue of import formats: importing this module imports every format's module, each
of which registers its format where it is defined (storage/ingest/registry.py ``@register``).
Adding a format is one new module behind the protocol, and one line here.

    jsonl       storage/ingest/generic.py          the generic trajectory format
    verl        storage/ingest/dumps.py            verl rollout dumps
    trl         storage/ingest/trl_dumps.py        TRL completion logs (Parquet)
    messages    storage/ingest/messages.py         OpenAI-style conversations
    art         storage/ingest/art_logs.py         OpenPipe ART trajectory logs
    verifiers   storage/ingest/verifiers_traces.py verifiers' traces.jsonl
    inspect     storage/ingest/inspect_import.py   Inspect AI logs (one run per task and model)
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from storage.ingest import (art_logs, dumps, generic, inspect_import, messages,  # noqa: F401
                            trl_dumps, verifiers_traces)
from storage.ingest.door import listing
from storage.ingest.registry import REGISTRY, Format
from storage.json_lines import read_json_lines

NAMES = ("jsonl", "verl", "trl", "inspect", "messages", "art", "verifiers")
"""Every import format's name, in the order the command line lists them."""
assert set(NAMES) == set(REGISTRY), "a format module is missing from the catalogue"


def get(name: str) -> Format:
    """The format named ``name``; ValueError naming the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; expected one of {NAMES}") from None


def _first_line(source: Path) -> Any:
    """The first parsed line of a JSON-lines file (of a folder: of its first ``*.jsonl``)."""
    if source.is_dir():  # its first file inside it (a link out of it is never opened)
        source = next((p for p in listing(source, ("*.jsonl",)) if isinstance(p, Path)), None)
        if source is None:
            return None
    elif source.suffix in (".parquet", ".eval"):
        return None
    try:
        for _, obj in read_json_lines(source):
            return obj
    except OSError:
        return None
    return None


def detect(source: Path) -> str:
    """The name of the format ``source`` (a file or a folder) is in: each format is asked in
    its ``rank`` order; the generic one answers last."""
    first = _first_line(source)
    for fmt in sorted(REGISTRY.values(), key=lambda f: (f.rank, f.name)):
        if fmt.detect(source, first):
            return fmt.name
    return "jsonl"
