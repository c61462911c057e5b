"""What an import did (``ImportReport``), and the run id a file imports into by default."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

MAX_REPORTED_ERRORS = 1000


@dataclass
class ImportReport:
    run_id: str
    source: str
    format: str
    lines: int = 0
    imported: int = 0
    skipped: int = 0
    replaced: int = 0
    rescored: int = 0
    """Of the skipped: trajectories whose scores the source changed and that took the new ones."""
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    def fail(self, where: str, message: str) -> None:
        self.failed += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(f"{where}: {message}")

    def summary(self) -> str:
        return (f"{self.source}: {self.lines} records read, {self.imported} imported, "
                f"{self.skipped} already present (skipped"
                + (f"; {self.rescored} of them rescored" if self.rescored else "")
                + f"), {self.replaced} replaced, "
                f"{self.failed} failed -> run {self.run_id}")


def default_run_id(source: Path) -> str:
    """``import-{name}-{hash of the resolved path}``: the same file imports into the same run."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", source.stem).strip("-._")[:40] or "file"
    digest = hashlib.sha1(str(source.resolve()).encode("utf-8", "replace")).hexdigest()[:8]
    return f"import-{slug}-{digest}"
