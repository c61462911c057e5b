"""The generic trajectory format, ``jsonl``: one trajectory per line, as storage/interchange.py
describes it and as ``export --format jsonl`` writes it (storage/export.py). Followed a
complete line at a time."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from storage.ingest.registry import Format, Source, Unit, register


@register
class Generic(Format):
    name = "jsonl"
    patterns = ("*.jsonl",)
    followed = "appended"
    rank = 1000  # what a JSON-lines file is when no other format claims it

    def detect(self, source: Path, first: Any) -> bool:
        return not source.is_dir()

    def where(self, src: Source, unit: Unit) -> str:
        return f"{src.name}: line {unit.number}" if src.in_folder else f"line {unit.number}"

    def export(self, db_path, run_id: str, out, filters) -> int:
        from storage.export import export_jsonl  # the store's reader: only when exporting
        return export_jsonl(db_path, run_id, out, filters)
