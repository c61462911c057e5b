"""What the job command lines (``core.jobs.branch``, ``core.jobs.evaluation``) print for the pages that
launch them: ``progress DONE/TOTAL`` lines (read by pages/_jobs.py ``progress_of``) and errors
on stderr with exit code 2."""
from __future__ import annotations

import sys
from typing import Callable


def progress_printer(unit: str) -> Callable[[int, int, int], None]:
    """A rollout progress callback printing ``progress DONE/TOTAL <unit> finished after N
    turns``, flushed so a page reading the log sees it at once."""
    def progress(done: int, total: int, rounds: int) -> None:
        print(f"progress {done}/{total} {unit} finished after {rounds} turns", flush=True)
    return progress


def fail(reason: Exception | str) -> int:
    """Print ``error: <reason>`` on stderr; the exit code a refused job returns (2)."""
    print(f"error: {reason}", file=sys.stderr)
    return 2
