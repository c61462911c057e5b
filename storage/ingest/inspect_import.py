"""Importing Inspect AI logs (storage/ingest/inspect_log.py reads them): one run per task and model.

    python -m storage.io import LOG.eval|LOG.json|DIR --db PATH --format inspect

* A log file holds one task run with one model: it becomes one run, ``--run-id`` or the id
  ``import`` derives from the file's path (storage/io.py ``default_run_id``).
* A directory (an eval set's log dir) may hold many tasks and models: each (task, model) is its
  own run, ``{base}-{task}-{model}-{hash}`` where ``base`` is ``--run-id`` or the directory's
  derived id, so importing the directory again, or following it, lands in the same runs. There
  the trajectory ids carry the eval id (two logs of one task and model, a retry, keep both).

Each sample is validated and written like a generic JSONL line (storage/interchange.py, in
batches by storage/ingest/import_batch.py): a sample that cannot be read (its member cut short or over
the size cap, bad JSON, a score Inspect does not allow) fails alone, named by file, sample and
epoch, and the rest import. A log that cannot be opened at all fails alone too when a directory
is imported, and stops the import (exit 2) when it is the file given. Nothing was trained: every
token's ``trained`` is false.

The run's config: ``env`` ``inspect:{task}``, ``model``, ``algo`` ``none``, and under
``inspect`` the eval spec (task args, dataset, generate config, limits, scorers, packages,
revision, eval and run ids), plan, status, results and stats. Metrics at step 0, recomputed from
the stored trajectories after every import: the importer's own (``eval/success``), then
``usage/{input,output,total,reasoning}_tokens`` (sum over samples, and ``..._mean`` per
sample; cache tokens and ``total_cost`` where the log has them), ``time/sample_s`` and
``time/working_s`` (means), ``eval/samples``, ``eval/errors``, ``eval/limits``,
``eval/reward_mean``, and Inspect's own ``inspect/{scorer}/{metric}`` from the log's header.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from storage import db
from storage.failures import classify
from storage.ingest.import_batch import (RunNotImportable, finish_import, refuse_foreign, run_source,
                                  write_batch)
from storage.ingest.door import Refused, listing
from storage.ingest.inspect_log import (USAGE_KEYS, InspectLog, log_files, log_metrics,
                                        opening_error, sample_record)
from storage.interchange import LineError, refuse_many_values, to_rows, validate
from storage.ingest.registry import Format, register
from storage.ingest.report import ImportReport, default_run_id
from storage.migrations import prepare
from storage.recorder import check_run_id, clean_text
from storage.ingest.zip_members import MAX_MEMBER_BYTES, MAX_TOTAL_BYTES
from storage.token_rows import BatchSize

FMT = "inspect"
BATCH_SAMPLES = 200


@dataclass
class _Run:
    report: ImportReport
    run: dict
    first_seen: dict = field(default_factory=dict)
    batch: list = field(default_factory=list)
    size: BatchSize = field(default_factory=lambda: BatchSize(BATCH_SAMPLES))
    metrics: dict = field(default_factory=dict)


@dataclass
class InspectImport:
    """One report per run, and the logs that could not be opened at all."""
    reports: list[ImportReport]
    errors: list[str]

    @property
    def failed(self) -> int:
        return sum(r.failed for r in self.reports) + len(self.errors)


def group_run_id(base: str, task: str, model: str) -> str:
    """The run of one (task, model) of a directory: readable, unique, at most 128 characters."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{task}-{model}").strip("-._")[:40]
    digest = hashlib.sha1(f"{task}\0{model}".encode("utf-8", "replace")).hexdigest()[:8]
    return check_run_id(f"{base[:70]}-{slug}-{digest}")


def _config(log: InspectLog) -> dict:
    spec = log.spec
    keep = ("task", "task_id", "task_version", "task_args", "task_attribs", "solver",
            "solver_args", "dataset", "sandbox", "model", "model_base_url", "model_args",
            "model_generate_config", "model_roles", "config", "revision", "packages", "scorers",
            "metadata", "tags", "eval_id", "run_id", "eval_set_id", "created")
    return {"env": f"inspect:{log.task}", "model": log.model, "algo": "none",
            "inspect": {"eval": {k: spec[k] for k in keep if spec.get(k) is not None},
                        "plan": log.plan, "status": log.status, "results": log.results,
                        "stats": log.stats, "log": log.path.name}}


def import_inspect(source, db_path, run_name: str | None = None, run_id: str | None = None,
                   replace: bool = False, live: bool = False, run_base: str | None = None,
                   batch_size: int = 200, max_member_bytes: int = MAX_MEMBER_BYTES,
                   max_total_bytes: int = MAX_TOTAL_BYTES, split: str | None = None
                   ) -> InspectImport:
    """Import a log file or a directory of logs (see the module docstring). ``run_base``: the
    base of a directory's run ids, for a follower importing that directory's files one by one;
    ``split``: every sample's split (default ``eval``)."""
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"no such file or directory: {source}")
    if source.is_dir() and run_base is None:
        run_base = check_run_id(run_id) if run_id else default_run_id(source)
    prepare(db_path)
    runs: dict[tuple[str, str], _Run] = {}
    result = InspectImport([], [])
    logs = log_files(source)
    if not logs:
        raise ValueError(f"no Inspect logs (.eval, .json) in {source}")
    try:
        for path in logs:
            if isinstance(path, Refused):  # a link out of the directory: never opened
                result.errors.append(clean_text(f"{path.path.name}: {path.why}"))
                continue
            try:
                log = InspectLog(path, max_member_bytes, max_total_bytes)
            except Exception as exc:  # any exception opening it (RecursionError, MemoryError):
                why = opening_error(path, exc)  # this log fails alone, named
                if not source.is_dir():
                    raise ValueError(why) from None
                result.errors.append(clean_text(f"{path.name}: could not be read: {why}"))
                continue
            with log:
                state = _state(runs, log, source.name, db_path, run_name, run_id, run_base, split)
                _read(db_path, state, log, _prefix(log, run_base), replace, batch_size)
    except RunNotImportable:
        raise
    except BaseException as exc:
        for state in runs.values():
            _stopped(db_path, state, replace, exc)
        raise
    if not any(state.report.lines for state in runs.values()):
        raise ValueError(f"no samples found in {source}"
                         + (f" ({'; '.join(result.errors[:3])})" if result.errors else ""))
    for state in runs.values():
        finish_import(db_path, state.report.run_id, FMT, state.run, state.report, live=live)
        write_metrics(db_path, state.report.run_id, state.metrics)
        result.reports.append(state.report)
    return result


def import_log(log: InspectLog, db_path, run_base: str, source: str,
               run_name: str | None = None, skip: frozenset[str] | set[str] = frozenset(),
               check: Callable[[], None] = lambda: None, split: str | None = None
               ) -> ImportReport:
    """One open log into its (task, model) run under ``run_base``, as ``import DIR`` would, and
    left ``running``: a follower's import (storage/ingest/follow_logs.py). ``source`` names it
    in the ``imports`` row; samples whose key is in ``skip`` are not read; ``check`` runs before
    each write (is the store still the one the follower started with). Samples already in the
    run are skipped; the run's config is the log's as it is now (the finished log's results
    replace a running one's). An error stops it where it is: what was written stays, and the
    run stays ``running`` for the follower's next try."""
    state = _state({}, log, source, db_path, run_name, None, run_base, split)
    state.run["refresh_config"] = True
    _read(db_path, state, log, _prefix(log, run_base), False, 200, skip, check)
    check()
    finish_import(db_path, state.report.run_id, FMT, state.run, state.report, live=True)
    write_metrics(db_path, state.report.run_id, state.metrics)
    return state.report


def _prefix(log: InspectLog, run_base: str | None) -> str:
    """Trajectory ids of a directory's logs carry the eval id (two logs, a retry, keep both)."""
    return f"{log.spec.get('eval_id') or log.path.stem}/" if run_base else ""


def _read(db_path, state: _Run, log: InspectLog, prefix: str, replace: bool, batch_size: int,
          skip: frozenset[str] | set[str] = frozenset(),
          check: Callable[[], None] = lambda: None) -> None:
    """Every sample of ``log`` (but those in ``skip``) into ``state``'s run, in batches. Reading
    that breaks off (any exception out of the log: a member, the file itself) fails the rest of
    this log alone, named, and keeps what was read; the store's errors stop the import."""
    state.size.records = batch_size
    samples = log.samples(skip)
    while True:
        try:
            where, sample = next(samples)
        except StopIteration:
            break
        except Exception as exc:  # not one sample: the log itself (the store is not touched here)
            state.report.fail(log.path.name, clean_text(
                f"reading stopped: {type(exc).__name__}: {exc}; the samples after it are not "
                "read"))
            break
        _one(state, where, sample, log, prefix, classify)
        if state.size.full():
            check()
            _flush(db_path, state, replace)
    try:
        state.metrics = log_metrics(log)
    except Exception as exc:  # a hostile header's results: the samples still count
        state.report.errors.append(clean_text(f"{log.path.name}: metrics not read: "
                                              f"{type(exc).__name__}: {exc}"))
    check()
    _flush(db_path, state, replace)


def _state(runs, log, source: str, db_path, run_name, run_id, run_base,
           split: str | None = None) -> _Run:
    key = (log.task, log.model)
    if key not in runs:
        rid = group_run_id(run_base, *key) if run_base else \
            check_run_id(run_id) if run_id else default_run_id(log.path)
        refuse_foreign(rid, run_source(db_path, rid))  # before this run's first write
        name = run_name or f"{log.task} · {log.model}"
        # rescore: a sample already in the run whose log now scores it otherwise (``inspect
        # score`` rewrote the log) takes the new scores, the old kept in its info
        runs[key] = _Run(ImportReport(rid, source, FMT),
                         {"name": name, "config": _config(log), "created": False,
                          "rescore": True, "refresh_config": True, "split": split})
    else:
        runs[key].run["config"] = _config(log)  # the latest log of a task and model describes it
    return runs[key]


def _one(state: _Run, where: str, sample, log: InspectLog, prefix: str, classify) -> None:
    report = state.report
    report.lines += 1
    try:
        if isinstance(sample, LineError):
            raise sample
        if isinstance(sample, dict):  # its events are only looked through, never copied
            refuse_many_values([v for k, v in sample.items() if k != "events"], "the sample")
        rec = validate(sample_record(sample, log, prefix))
        if rec["traj_id"] in state.first_seen:
            raise LineError(f"duplicate sample and epoch {rec['traj_id']!r} "
                            f"(first at {state.first_seen[rec['traj_id']]})")
        state.first_seen[rec["traj_id"]] = where
        rows = to_rows(rec, classify)
        rows["tokens"].fixed.update(trained=False, advantage=None)  # an evaluation: none trained
        state.batch.append((where, rows))
        state.size.add(rows)
    except LineError as exc:
        report.fail(where, str(exc))
    except Exception as exc:  # a rule tripping on one sample fails that sample only
        report.fail(where, f"could not be read: {type(exc).__name__}: {exc}")


def _flush(db_path, state: _Run, replace: bool) -> None:
    if state.batch:
        write_batch(db_path, state.report.run_id, FMT, state.run, state.batch, replace,
                    state.report)
    state.batch = []
    state.size.clear()


def _stopped(db_path, state: _Run, replace: bool, exc: BaseException) -> None:
    """Keep what was read and mark the run failed, saying why; the caller re-raises ``exc``."""
    reason = clean_text(f"{type(exc).__name__}: {exc}")
    state.report.errors.append(f"import stopped: {reason}")
    try:
        _flush(db_path, state, replace)
        finish_import(db_path, state.report.run_id, FMT, state.run, state.report, stopped=reason)
    except Exception:  # the store itself is what failed: the caller reports the first error
        pass


def _metrics_sql() -> str:
    usage = [f"(t.info->'$.inspect.usage.{k}')::DOUBLE AS \"{k}\"" for k in USAGE_KEYS]
    sums = [f"sum(\"{k}\") AS \"usage/{k}\", avg(\"{k}\") AS \"usage/{k}_mean\""
            for k in USAGE_KEYS]
    return f"""
WITH t AS (SELECT reward, finish_reason, {', '.join(usage)},
                  (info->'$.inspect.total_time')::DOUBLE AS total_time,
                  (info->'$.inspect.working_time')::DOUBLE AS working_time
           FROM trajectories t WHERE run_id = $run),
wide AS (SELECT 0 AS step, {', '.join(sums)},
                avg(total_time) AS "time/sample_s", avg(working_time) AS "time/working_s",
                count(*)::DOUBLE AS "eval/samples",
                count(*) FILTER (WHERE finish_reason = 'error')::DOUBLE AS "eval/errors",
                count(*) FILTER (WHERE finish_reason LIKE '%\\_limit' ESCAPE '\\')::DOUBLE
                    AS "eval/limits",
                avg(reward) AS "eval/reward_mean" FROM t)
SELECT $run AS run_id, step, name, value
FROM (UNPIVOT wide ON COLUMNS(* EXCLUDE step) INTO NAME name VALUE value)
"""


def write_metrics(db_path, run_id: str, inspect_metrics: dict[str, float]) -> None:
    """The run's Inspect metrics at step 0 (module docstring), after the importer's own."""
    with db.writing(db_path) as con:
        if not con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchone():
            return  # nothing of it could be stored
        con.execute("INSERT INTO metrics BY NAME " + _metrics_sql(), {"run": run_id})
        if inspect_metrics:
            con.executemany("INSERT INTO metrics (run_id, step, name, value) VALUES (?, 0, ?, ?)",
                            [[run_id, k, v] for k, v in inspect_metrics.items()])


INSPECT_JSON = re.compile(rb'^\s*\{\s*"version"\s*:\s*\d+\s*,\s*"status"\s*:')


def inspect_json(path: Path) -> bool:
    """Whether a ``.json`` file starts as an Inspect log does: {"version": 2, "status": ..."""
    try:
        with open(path, "rb") as f:
            return bool(INSPECT_JSON.match(f.read(256)))
    except OSError:
        return False


@register
class Inspect(Format):
    """Inspect AI logs: one run per task and model (``import_inspect``), followed by their own
    poller as samples are written (storage/ingest/follow_logs.py)."""
    name = FMT
    patterns = ("*.eval", "*.json")
    followed = "log"
    rank = 20
    multi_run = True

    def detect(self, source: Path, first) -> bool:
        if source.is_dir():
            logs = [p for p in listing(source, self.patterns) if isinstance(p, Path)]
            return any(p.suffix == ".eval" or inspect_json(p) for p in logs)
        return source.suffix == ".eval" or (source.suffix == ".json" and inspect_json(source))

    def import_runs(self, source, db_path, run_name, run_id, replace, live, split):
        result = import_inspect(source, db_path, run_name, run_id, replace, live=live,
                                split=split)
        return result.reports, result.errors
