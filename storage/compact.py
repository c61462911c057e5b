"""Rewrite a finished store into a compact file, for stores that are committed (sample_runs/).

    python -m storage.compact FILE.duckdb [FILE.duckdb ...]

A store written step by step keeps DuckDB's default 256 KiB blocks, partly filled, in every
table: a small run's file is mostly empty blocks (a 144-trajectory run: 3.2 MB). Copying the whole
database into a fresh file with small blocks keeps every table, row and the schema version and
shrinks such a file about sevenfold. Two block sizes are tried and the smaller file kept: 16 KiB
wastes least in a small store, but DuckDB then stores integer columns uncompressed (no
bit-packing), which in a store with many token rows costs more than larger blocks waste: 32 KiB
took the committed collapse_bandit.duckdb (840k tokens) from 10.6 MB to 6.7 MB, while the 0.4 MB
imported_greedy_lake.duckdb stays smaller with 16 KiB. The copies are written next to the
original and the smaller moved over it only when complete, under the store's write lock, so a
reader never sees half a file.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import duckdb

from storage import db

BLOCK_SIZES = (16384, 32768)
"""DuckDB's smallest block size, and the smallest that bit-packs integers (module docstring)."""
STORAGE_VERSION = "v" + ".".join(duckdb.__version__.split(".")[:2]) + ".0"
"""The storage format of the running DuckDB: a new file otherwise gets DuckDB's oldest default
format, without the newer compression (search_credit.duckdb: 19.4 MB as v1.0.0, 15.1 MB as
v1.5.0, both at 32 KiB blocks). The project's pinned DuckDB is the only reader it needs."""


def compact(path: str | Path) -> tuple[int, int]:
    """Rewrite ``path`` with small blocks; return (bytes before, bytes after)."""
    path = Path(path)
    if not path.is_file():
        raise db.StoreError(f"{path}: no such store")
    before = path.stat().st_size
    copies = [path.with_name(f"{path.name}.compact{i or ''}") for i in range(len(BLOCK_SIZES))]
    for tmp in copies:
        tmp.unlink(missing_ok=True)
    # Hold the store's exclusive turn (storage/db.py's advisory lock) for the copies and the move:
    # a trainer waits, and each copy is of one consistent state.
    with db._turn(path, exclusive=True, deadline=time.monotonic() + db.LOCK_TIMEOUT_S):
        try:
            for tmp, size in zip(copies, BLOCK_SIZES):
                _copy(path, tmp, size)
            smallest = min(copies, key=lambda p: p.stat().st_size)
            os.replace(smallest, path)
        finally:
            for tmp in copies:
                tmp.unlink(missing_ok=True)
    return before, path.stat().st_size


def _copy(path: Path, tmp: Path, block_size: int | None,
          storage_version: str = STORAGE_VERSION) -> None:
    """Every table, row and the schema record of ``path`` into a new file ``tmp``, written in
    ``storage_version`` (with ``block_size`` blocks, or DuckDB's default when None)."""
    blocks = "" if block_size is None else f"BLOCK_SIZE {block_size}, "
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH '{_quoted(path)}' AS src (READ_ONLY)")
        con.execute(f"ATTACH '{_quoted(tmp)}' AS dst ({blocks}"
                    f"STORAGE_VERSION '{storage_version}')")
        con.execute("COPY FROM DATABASE src TO dst")
    finally:
        con.close()


def convert(old: str | Path, new: str | Path, storage_version: str = "v1.4.0") -> None:
    """Copy store file ``old`` into a new file ``new`` in ``storage_version``, for a store written
    by a newer DuckDB than the pin (tools/convert_store.py runs this under the DuckDB that wrote
    it). ``old`` is left as it is; ``new`` appears only once complete."""
    old, new = Path(old), Path(new)
    if not old.is_file():
        raise db.StoreError(f"convert: no file {old}")
    if new.exists():
        raise db.StoreError(f"convert: {new} exists; name a new file")
    tmp = new.with_name(new.name + ".partial")
    tmp.unlink(missing_ok=True)
    _copy(old, tmp, None, storage_version)
    os.replace(tmp, new)       # a file half written is never taken for a store


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
