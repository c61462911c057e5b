"""``python -m core.clusters``: failure clusters of a run, the command line of
core/jobs/clusters.py."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from core.jobs.clusters import ENCODERS, run, write_progress
from core.jobs.clusters import __doc__ as _LIBRARY_DOC
from storage.db import StoreError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m core.clusters", description=_LIBRARY_DOC.split("\n")[0])
    ap.add_argument("--db", required=True, help="the store (DuckDB file)")
    ap.add_argument("--run", required=True, help="run id")
    ap.add_argument("--progress", help="JSON file the job keeps its progress in")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--encoder", choices=sorted(ENCODERS), default="static",
                    help="static: distilled token vectors (fast); minilm: the contextual model")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if not Path(args.db).is_file():
        print(f"error: no store at {args.db}", file=sys.stderr)
        return 2
    try:
        run(args.db, args.run, args.progress, args.threads, args.encoder)
    except (ValueError, StoreError, RuntimeError) as exc:
        write_progress(Path(args.progress) if args.progress else None, phase="failed", error=str(exc))
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
