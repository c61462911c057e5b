"""Rewrite a finished store into a compact file, for stores that are committed (sample_runs/).

    python -m storage.compact FILE.duckdb [FILE.duckdb ...]

A store written step by step keeps DuckDB's default 256 KiB blocks, partly filled, in every
table: a small run's file is mostly empty blocks (a 144-trajectory run: 3.2 MB). Copying the whole
database into a fresh file with 16 KiB blocks keeps every table, row and the schema version and
shrinks such a file about sevenfold. The copy is written next to the original and moved over it
only when complete, under the store's write lock, so a reader never sees half a file.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import duckdb

from storage import db

BLOCK_SIZE = 16384
"""DuckDB's smallest block size; plenty for stores of a few thousand trajectories."""


def compact(path: str | Path) -> tuple[int, int]:
    """Rewrite ``path`` with small blocks; return (bytes before, bytes after)."""
    path = Path(path)
    if not path.is_file():
        raise db.StoreError(f"{path}: no such store")
    before = path.stat().st_size
    tmp = path.with_name(path.name + ".compact")
    tmp.unlink(missing_ok=True)
    # Hold the store's exclusive turn (storage/db.py's advisory lock) for the copy and the move:
    # a trainer waits, and the copy is of one consistent state.
    with db._turn(path, exclusive=True, deadline=time.monotonic() + db.LOCK_TIMEOUT_S):
        con = duckdb.connect()
        try:
            con.execute(f"ATTACH '{_quoted(path)}' AS src (READ_ONLY)")
            con.execute(f"ATTACH '{_quoted(tmp)}' AS dst (BLOCK_SIZE {BLOCK_SIZE})")
            con.execute("COPY FROM DATABASE src TO dst")
        finally:
            con.close()
        os.replace(tmp, path)
    return before, path.stat().st_size


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m storage.compact", description=__doc__.splitlines()[0])
    p.add_argument("stores", nargs="+", metavar="FILE.duckdb")
    args = p.parse_args(argv)
    for store in args.stores:
        try:
            before, after = compact(store)
        except (db.StoreError, duckdb.Error, OSError) as exc:
            print(f"error: {store}: {exc}", file=sys.stderr)
            return 1
        print(f"{store}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
