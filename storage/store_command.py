"""``agentrl store``: make a team store, move runs between stores, fold a team store's files.

    agentrl store init DIR --catalog sqlite|postgres:dbname=NAME host=HOST port=PORT [--data-path P]
    agentrl store copy SRC DST [--run RUN_ID ...]
    agentrl store fold DIR

A store is a path: a DuckDB file (the embedded store) or a directory made by ``store init`` (a
team store on DuckLake, storage/lake.py). ``copy`` takes either kind on either side and checks
its work: the md5 of every table's copied rows, read back from both stores, must agree.
"""
from __future__ import annotations

import argparse
import sys

from storage import lake, team_store
from storage.errors import StoreError
from storage.store_copy import copy, same_rows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentrl store", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    init = sub.add_parser("init", help="make a team store (a directory on DuckLake)")
    init.add_argument("dir")
    init.add_argument("--catalog", required=True,
                      help="'sqlite' (a catalog file in DIR, no server) or 'postgres:dbname=NAME "
                           "host=HOST port=PORT [user=USER]' (writers on several machines)")
    init.add_argument("--data-path", default=None,
                      help="where the Parquet files go (default DIR/data; an object store's URL "
                           "where DuckDB can reach it)")
    cp = sub.add_parser("copy", help="copy runs from SRC to DST, either kind, rows unchanged")
    cp.add_argument("src")
    cp.add_argument("dst")
    cp.add_argument("--run", action="append", default=None, dest="runs", metavar="RUN_ID",
                    help="a run to copy (repeat; default every run of SRC)")
    fold = sub.add_parser("fold", help="fold a team store's small files into larger ones")
    fold.add_argument("dir")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.what == "init":
            root = team_store.init(args.dir, args.catalog, args.data_path)
            print(f"team store made at {root}: pass it as --db, or list its folder in "
                  "AGENTRL_STORE_DIRS for the app")
        elif args.what == "copy":
            runs, rows = copy(args.src, args.dst, args.runs)
            if not runs:
                print(f"{args.src} holds no run: nothing copied")
                return 0
            differ = same_rows(args.src, args.dst, runs)
            if differ:
                print(f"copied, but the rows of {', '.join(differ)} differ between the stores",
                      file=sys.stderr)
                return 1
            print(f"copied {len(runs)} run(s) from {args.src} to {args.dst}: "
                  + ", ".join(f"{t} {n}" for t, n in rows.items() if n)
                  + "; every table's rows read back equal (md5)")
        else:
            counts = lake.fold(args.dir)
            print(f"{args.dir}: {counts['files_before']} data files before, "
                  f"{counts['files_after']} after")
    except StoreError as exc:
        print(f"agentrl store {args.what}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
