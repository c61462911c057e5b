"""Rewrite a store file so that the DuckDB this project pins can read it.

    python tools/convert_store.py OLD.duckdb NEW.duckdb [--storage-version v1.4.0]

Run it with the DuckDB that wrote OLD (a newer one than the project's pin: DuckDB refuses to read
a file from a newer storage format, e.g. "version number 999"), for instance in a throwaway
environment: ``python -m venv /tmp/conv && /tmp/conv/bin/pip install duckdb==2.0.1 &&
/tmp/conv/bin/python tools/convert_store.py OLD.duckdb NEW.duckdb``. It copies every table,
row and the schema record into NEW, written in a storage format the pinned DuckDB reads, and
leaves OLD unchanged. It needs DuckDB alone, not the project.
"""
from __future__ import annotations

import argparse
import os
import sys

import duckdb


def convert(old: str, new: str, storage_version: str = "v1.4.0") -> None:
    if not os.path.isfile(old):
        raise SystemExit(f"convert_store: no file {old}")
    if os.path.exists(new):
        raise SystemExit(f"convert_store: {new} exists; name a new file")
    tmp = new + ".partial"
    if os.path.exists(tmp):
        os.remove(tmp)
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH '{old.replace(chr(39), chr(39) * 2)}' AS src (READ_ONLY)")
        con.execute(f"ATTACH '{tmp.replace(chr(39), chr(39) * 2)}' AS dst "
                    f"(STORAGE_VERSION '{storage_version}')")
        con.execute("COPY FROM DATABASE src TO dst")
        con.execute("DETACH dst")
    finally:
        con.close()
    os.replace(tmp, new)       # a file half written is never taken for a store


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--storage-version", default="v1.4.0",
                   help="the oldest DuckDB release that must read NEW (default v1.4.0)")
    args = p.parse_args(argv)
    convert(args.old, args.new, args.storage_version)
    print(f"{args.new} written with DuckDB {duckdb.__version__} for storage {args.storage_version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
