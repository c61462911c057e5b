"""Import trajectories into a store, and export runs out of it.

    python -m storage.io import FILE --db PATH [--format jsonl|verl|trl|inspect|messages]
                                    [--run-name NAME] [--run-id ID] [--replace] [--split NAME]
    python -m storage.io follow DIR --db PATH --format verl|trl|jsonl|messages|inspect
                                    [--run-id ID] [--poll S] [--split NAME]
    python -m storage.io export --db PATH --run RUN_ID --out FILE [--format jsonl|parquet]
                                [--partitioned] [--split S] [--success true|false]
                                [--failure-class C] [--step-min N] [--step-max N]
    python -m storage.io export --db PATH --run RUN_ID --format otlp --endpoint URL [filters]
    python -m storage.io export --db PATH --run RUN_ID --format messages --out FILE [filters]
    filters also: [--tag TAG] [--sql "SELECT traj_id ..." | --where "reward > 0.5"]

The generic JSONL format is one trajectory per line (full description and rules:
storage/interchange.py), at its smallest::

    {"traj_id": "t1", "task_id": "q1", "prompt": "Who wrote Dune?",
     "turns": [{"action": "<answer>Frank Herbert</answer>", "observation": ""}],
     "reward": 1.0, "rewards": {"outcome": 1.0, "format": 0.0, "cost": 0.0, "process": 0.0}}

Import reads the input once, in a registered format (storage/ingest/formats.py lists them, one
module each, behind the protocol of storage/ingest/registry.py) through the framework every door
shares (storage/ingest/door.py), validating each record; every bad line or record is reported
with where it is and what is wrong, whatever the format's reader raised, and good ones still
import.
Valid trajectories are written in batches (storage/ingest/import_batch.py), each batch one transaction
holding all their rows (trajectories, rewards, turns, tokens, test results), so no trajectory is
ever half-written.
The run id is derived from the file's path unless ``--run-id`` is given, so a rerun imports into
the same run; trajectories already there (same ``traj_id``) are skipped, or replaced with
``--replace``. The store may already hold other runs (a trainer's, other imports): importing
under a run id none of them uses adds a run beside them and leaves theirs as they are; importing
into a run the trainer recorded is refused before anything is written (``--replace`` would
delete its trajectories). An import that stops part-way (an unreadable file, the store gone)
keeps what it wrote, and its run is marked ``failed`` with the reason and an ``imports`` row;
it is never left ``running``. Rows pass the recorder's cleaning (storage/recorder.py) on their
way in. Exit status 1 if any line failed, 2 if nothing could be read or the import stopped.

Follow (storage/ingest/follow.py) watches a directory another trainer writes into (verl's
``rollout_data_dir``, TRL's completions folder, an agent loop's JSONL or messages, an Inspect AI
log directory) and imports each new complete file, line or sample as it appears, until Ctrl-C.

Export (storage/export.py) writes one run, or a filtered selection of its trajectories, as
generic JSONL (export -> import round trips), as one flattened Parquet file, or with
``--partitioned`` as a hive-style Parquet directory partitioned by run and step; ``--format
messages`` writes a chat dataset with tool calls that TRL's SFTTrainer loads
(storage/chat_export.py).

Paths given on the command line are the user's own and are used as given; run ids are checked
(storage.recorder.check_run_id) before any directory is derived from them, and a run *name* is
only ever displayed.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Callable

import duckdb

from storage import db, export
from storage.ingest import formats
from storage.ingest.files import IMPORT_FORMATS, import_runs
from storage.ingest.follow import follow
from storage.interchange import MAX_LINE_BYTES
from storage.recorder import check_run_id, clean_text


# == command line ================================================================================
SPLIT_HELP = ("every trajectory's split, e.g. eval to compare it (default: the format's own: "
              "Inspect eval, TRL's mode, a verl folder named val*/validation*/eval* eval; else "
              "train)")
TOKENIZER_HELP = ("verifiers: the model's tokenizer.json (or its folder), to decode the token ids "
                  "into each token's text (default: the text is the id)")


def _tokenizer(args):
    """The tokenizer ``--tokenizer`` names, read without transformers; None without it."""
    if not getattr(args, "tokenizer", None):
        return None
    from storage.ingest.verifiers_traces import TokenizerFile
    return TokenizerFile(args.tokenizer)


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m storage.io",
                                     description="Import trajectories into a store; export runs.")
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="import a JSONL file, a verl dump, TRL completions, an "
                                        "Inspect AI log or OpenAI-style messages")
    imp.add_argument("file", help="file, or directory (verl {step}.jsonl / TRL completions / "
                                  "Inspect logs)")
    imp.add_argument("--db", required=True, help="the DuckDB store (created if missing)")
    imp.add_argument("--format", choices=IMPORT_FORMATS, help="default: guessed from the input")
    imp.add_argument("--run-name", help="name shown in the app (default: the file's name)")
    imp.add_argument("--run-id", help="run to import into (default: derived from the file path)")
    imp.add_argument("--replace", action="store_true",
                     help="replace trajectories already in the run (default: skip them)")
    imp.add_argument("--max-line-bytes", type=int, default=MAX_LINE_BYTES)
    imp.add_argument("--split", help=SPLIT_HELP)
    imp.add_argument("--tokenizer", help=TOKENIZER_HELP)
    fol = sub.add_parser("follow", help="import each new complete file of DIR as it appears, "
                                        "until Ctrl-C (verl rollout dumps, TRL completions, "
                                        "JSONL, messages, Inspect AI logs)")
    fol.add_argument("dir", help="the directory the other trainer writes into")
    fol.add_argument("--db", required=True, help="the DuckDB store (created if missing)")
    fol.add_argument("--format", choices=IMPORT_FORMATS, required=True)
    fol.add_argument("--run-name", help="name shown in the app (default: the directory's name; "
                                        "Inspect: the task and model)")
    fol.add_argument("--run-id", help="run to import into (default: the one `import DIR` uses; "
                                      "Inspect: the base of one run per task and model)")
    fol.add_argument("--poll", type=float, default=1.0, help="seconds between looks (default 1)")
    fol.add_argument("--max-line-bytes", type=int, default=MAX_LINE_BYTES,
                     help="a longer line fails alone, with a message (default 16 MiB)")
    fol.add_argument("--split", help=SPLIT_HELP)
    fol.add_argument("--tokenizer", help=TOKENIZER_HELP)
    exp = sub.add_parser("export", help="export a run (or a filtered selection) to JSONL/Parquet, "
                         "or send it as OpenTelemetry spans")
    exp.add_argument("--db", required=True)
    exp.add_argument("--run", help="run id (with --partitioned, default: every run)")
    exp.add_argument("--out", help="output file (directory with --partitioned)")
    exp.add_argument("--format", choices=("jsonl", "parquet", "otlp", "messages"),  # EXPORTS
                     default="jsonl", help="messages: a chat dataset with tool calls, one "
                                           "conversation per line, for TRL's SFTTrainer")
    exp.add_argument("--endpoint", help="otlp: the OTLP/HTTP traces URL (.../v1/traces)")
    exp.add_argument("--timeout", type=float, default=30.0,
                     help="otlp: seconds one request may take (default 30)")
    exp.add_argument("--partitioned", action="store_true",
                     help="Parquet directory partitioned by run and step (hive style)")
    exp.add_argument("--split", help="only trajectories of this split (train, eval, sft, ...)")
    exp.add_argument("--success", type=_bool, help="only successful (true) or failed (false)")
    exp.add_argument("--failure-class", help="only trajectories of this failure class")
    exp.add_argument("--step-min", type=int)
    exp.add_argument("--step-max", type=int)
    exp.add_argument("--tag", help="only trajectories tagged so (Failures page, Tags)")
    query = exp.add_mutually_exclusive_group()
    query.add_argument("--sql", help="only the traj_ids this read-only SELECT returns (the "
                                     "Failures page's SQL box rules and limits)")
    query.add_argument("--where", help="only trajectories meeting this SQL condition on the "
                                       "trajectories table, e.g. \"reward > 0.5\"")
    return parser


def _import(args) -> int:
    result = import_runs(args.file, args.db, args.format, args.run_name, args.run_id,
                         args.replace, max_line_bytes=args.max_line_bytes, split=args.split,
                         tokenizer=_tokenizer(args))
    for line in result.errors[:50]:  # whole inputs that could not be read (logs of a directory)
        print(f"error: {clean_text(line)}", file=sys.stderr)
    for report in result.reports:
        for line in report.errors[:50]:  # cleaned: a file name may be any bytes (surrogateescape)
            print(f"error: {clean_text(line)}", file=sys.stderr)
        if report.failed > 50:
            print(f"error: ... and {report.failed - 50} more", file=sys.stderr)
        print(clean_text(report.summary()))
    return 1 if result.errors or any(r.failed for r in result.reports) else 0


def _export(args) -> int:
    ids = None
    if args.sql is not None or args.where is not None:
        if not args.run:
            raise ValueError("--sql and --where select within one run: give --run")
        ids = export.ids_from_query(args.db, args.run, args.sql, args.where)
    filters = export.Filters(args.split, args.success, args.failure_class, args.step_min,
                             args.step_max, args.tag, ids)
    if args.partitioned:
        counts = export.export_partitioned(args.db, args.out, [args.run] if args.run else None,
                                           filters)
        print(f"wrote {counts.get('trajectories', 0)} trajectories "
              f"({sum(counts.values())} rows in all) to {args.out}")
        return 0
    if not args.run:
        raise ValueError("--run is required (except with --partitioned)")
    check_run_id(args.run)
    return EXPORTS[args.format](args, filters)


def _written(what: str, write: Callable) -> Callable:
    """An export to ``--out``: ``write(db, run, out, filters)`` gives the count of ``what``."""
    def run(args, filters) -> int:
        if not args.out:
            raise ValueError(f"--out is required with --format {args.format}")
        print(f"wrote {write(args.db, args.run, args.out, filters)} {what} to {args.out}")
        return 0
    return run


def _export_otlp(args, filters) -> int:
    """Send the run as spans; a bearer token, if the endpoint wants one, comes from the
    environment (AGENTRL_OTLP_TOKEN), never from the command line."""
    from storage.otlp_export import ExportError, export_otlp  # opentelemetry-proto, only here
    if not args.endpoint:
        raise ValueError("--endpoint is required with --format otlp (e.g. "
                         "http://127.0.0.1:4318/v1/traces)")
    try:
        sent, rejected = export_otlp(args.db, args.run, args.endpoint, filters,
                                     os.environ.get("AGENTRL_OTLP_TOKEN"), args.timeout)
    except ExportError as exc:
        raise ValueError(str(exc)) from exc
    print(f"sent {sent} trajectories to {args.endpoint}"
          + (f"; it rejected {rejected} spans" if rejected else ""))
    return 1 if rejected else 0


EXPORTS: dict[str, Callable] = {
    **{name: _written(formats.get(name).exported, formats.get(name).export)
       for name in formats.NAMES if formats.get(name).exports},
    "parquet": _written("trajectories", export.export_parquet),  # a table, not an import format
    "otlp": _export_otlp,                                         # sent, not written
}
"""``export --format``: every import format that writes itself back (storage/ingest/formats.py),
then the export-only ones."""


def _follow(args) -> int:
    """``python -m storage.io follow``: exit 0 on Ctrl-C/SIGTERM with a summary, 2 when the store
    went away."""
    stop = {"now": False}

    def ask_stop(signum, frame):
        stop["now"] = True

    previous = {s: signal.signal(s, ask_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    try:
        report = follow(args.dir, args.db, args.format, args.run_id, args.run_name, args.poll,
                        log=lambda m: print(m, flush=True), should_stop=lambda: stop["now"],
                        max_line_bytes=getattr(args, "max_line_bytes", MAX_LINE_BYTES),
                        split=getattr(args, "split", None), tokenizer=_tokenizer(args))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    print(clean_text(report.summary(time.monotonic() - started)), flush=True)
    return 2 if report.stopped else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "follow":
            return _follow(args)
        return _import(args) if args.command == "import" else _export(args)
    except (db.StoreError, OSError, ValueError, duckdb.Error) as exc:
        print(f"error: {clean_text(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:  # an import that stopped has its run marked failed: say why, briefly
        print(f"error: {args.command} stopped: {type(exc).__name__}: {clean_text(str(exc))}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
