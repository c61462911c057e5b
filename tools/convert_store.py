"""Rewrite a store file so that the DuckDB this project pins can read it.

    python tools/convert_store.py OLD.duckdb NEW.duckdb [--storage-version v1.4.0]

Run it with the DuckDB that wrote OLD (a newer one than the project's pin: DuckDB refuses to read
a file from a newer storage format, e.g. "version number 999"), for instance in a throwaway
environment: ``python -m venv /tmp/conv && /tmp/conv/bin/pip install duckdb==2.0.1 &&
/tmp/conv/bin/python tools/convert_store.py OLD.duckdb NEW.duckdb``. It copies every table,
row and the schema record into NEW (storage/compact.py's ``convert``), written in a storage
format the pinned DuckDB reads, and leaves OLD unchanged.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage import compact, db  # noqa: E402  (run as a script, from any directory)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--storage-version", default="v1.4.0",
                   help="the oldest DuckDB release that must read NEW (default v1.4.0)")
    args = p.parse_args(argv)
    try:
        compact.convert(args.old, args.new, args.storage_version)
    except db.StoreError as exc:
        raise SystemExit(f"convert_store: {exc}") from None
    print(f"{args.new} written with DuckDB {compact.duckdb.__version__} for storage "
          f"{args.storage_version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
