"""Import trajectories into a store, and export runs out of it.

    python -m storage.io import FILE --db PATH [--format jsonl|verl|trl|inspect|messages]
                                    [--run-name NAME] [--run-id ID] [--replace]
    python -m storage.io follow DIR --db PATH --format verl|trl|jsonl [--run-id ID] [--poll S]
    python -m storage.io export --db PATH --run RUN_ID --out FILE [--format jsonl|parquet]
                                [--partitioned] [--split S] [--success true|false]
                                [--failure-class C] [--step-min N] [--step-max N]

The generic JSONL format is one trajectory per line (full description and rules:
storage/interchange.py), at its smallest::

    {"traj_id": "t1", "task_id": "q1", "prompt": "Who wrote Dune?",
     "turns": [{"action": "<answer>Frank Herbert</answer>", "observation": ""}],
     "reward": 1.0, "rewards": {"outcome": 1.0, "format": 0.0, "cost": 0.0, "process": 0.0}}

Import (the verl and TRL readers are in storage/dumps.py, OpenAI-style ``messages`` JSONL in
storage/messages.py; Inspect AI logs, one run per task and model, in storage/inspect_import.py)
reads the input once, validating each line; every bad line is reported with where it is and what
is wrong, and good lines still import.
Valid trajectories are written in batches (storage/import_batch.py), each batch one transaction
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

Follow (storage/follow.py) watches a directory another trainer writes into (verl's
``rollout_data_dir``, TRL's completions folder, an agent loop's JSONL) and imports each new
complete file or line as it appears, until Ctrl-C.

Export (storage/export.py) writes one run, or a filtered selection of its trajectories, as
generic JSONL (export -> import round trips), as one flattened Parquet file, or with
``--partitioned`` as a hive-style Parquet directory partitioned by run and step.

Paths given on the command line are the user's own and are used as given; run ids are checked
(storage.recorder.check_run_id) before any directory is derived from them, and a run *name* is
only ever displayed.
"""
from __future__ import annotations

import argparse
import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import duckdb

from storage import db
from storage.dumps import READERS
from storage.import_batch import (  # noqa: F401 (RunNotImportable re-exported)
    RunNotImportable, finish_import, refuse_foreign, run_source, write_batch)
from storage.interchange import MAX_LINE_BYTES, LineError, read_json_lines, to_rows, validate
from storage.messages import read_messages
from storage.migrations import prepare
from storage.recorder import check_run_id, clean_text

FORMATS = ("jsonl", "verl", "trl")
IMPORT_FORMATS = FORMATS + ("inspect", "messages")
IMPORT_READERS = {**READERS, "messages": read_messages}
INSPECT_JSON = re.compile(rb'^\s*\{\s*"version"\s*:\s*\d+\s*,\s*"status"\s*:')
MAX_REPORTED_ERRORS = 1000


# == import ======================================================================================
@dataclass
class ImportReport:
    run_id: str
    source: str
    format: str
    lines: int = 0
    imported: int = 0
    skipped: int = 0
    replaced: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    def fail(self, where: str, message: str) -> None:
        self.failed += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(f"{where}: {message}")

    def summary(self) -> str:
        return (f"{self.source}: {self.lines} records read, {self.imported} imported, "
                f"{self.skipped} already present (skipped), {self.replaced} replaced, "
                f"{self.failed} failed -> run {self.run_id}")


def default_run_id(source: Path) -> str:
    """``import-{name}-{hash of the resolved path}``: the same file imports into the same run."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", source.stem).strip("-._")[:40] or "file"
    digest = hashlib.sha1(str(source.resolve()).encode("utf-8", "replace")).hexdigest()[:8]
    return f"import-{slug}-{digest}"


def guess_format(source: Path) -> str:
    if source.is_dir():
        if any(source.rglob("completions_*.parquet")):
            return "trl"
        if any(source.rglob("*.eval")):
            return "inspect"
        return "verl"
    if source.suffix == ".parquet":
        return "trl"
    if source.suffix == ".eval":
        return "inspect"
    if source.suffix == ".json":
        with open(source, "rb") as f:  # an Inspect JSON log starts {"version": 2, "status": ...
            if INSPECT_JSON.match(f.read(256)):
                return "inspect"
    for _, obj in read_json_lines(source):  # sniff the first line
        if isinstance(obj, dict) and {"input", "output", "score"} <= obj.keys() \
                and "traj_id" not in obj:
            return "verl"
        if isinstance(obj, list) or (isinstance(obj, dict) and "messages" in obj
                                     and "turns" not in obj):
            return "messages"
        break
    return "jsonl"


def _read_generic(path: Path, max_line_bytes: int) -> Iterator[tuple[str, Any]]:
    for lineno, obj in read_json_lines(path, max_line_bytes):
        yield f"line {lineno}", obj


def _classifier():
    try:  # written elsewhere; optional so imports work before/without it
        from core.failures import classify
    except ImportError:
        return None
    return classify


def import_file(source: str | Path, db_path: str | Path, fmt: str | None = None,
                run_name: str | None = None, run_id: str | None = None, replace: bool = False,
                batch_size: int = 200, max_line_bytes: int = MAX_LINE_BYTES,
                live: bool = False) -> ImportReport:
    """Import ``source`` into the store at ``db_path``; see the module docstring. ``live``
    (storage/follow.py: more files will follow) leaves the run ``running`` instead of
    ``finished``."""
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"no such file or directory: {source}")
    fmt = fmt or guess_format(source)
    if fmt not in IMPORT_FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {IMPORT_FORMATS}")
    if fmt == "inspect":  # one run per task and model: a log file is one run
        result = import_runs(source, db_path, fmt, run_name, run_id, replace, live=live)
        if len(result.reports) != 1:
            raise ValueError(f"{source} holds {len(result.reports)} runs (one per task and "
                             "model): import it with import_runs")
        return result.reports[0]
    run_id = check_run_id(run_id) if run_id else default_run_id(source)
    prepare(db_path)
    refuse_foreign(run_id, run_source(db_path, run_id))
    report = ImportReport(run_id, source.name, fmt)
    reader = IMPORT_READERS.get(fmt, _read_generic)
    classify, first_seen, batch = _classifier(), {}, []
    run = {"name": run_name or source.stem, "config": None, "created": False}
    try:
        for where, obj in reader(source, max_line_bytes):
            report.lines += 1
            try:
                if isinstance(obj, LineError):
                    raise obj
                rec = validate(obj)
                if rec["traj_id"] in first_seen:
                    raise LineError(f"duplicate traj_id {rec['traj_id']!r} "
                                    f"(first at {first_seen[rec['traj_id']]})")
                first_seen[rec["traj_id"]] = where
                if run["config"] is None and "run" in rec:
                    run["config"] = rec["run"]
                batch.append((where, to_rows(rec, classify)))
            except LineError as exc:
                report.fail(where, str(exc))
            except Exception as exc:  # a reader or rule tripping on a line fails that line only
                report.fail(where, f"could not be read: {type(exc).__name__}: {exc}")
            if len(batch) >= batch_size:
                write_batch(db_path, run_id, fmt, run, batch, replace, report)
                batch = []
        if batch:
            write_batch(db_path, run_id, fmt, run, batch, replace, report)
            batch = []
    except RunNotImportable:
        raise  # refused before its first write: nothing of ours is in that run
    except BaseException as exc:
        _stopped(db_path, run_id, fmt, run, batch, replace, report, exc)
        raise
    if report.lines == 0:
        raise ValueError(f"no records found in {source} (format {fmt})")
    finish_import(db_path, run_id, fmt, run, report, live=live)
    return report


@dataclass
class ImportRuns:
    """What ``import_runs`` did: one report per run, and inputs that could not be read at all."""
    reports: list[ImportReport]
    errors: list[str] = field(default_factory=list)


def import_runs(source: str | Path, db_path: str | Path, fmt: str | None = None,
                run_name: str | None = None, run_id: str | None = None, replace: bool = False,
                live: bool = False, max_line_bytes: int = MAX_LINE_BYTES) -> ImportRuns:
    """``import_file`` for any input, including those that hold several runs (an Inspect log
    directory: one run per task and model, storage/inspect_import.py)."""
    source = Path(source)
    fmt = fmt or (guess_format(source) if source.exists() else None)
    if fmt == "inspect":
        from storage.inspect_import import import_inspect
        result = import_inspect(source, db_path, run_name, run_id, replace, live=live)
        return ImportRuns(result.reports, result.errors)
    return ImportRuns([import_file(source, db_path, fmt, run_name, run_id, replace, live=live,
                                   max_line_bytes=max_line_bytes)])


def _reason(exc: BaseException) -> str:
    """Why an import stopped, naming a file by its name only (never a full path)."""
    if isinstance(exc, OSError) and exc.filename:
        return f"{type(exc).__name__}: {exc.strerror}: {Path(str(exc.filename)).name}"
    return f"{type(exc).__name__}: {exc}"


def _stopped(db_path, run_id, fmt, run, batch, replace, report, exc: BaseException) -> None:
    """Keep the lines read so far and mark the import failed; the caller re-raises ``exc``."""
    reason = clean_text(_reason(exc))
    report.errors.append(f"import stopped: {reason}")
    try:
        if batch:
            write_batch(db_path, run_id, fmt, run, batch, replace, report)
        finish_import(db_path, run_id, fmt, run, report, stopped=reason)
    except Exception:  # the store itself is what failed: the caller reports the first error
        pass




# == command line ================================================================================
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
    fol = sub.add_parser("follow", help="import each new complete file of DIR as it appears, "
                                        "until Ctrl-C (verl rollout dumps, TRL completions, JSONL)")
    fol.add_argument("dir", help="the directory the other trainer writes into")
    fol.add_argument("--db", required=True, help="the DuckDB store (created if missing)")
    fol.add_argument("--format", choices=FORMATS, required=True)
    fol.add_argument("--run-name", help="name shown in the app (default: the directory's name)")
    fol.add_argument("--run-id", help="run to import into (default: the one `import DIR` uses)")
    fol.add_argument("--poll", type=float, default=1.0, help="seconds between looks (default 1)")
    fol.add_argument("--max-line-bytes", type=int, default=MAX_LINE_BYTES,
                     help="a longer line fails alone, with a message (default 16 MiB)")
    exp = sub.add_parser("export", help="export a run (or a filtered selection) to JSONL/Parquet")
    exp.add_argument("--db", required=True)
    exp.add_argument("--run", help="run id (with --partitioned, default: every run)")
    exp.add_argument("--out", required=True, help="output file (directory with --partitioned)")
    exp.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    exp.add_argument("--partitioned", action="store_true",
                     help="Parquet directory partitioned by run and step (hive style)")
    exp.add_argument("--split", help="only trajectories of this split (train, eval, sft, ...)")
    exp.add_argument("--success", type=_bool, help="only successful (true) or failed (false)")
    exp.add_argument("--failure-class", help="only trajectories of this failure class")
    exp.add_argument("--step-min", type=int)
    exp.add_argument("--step-max", type=int)
    return parser


def _import(args) -> int:
    result = import_runs(args.file, args.db, args.format, args.run_name, args.run_id,
                         args.replace, max_line_bytes=args.max_line_bytes)
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
    from storage import export
    filters = export.Filters(args.split, args.success, args.failure_class, args.step_min,
                             args.step_max)
    if args.partitioned:
        counts = export.export_partitioned(args.db, args.out, [args.run] if args.run else None,
                                           filters)
        print(f"wrote {counts.get('trajectories', 0)} trajectories "
              f"({sum(counts.values())} rows in all) to {args.out}")
        return 0
    if not args.run:
        raise ValueError("--run is required (except with --partitioned)")
    check_run_id(args.run)
    write = export.export_jsonl if args.format == "jsonl" else export.export_parquet
    print(f"wrote {write(args.db, args.run, args.out, filters)} trajectories to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "follow":
            from storage import follow
            return follow.main(args)
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
