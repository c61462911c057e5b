"""``agentrl otlp-scores FILE --db PATH``: rewards graded after the agent ran, keyed by trace id.

    agentrl otlp-scores scores.jsonl --db runs/agents.duckdb [--run RUN_ID]
    python -m storage.otlp.scores scores.jsonl --db runs/agents.duckdb        (the same)

Each line of ``FILE`` is one JSON object ``{"trace_id": "<32 hex>", "reward": 0.5, "success":
true, "task_id": "t1"}`` (``success`` and ``task_id`` optional; without ``success`` it is
``reward >= 1``). The whole file is checked before anything is written: a line that is not such
an object, a reward that is not a finite number, a trace id given twice, a line over
``MAX_LINE_BYTES`` or a file over ``MAX_LINES`` lines is an error naming the line, and nothing is
written.

Each trace id is looked up in the raw spans the receiver kept (``spans``): the trajectory it
belongs to (one per trace, or a conversation of several) is assembled again from its stored
spans and log records exactly as the receiver assembles it (storage/otlp/assemble.py
``build_record``), with the file's reward, success and task id as facts over the spans' own,
and rewritten in place; ``info.otel.reward_source`` then says ``scores file NAME`` and
``info.otel.scored`` the file and line. Tags are kept. Running the same file again changes
nothing (its trajectories are reported unchanged). Trace ids the store has no spans of are
listed; a trajectory whose agent still runs (``info.otel.open`` and a span received in the last
``STALE_S``) is listed and left alone, since the receiver rewrites it from its spans until it
closes: run the file again after it closes. A scored trajectory that a late span or a restart
re-assembles keeps its score (storage/otlp/writer.py ``scored_facts``). One still open with no span for ``STALE_S`` was left open by a receiver killed
before it closed it (the next receiver to start closes it too): it is scored, and closed.

The receiver opens the store per transaction (storage/db.py), so this runs beside it; a store
another program keeps locked past ``storage.db.LOCK_TIMEOUT_S`` is an error saying so.
Exit status: 0 when every line was applied (or already was), 1 when some trace ids were not
found or still open, 2 for a bad file or a store that cannot be written.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from storage import db
from storage.failures import classify
from storage.ingest.import_batch import WRITE_ERRORS, write_batch
from storage.ingest.step_metrics import rederive_metrics
from storage.ingest.report import ImportReport
from storage.interchange import LineError, to_rows, validate
from storage.otlp.assemble import OpenTrace
from storage.otlp.record import build_record
from storage.otlp.writer import FORMAT
from storage.otlp.stored import stored_records
from storage.recorder import clean_text, now

MAX_LINE_BYTES = 4096
STALE_S = 120.0
MAX_LINES = 1_000_000
KEYS = {"trace_id", "reward", "success", "task_id"}
TRACE_ID = re.compile(r"[0-9a-fA-F]{32}")


class ScoresError(ValueError):
    """The file is not a scores file; the message names the line."""


@dataclass(frozen=True)
class Score:
    line: int
    trace_id: str
    reward: float
    success: bool | None = None
    task_id: str | None = None


def _score(obj, n: int) -> Score:
    if not isinstance(obj, dict):
        raise ScoresError(f"line {n}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - KEYS)
    if unknown:
        raise ScoresError(f"line {n}: unknown key(s) {', '.join(map(repr, unknown))[:200]} "
                          f"(a line has {', '.join(sorted(KEYS))})")
    tid = obj.get("trace_id")
    if not isinstance(tid, str) or not TRACE_ID.fullmatch(tid):
        raise ScoresError(f"line {n}: trace_id must be 32 hex digits, got {str(tid)[:60]!r}")
    if tid.strip("0") == "":
        raise ScoresError(f"line {n}: trace_id is all zeros (an invalid trace id)")
    reward = obj.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) \
            or not math.isfinite(reward):
        raise ScoresError(f"line {n}: reward must be a finite number, got {str(reward)[:60]!r}")
    success = obj.get("success")
    if success is not None and not isinstance(success, bool):
        raise ScoresError(f"line {n}: success must be true or false, got {str(success)[:60]!r}")
    task = obj.get("task_id")
    if task is not None and (not isinstance(task, str) or not task.strip() or len(task) > 200):
        raise ScoresError(f"line {n}: task_id must be a non-empty string of at most 200 "
                          "characters")
    return Score(n, tid.lower(), float(reward), success, task)


def read_scores(path: str | Path) -> list[Score]:
    """Every line of a scores file, checked (``ScoresError`` names the first bad line)."""
    scores, seen = [], {}
    with open(path, "rb") as f:
        n = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                break
            n += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise ScoresError(f"line {n}: longer than {MAX_LINE_BYTES} bytes")
            if n > MAX_LINES:
                raise ScoresError(f"line {n}: more than {MAX_LINES} lines")
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw, parse_constant=lambda c: c)  # NaN/Infinity: said below
            except (ValueError, RecursionError) as exc:
                raise ScoresError(f"line {n}: not JSON ({str(exc)[:100]})") from None
            s = _score(obj, n)
            if s.trace_id in seen:
                raise ScoresError(f"line {n}: trace {s.trace_id} was already given on line "
                                  f"{seen[s.trace_id]}")
            seen[s.trace_id] = n
            scores.append(s)
    return scores


@dataclass
class Outcome:
    scored: list[str]          # trajectories rewritten with their score
    unchanged: list[str]       # already carried this score (a rerun)
    not_found: list[str]       # trace ids the store has no spans of
    still_open: list[str]      # trace ids whose trajectory's agent still runs
    failed: list[str]          # could not be rebuilt or written (with the reason)


def _given(s: Score, name: str) -> dict:
    """The score as facts over what the trajectory's spans said (storage/otlp/record.py
    ``build_record``): its reward and source, its success (None: inferred from the reward) and
    its task when the file names one."""
    given = {"reward": s.reward, "success": s.success, "source": f"scores file {name}"}
    if s.task_id is not None:
        given["task_id"] = s.task_id
    return given


def apply_scores(db_path, scores: list[Score], name: str, run: str | None = None) -> Outcome:
    """Rewrite each scored trajectory (module docstring); ``db.StoreError`` when the store cannot
    be opened."""
    out = Outcome([], [], [], [], [])
    ids = [s.trace_id for s in scores]
    sql = ("SELECT DISTINCT s.trace_id, s.run_id, s.traj_id FROM spans s JOIN runs r USING "
           "(run_id) WHERE r.source = 'import:otlp' AND s.trace_id IN (SELECT unnest(?))")
    params: list = [ids]
    if run is not None:
        sql += " AND s.run_id = ?"
        params.append(run)
    with db.reading(db_path) as con:
        where = {}
        for tid, run_id, traj_id in con.execute(sql, params).fetchall():
            where[tid] = (run_id, traj_id)
        by_run: dict[str, set] = {}
        for run_id, traj_id in where.values():
            by_run.setdefault(run_id, set()).add(traj_id)
        rows = {(run_id, r[0]): r[1:] for run_id, trajs in by_run.items()
                for r in con.execute(
                    "SELECT traj_id, info, reward, success, task_id FROM trajectories "
                    "WHERE run_id = ? AND traj_id IN (SELECT unnest(?))",
                    [run_id, sorted(trajs)]).fetchall()}
        # open, but no span for STALE_S: no receiver is writing it (one closes a trajectory
        # after --idle-s, 30 s by default): a receiver killed before it closed it
        stale = {(run_id, r[0]) for run_id, trajs in by_run.items()
                 for r in con.execute(
                     "SELECT traj_id FROM spans WHERE run_id = ? AND traj_id IN "
                     "(SELECT unnest(?)) GROUP BY traj_id HAVING max(received_at) < ?",
                     [run_id, sorted(trajs), now() - timedelta(seconds=STALE_S)]).fetchall()}
    # several lines may name traces of one conversation: the later line wins
    todo: dict[tuple[str, str], Score] = {}
    for s in scores:
        if s.trace_id not in where:
            out.not_found.append(s.trace_id)
            continue
        key = where[s.trace_id]
        if key not in rows:
            out.failed.append(f"trace {s.trace_id}: its spans are stored but not its trajectory")
            continue
        otel = (json.loads(rows[key][0] or "{}").get("otel") or {})
        if otel.get("open") and key not in stale:
            out.still_open.append(s.trace_id)
            continue
        todo[key] = s
    batches: dict[str, list] = {}
    for (run_id, traj_id), s in todo.items():
        info_json, reward, success, task_id = rows[(run_id, traj_id)]
        otel = json.loads(info_json or "{}").get("otel") or {}
        if (otel.get("reward_source") == f"scores file {name}" and reward == s.reward
                and bool(success) == (s.success if s.success is not None else s.reward >= 1.0)
                and (s.task_id is None or task_id == s.task_id)):
            out.unchanged.append(traj_id)
            continue
        spans, logs = stored_records(db_path, [(run_id, traj_id)])[(run_id, traj_id)]
        t = OpenTrace(otel.get("key") or f"trace:{s.trace_id}", run_id, traj_id,
                      spans={sp.span_id: sp for sp in spans}, logs=logs)
        try:
            rec = build_record(t, closed=True, given=_given(s, name))
            rec["info"]["otel"]["scored"] = {"file": name, "line": s.line,
                                             **({"task_id": True} if s.task_id else {})}
            rows_ = to_rows(validate(rec), classify)
        except Exception as exc:  # noqa: BLE001 (a span no convention expects: this trace alone)
            out.failed.append(f"trace {s.trace_id}: "
                              + (str(exc) if isinstance(exc, LineError)
                                 else f"could not be assembled: {type(exc).__name__}: {exc}"))
            continue
        batches.setdefault(run_id, []).append((f"trace {s.trace_id}", rows_, traj_id))
    for run_id, batch in batches.items():
        report = ImportReport(run_id, f"scores file {name}", FORMAT)
        meta = {"name": run_id, "config": None, "created": False, "refresh_config": False}
        write_batch(db_path, run_id, FORMAT, meta, [(w, r) for w, r, _ in batch], True, report)
        failed = {e.split(":", 1)[0] for e in report.errors}
        for where_, _, traj_id in batch:
            (out.failed.append(f"{where_}: could not be written") if where_ in failed
             else out.scored.append(traj_id))
        with db.writing(db_path) as con:  # the run's derived metrics read the rewards
            rederive_metrics(con, run_id)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentrl otlp-scores",
                                description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("file", help="JSONL: one {trace_id, reward, success?, task_id?} per line")
    p.add_argument("--db", required=True, help="the store the receiver (agentrl otlp) writes")
    p.add_argument("--run", help="only this run's traces (default: every OTLP run of the store)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    name = Path(args.file).name
    try:
        scores = read_scores(args.file)
    except OSError as exc:
        print(f"error: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except ScoresError as exc:
        print(f"error: {name}: {clean_text(str(exc))}; nothing was written", file=sys.stderr)
        return 2
    if not Path(args.db).exists():
        print(f"error: no store at {args.db}", file=sys.stderr)
        return 2
    try:
        out = apply_scores(args.db, scores, name, args.run)
    except db.StoreError as exc:
        print(f"error: {clean_text(str(exc))} (another program holds the store; a running "
              "agentrl otlp receiver does not, it opens it per write)", file=sys.stderr)
        return 2
    except WRITE_ERRORS as exc:
        print(f"error: the store could not be written: {type(exc).__name__}: "
              f"{clean_text(str(exc))[:300]}", file=sys.stderr)
        return 2
    print(f"{name}: {len(scores)} score(s); {len(out.scored)} trajectory(ies) rescored, "
          f"{len(out.unchanged)} already carried their score")
    if out.not_found:
        print(f"{len(out.not_found)} trace id(s) not found in {args.db}"
              + (f" (run {args.run})" if args.run else "") + ": "
              + ", ".join(out.not_found[:20]) + (" ..." if len(out.not_found) > 20 else ""))
    if out.still_open:
        print(f"{len(out.still_open)} trace id(s) whose agent still runs, left alone (run this "
              "again once they close): " + ", ".join(out.still_open[:20]))
    for line in out.failed[:20]:
        print(f"error: {clean_text(line)[:300]}", file=sys.stderr)
    return 1 if out.not_found or out.still_open or out.failed else 0


if __name__ == "__main__":
    sys.exit(main())
