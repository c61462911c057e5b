"""Import a file or folder of trajectories into a store, in any registered format
(storage/ingest/formats.py), read through the framework (storage/ingest/door.py). The rules
(validation, batches, run ids, what a stopped import keeps) are in storage/io.py's
docstring, the command line that calls this.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from storage.ingest import door, formats
from storage.ingest.import_batch import (RunNotImportable, check_split, finish_import,
                                        refuse_foreign, run_source, write_batch)
from storage.ingest.report import ImportReport, default_run_id
from storage.interchange import MAX_LINE_BYTES
from storage.migrations import prepare
from storage.recorder import check_run_id, clean_text
from storage.token_rows import BatchSize

IMPORT_FORMATS = formats.NAMES
FORMATS = IMPORT_FORMATS[:3]  # the contract's first three: jsonl, verl, trl


def guess_format(source: Path) -> str:
    """The format ``source`` is in (storage/ingest/formats.py ``detect``)."""
    return formats.detect(Path(source))


def run_name_of(source: Path) -> str:
    """A run's default name: the file's or folder's stem, except a file named by a number alone
    (verl's ``{step}.jsonl``), which says nothing: its folder's name and the file's,
    ``rollouts · 1.jsonl``."""
    if source.is_file() and source.stem.isdigit():
        return f"{source.resolve().parent.name} · {source.name}"
    return source.stem


def import_file(source: str | Path, db_path: str | Path, fmt: str | None = None,
                run_name: str | None = None, run_id: str | None = None, replace: bool = False,
                batch_size: int = 200, max_line_bytes: int = MAX_LINE_BYTES,
                live: bool = False, split: str | None = None, tokenizer=None) -> ImportReport:
    """Import ``source`` into the store at ``db_path``; see the module docstring. ``live``
    (storage/ingest/follow.py: more files will follow) leaves the run ``running`` instead of
    ``finished``; ``split`` replaces every trajectory's own (storage/ingest/import_batch.py);
    ``tokenizer`` decodes a token-id-only format's tokens (verifiers)."""
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"no such file or directory: {source}")
    fmt = fmt or guess_format(source)
    if formats.get(fmt).multi_run:  # one run per task and model: a log file is one run
        result = import_runs(source, db_path, fmt, run_name, run_id, replace, live=live,
                             split=split)
        if len(result.reports) != 1:
            raise ValueError(f"{source} holds {len(result.reports)} runs (one per task and "
                             "model): import it with import_runs")
        return result.reports[0]
    run_id = check_run_id(run_id) if run_id else default_run_id(source)
    prepare(db_path)
    refuse_foreign(run_id, run_source(db_path, run_id))
    report = ImportReport(run_id, source.name, fmt)
    items = door.read(formats.get(fmt), source, max_line_bytes, tokenizer)
    first_seen, batch, size = {}, [], BatchSize(batch_size)
    run = {"name": run_name or run_name_of(source), "config": None, "created": False,
           "split": check_split(split)}
    try:
        for where, obj in items:
            report.lines += 1
            try:
                batch.append((where, door.checked(where, obj, first_seen, run)))
                size.add(batch[-1][1])
            except Exception as exc:  # whatever it raised: this item fails alone, named
                report.fail(where, str(door.failure(exc)))
            if size.full():
                write_batch(db_path, run_id, fmt, run, batch, replace, report)
                batch = []
                size.clear()
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
                live: bool = False, max_line_bytes: int = MAX_LINE_BYTES,
                split: str | None = None, tokenizer=None) -> ImportRuns:
    """``import_file`` for any input, including those that hold several runs (an Inspect log
    directory: one run per task and model, storage/ingest/inspect_import.py). The one place
    that hands ``split`` (``--split``; None: the format's own) to every importer."""
    source = Path(source)
    fmt = fmt or (guess_format(source) if source.exists() else None)
    check_split(split)
    if fmt is not None and formats.get(fmt).multi_run:  # the format's own import
        return ImportRuns(*formats.get(fmt).import_runs(source, db_path, run_name, run_id,
                                                         replace, live, split))
    return ImportRuns([import_file(source, db_path, fmt, run_name, run_id, replace, live=live,
                                   max_line_bytes=max_line_bytes, split=split,
                                   tokenizer=tokenizer)])


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
