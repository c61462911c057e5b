"""An import's writes (storage/io.py reads and validates, this module writes): each batch of
trajectories in one transaction holding all their rows, so none is ever half-written, and at the
end the run's provenance row, config, derived metrics and final status. A run the trainer
recorded is never written into: refused before the first write and again inside each one.
"""
from __future__ import annotations

import json
from itertools import islice
from typing import Iterator

import duckdb
import pyarrow as pa

from storage import db
from storage.ingest.report import ImportReport
from storage.ingest.step_metrics import rederive_metrics
from storage.recorder import RUN_ID_RE, clean_column, clean_text, now, to_json
from storage.token_columns import tokens_table
from storage.token_rows import ROW_CHUNK

TRAJ_TABLES = ("trajectories", "rewards", "turns", "tokens", "test_results")
ARROW_TYPES = {"VARCHAR": pa.string(), "JSON": pa.string(), "INTEGER": pa.int32(),
               "DOUBLE": pa.float64(), "BOOLEAN": pa.bool_(), "TIMESTAMP": pa.timestamp("us")}


def check_split(split: str | None) -> str | None:
    """``split`` if it is a usable split name (as a run id: 1-128 letters, digits, '.', '_', '-')."""
    if split is not None and not (isinstance(split, str) and RUN_ID_RE.fullmatch(split)):
        raise ValueError(f"--split {split!r} must be 1-128 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit (train, eval, ...)")
    return split


def _mark_split(run: dict, batch: list) -> None:
    """Give every trajectory of ``batch`` the split the user asked for (``run["split"]``)."""
    if run.get("split"):
        for _, rows in batch:
            for row in rows["trajectories"]:
                row["split"] = run["split"]


class RunNotImportable(db.StoreError):
    """The target run was not created by an import (the trainer's runs are not import targets)."""


def run_source(db_path, run_id: str) -> str | None:
    """Who recorded ``run_id`` ('trainer', 'import:FORMAT', ...); None if no such run."""
    with db.reading(db_path) as con:
        row = con.execute("SELECT coalesce(source, 'trainer') FROM runs WHERE run_id = ?",
                          [run_id]).fetchone()
    return None if row is None else row[0]


def refuse_foreign(run_id: str, source: str | None) -> None:
    """RunNotImportable unless the run is new (``source`` None) or an import made it."""
    if source is not None and not source.startswith("import"):
        who = "the trainer" if source == "trainer" else f"{source!r}"
        raise RunNotImportable(
            f"run {run_id!r} was recorded by {who}: an import cannot add to it or replace its "
            "trajectories; import into a run of its own (leave out --run-id, or give an id no "
            "other run uses)")


def column_types(con, tables=TRAJ_TABLES) -> dict[str, dict[str, str]]:
    """Each of ``tables``' columns' types, read in one query (``_insert``'s, for a batch)."""
    out: dict[str, dict[str, str]] = {t: {} for t in tables}
    for table, name, kind in con.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_name IN (SELECT unnest(?))", [list(tables)]).fetchall():
        out[table][name] = kind
    return out


def _insert(con, table: str, rows: list[dict], run_id: str | list[str],
            types: dict[str, str] | None = None) -> None:
    """One batched insert with types taken from the table (no guessing from the values; read
    here unless ``types`` gives them, ``column_types``); ``run_id`` is every row's, or each
    row's (a list as long as ``rows``)."""
    if not rows:
        return
    types = types or dict(con.execute("SELECT column_name, data_type FROM "
                                      "information_schema.columns WHERE table_name = ?",
                                      [table]).fetchall())
    names = list(dict.fromkeys(k for r in rows for k in r))
    schema = pa.schema([(n, ARROW_TYPES[types[n]]) for n in names])
    columns = {n: clean_column([r.get(n) for r in rows]) for n in names}  # the recorder's rule
    arrow = pa.Table.from_pydict(columns, schema=schema)
    run_ids = [run_id] * len(rows) if isinstance(run_id, str) else run_id
    arrow = arrow.append_column("run_id", pa.array(run_ids, pa.string()))
    con.register("_import_rows", arrow)
    con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _import_rows")
    con.unregister("_import_rows")


def _insert_chunks(con, table: str, rows: Iterator[dict], run_id: str,
                   types: dict[str, str] | None = None) -> None:
    """``_insert`` of ``rows`` ``ROW_CHUNK`` at a time, inside the caller's transaction: a
    batch's token rows are never all held at once."""
    while chunk := list(islice(rows, ROW_CHUNK)):
        _insert(con, table, chunk, run_id, types)


TABLE_ROWS = 2 * 122_880
"""Token rows given as columns inserted at a time: two of DuckDB's row groups. An insert of a
row group or more is written out as it goes, where smaller ones wait for the COMMIT: 384k rows
into a fresh store, open to close, took 0.67-0.95 s as one insert, 0.80-0.90 s as 245,760-row
ones and 0.89-1.19 s as 50k-row ones, most of it then in the COMMIT (load 6-7, 2 CPUs)."""


def _insert_tokens(con, token_rows: list, run_id: str, types: dict[str, str] | None = None
                   ) -> None:
    """The token rows of a batch's trajectories: those given as columns (a trainer's rollout,
    storage/token_columns.py) as Arrow tables of about ``TABLE_ROWS`` rows, the others made and
    inserted ``ROW_CHUNK`` at a time; either way a batch's rows are never all held twice."""
    _insert_chunks(con, "tokens", (r for t in token_rows if t.columns is None for r in t),
                   run_id, types)
    items, held = [], 0
    for rows in (t for t in token_rows if t.columns is not None):
        items.append((rows.traj_id, rows.step, rows.columns))
        held += len(rows)
        if held >= TABLE_ROWS:
            _insert_table(con, "tokens", tokens_table(items), run_id)
            items, held = [], 0
    if items:
        _insert_table(con, "tokens", tokens_table(items), run_id)


def _insert_table(con, table: str, arrow: pa.Table, run_id: str) -> None:
    """Insert an Arrow table whose columns are named as ``table``'s (the others NULL)."""
    arrow = arrow.append_column("run_id", pa.repeat(pa.scalar(run_id, pa.string()), len(arrow)))
    con.register("_import_rows", arrow)
    con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _import_rows")
    con.unregister("_import_rows")


def _ensure_run(con, run_id: str, fmt: str, run: dict) -> None:
    if con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchone():
        return
    config = {"env": "unknown", "model": "unknown", "algo": "unknown", **(run["config"] or {})}
    con.execute("INSERT INTO runs (run_id, name, created_at, status, config, updated_at, source) "
                "VALUES (?, ?, ?, 'running', ?, ?, ?)",
                [run_id, clean_text(run["name"]), now(), to_json(config), now(),
                 f"import:{fmt}"])
    run["created"] = True


WRITE_ERRORS = (duckdb.Error, pa.ArrowException, ValueError, TypeError, KeyError)


def write_batch(db_path, run_id, fmt, run, batch, replace, report, then=None) -> bool:
    """Write a batch in one transaction; if it fails, each trajectory alone, reporting the bad.
    ``then(con, counts)``: more work for the batch's transaction once its rows are in (a
    recorder's ``finish_in``: one transaction a step, not two); whatever it raises, the batch
    is written without it. Returns whether ``then`` ran and was committed."""
    _mark_split(run, batch)
    before = dict(run)                          # what a rolled-back try may have changed
    try:
        for attempt in db.attempts(db_path):   # again if a team store's commit conflicted
            with attempt as con:
                run.clear()
                run.update(before)
                counts = _write_rows(con, run_id, fmt, run, batch, replace)
                if then is not None:
                    then(con, counts)
        _count(report, counts)
        return then is not None
    except WRITE_ERRORS:
        pass  # find the culprit(s) below; the batch's transaction was rolled back whole
    except Exception:  # noqa: BLE001 (``then`` failed: the rows never depend on it)
        if then is None:
            raise
        return write_batch(db_path, run_id, fmt, run, batch, replace, report)
    for item in batch:
        try:
            for attempt in db.attempts(db_path):
                with attempt as con:
                    before = dict(run)
                    try:
                        counts = _write_rows(con, run_id, fmt, run, [item], replace)
                    except BaseException:
                        run.clear()
                        run.update(before)          # rolled back: so is what it marked
                        raise
            _count(report, counts)
        except WRITE_ERRORS as exc:
            report.fail(item[0], f"could not be stored: {type(exc).__name__}: {exc}")
    return False


def write_runs(con, fmt, items: list[tuple[str, dict, list]]) -> dict[str, tuple[int, int]]:
    """Several runs' batches ``(run_id, run, batch)`` written inside the caller's transaction
    (``con`` from ``db.writing``), each trajectory replacing the one stored under its id: one
    DELETE and one INSERT per table for all of them, where ``write_batch`` takes a transaction
    and five of each per run (the OTLP receiver writes one run per instrumented service every
    flush). Returns each run's (new, replaced) for ``count`` once the caller committed; an
    error propagates (the caller rolls back, then ``write_batch``-es each run to find the
    trajectory the store refuses)."""
    if not items:
        return {}
    sources = dict(con.execute(
        "SELECT run_id, coalesce(source, 'trainer') FROM runs WHERE run_id IN (SELECT unnest(?))",
        [[run_id for run_id, _, _ in items]]).fetchall())
    for run_id, run, batch in items:
        _mark_split(run, batch)
        refuse_foreign(run_id, sources.get(run_id))
        if run_id not in sources:
            _ensure_run(con, run_id, fmt, run)
    keys = pa.table({"run_id": pa.array([r for r, _, b in items for _ in b], pa.string()),
                     "traj_id": pa.array([rows["trajectories"][0]["traj_id"]
                                          for _, _, b in items for _, rows in b], pa.string())})
    con.register("_import_keys", keys)
    try:
        present = con.execute("SELECT s.run_id, s.traj_id FROM trajectories s JOIN _import_keys "
                              "USING (run_id, traj_id)").fetchall()
        if present:
            for table in TRAJ_TABLES:
                con.execute(f"DELETE FROM {table} USING _import_keys k WHERE "
                            f"{table}.run_id = k.run_id AND {table}.traj_id = k.traj_id")
    finally:
        con.unregister("_import_keys")
    for table in TRAJ_TABLES:
        pairs = ((run_id, r) for run_id, _, batch in items for _, rows in batch
                 for r in rows[table])
        while chunk := list(islice(pairs, ROW_CHUNK)):  # tokens: never all held at once
            _insert(con, table, [r for _, r in chunk], [run_id for run_id, _ in chunk])
    replaced: dict[str, int] = {}
    for run_id, _ in present:
        replaced[run_id] = replaced.get(run_id, 0) + 1
    return {run_id: (len(batch) - replaced.get(run_id, 0), replaced.get(run_id, 0))
            for run_id, _, batch in items}


def count(report: ImportReport, counts: tuple[int, int]) -> None:
    """Add a committed ``write_runs``'s (new, replaced) to ``report``."""
    _count(report, (*counts, 0, 0))


def _count(report: ImportReport, counts: tuple[int, int, int, int]) -> None:
    report.imported += counts[0]
    report.replaced += counts[1]
    report.skipped += counts[2]
    report.rescored += counts[3]


def _write_rows(con, run_id, fmt, run, batch, replace) -> tuple[int, int, int, int]:
    """Insert a batch's rows; (new, replaced, skipped, rescored) trajectories. With
    ``run["rescore"]`` (an Inspect log, which ``inspect score`` may rewrite), a trajectory
    already present whose scores changed takes the new ones (``_rescore``) and counts as both
    skipped and rescored."""
    row = con.execute("SELECT coalesce(source, 'trainer') FROM runs WHERE run_id = ?",
                      [run_id]).fetchone()
    refuse_foreign(run_id, row and row[0])  # again inside the transaction: a trainer may have
    _ensure_run(con, run_id, fmt, run)       # started this run id since the import began
    ids = [rows["trajectories"][0]["traj_id"] for _, rows in batch]
    present = {r[0] for r in con.execute(
        "SELECT traj_id FROM trajectories WHERE run_id = ? AND traj_id IN (SELECT unnest(?))",
        [run_id, ids]).fetchall()}
    if present and replace:
        for table in TRAJ_TABLES:
            con.execute(f"DELETE FROM {table} WHERE run_id = ? AND traj_id IN (SELECT unnest(?))",
                        [run_id, list(present)])
    rescored = 0
    if present and not replace:
        if run.get("rescore"):
            rescored = _rescore(con, run_id, [rows for _, rows in batch
                                              if rows["trajectories"][0]["traj_id"] in present])
        batch = [(w, rows) for w, rows in batch if rows["trajectories"][0]["traj_id"] not in present]
    types = column_types(con)
    for table in TRAJ_TABLES:
        if table == "tokens":  # made and inserted a chunk at a time (storage/token_rows.py)
            _insert_tokens(con, [rows[table] for _, rows in batch], run_id, types[table])
        else:
            _insert(con, table, [r for _, rows in batch for r in rows[table]], run_id,
                    types[table])
    if replace:
        return len(batch) - len(present), len(present), 0, 0
    return len(batch), 0, len(present), rescored


MAX_RESCORES_KEPT = 20
"""Earlier scorings kept per trajectory in ``info.rescored`` (the oldest are dropped first)."""


def _scorings(con, run_id: str, traj_ids: list[str]) -> dict[str, tuple[dict, dict]]:
    """(what a rescoring changes, the stored info) of each stored trajectory of ``traj_ids``,
    read in two queries for the whole batch."""
    rows = con.execute("SELECT traj_id, reward, success, failure_class, info FROM trajectories "
                       "WHERE run_id = ? AND traj_id IN (SELECT unnest(?))",
                       [run_id, traj_ids]).fetchall()
    components: dict[str, dict] = {}
    for tid, name, value in con.execute(
            "SELECT traj_id, component, value FROM rewards WHERE run_id = ? AND traj_id IN "
            "(SELECT unnest(?))", [run_id, traj_ids]).fetchall():
        components.setdefault(tid, {})[name] = value
    out = {}
    for tid, reward, success, failure_class, raw in rows:
        info = json.loads(raw) if isinstance(raw, str) else {}
        out[tid] = ({"reward": reward, "success": success, "failure_class": failure_class,
                     "components": components.get(tid, {}),
                     "scores": (info.get("inspect") or {}).get("scores")}, info)
    return out


def _rescore(con, run_id: str, items: list[dict]) -> int:
    """Trajectories already stored whose scores the source now gives otherwise (a log rescored
    after the evaluation): their reward components, reward, success, failure class and info take
    the new values, and the scoring they replace is kept in ``info.rescored`` (nothing recorded
    is lost). The turns and tokens are the sample's and stay. Returns how many changed."""
    stored_by_id = _scorings(con, run_id, [rows["trajectories"][0]["traj_id"] for rows in items])
    changed = 0
    for rows in items:
        new = rows["trajectories"][0]
        tid = new["traj_id"]
        if tid not in stored_by_id:
            continue
        old, old_info = stored_by_id[tid]
        info = json.loads(new["info"]) if isinstance(new.get("info"), str) else dict(
            new.get("info") or {})
        now_scoring = {"reward": new["reward"], "success": new.get("success"),
                       "failure_class": new.get("failure_class"),
                       "components": {r["component"]: r["value"] for r in rows["rewards"]},
                       "scores": (info.get("inspect") or {}).get("scores")}
        if _same(old, now_scoring):
            continue
        history = list(old_info.get("rescored") or []) + [{**old, "replaced_at": now().isoformat()}]
        info["rescored"] = history[-MAX_RESCORES_KEPT:]
        con.execute("UPDATE trajectories SET reward = ?, success = ?, failure_class = ?, info = ? "
                    "WHERE run_id = ? AND traj_id = ?",
                    [new["reward"], new.get("success"), new.get("failure_class"), to_json(info),
                     run_id, tid])
        con.execute("DELETE FROM rewards WHERE run_id = ? AND traj_id = ?", [run_id, tid])
        _insert(con, "rewards", rows["rewards"], run_id)
        changed += 1
    return changed


def _same(old: dict, new: dict) -> bool:
    """Whether two scorings agree (components compared as numbers, to 1e-12)."""
    if (old["success"], old["failure_class"], old["scores"]) != (
            new["success"], new["failure_class"], new["scores"]):
        return False
    if set(old["components"]) != set(new["components"]):
        return False
    values = [(old["reward"], new["reward"])] + [
        (old["components"][k], new["components"][k]) for k in old["components"]]
    return all((a is None and b is None) or (a is not None and b is not None
                                             and abs(float(a) - float(b)) <= 1e-12)
               for a, b in values)


def finish_import(db_path, run_id, fmt, run, report, stopped: str | None = None,
                   live: bool = False, steps: list[int] | None = None) -> None:
    """Provenance row, config, metrics and final status (``failed`` with the reason if the
    import ``stopped``) of a run that imports created. The config is written when this import
    created the run, or when ``run["refresh_config"]`` says the input describes the run as it is
    now (a followed Inspect log: storage/ingest/inspect_import.py ``import_log``). ``steps``:
    the only steps written since the run's metrics were last derived (``rederive_metrics``)."""
    for attempt in db.attempts(db_path):
        with attempt as con:
            finish_in(con, run_id, fmt, run, report, stopped, live, steps)


def finish_in(con, run_id, fmt, run, report, stopped: str | None = None, live: bool = False,
              steps: list[int] | None = None, counts: tuple = (0, 0, 0, 0)) -> None:
    """``finish_import`` inside the caller's transaction; ``counts`` (new, replaced, skipped,
    rescored) written in it but not yet in ``report`` (``write_batch``'s ``then``)."""
    row = con.execute("SELECT coalesce(source, 'trainer') FROM runs WHERE run_id = ?",
                      [run_id]).fetchone()
    if row is None and stopped is None:
        return  # nothing could be imported: no run to attach the report to
    if row is None:
        _ensure_run(con, run_id, fmt, run)  # stopped before its first write: still recorded
    elif not row[0].startswith("import"):
        return  # never touch a run the trainer recorded (refused before any write)
    if (run["created"] or run.get("refresh_config")) and run["config"]:
        config = {"env": "unknown", "model": "unknown", "algo": "unknown", **run["config"]}
        con.execute("UPDATE runs SET config = ? WHERE run_id = ?", [to_json(config), run_id])
    rederive_metrics(con, run_id, steps)
    con.execute("UPDATE runs SET status = ?, error = ?, updated_at = ?, "
                "last_step = (SELECT max(step) FROM trajectories WHERE run_id = ?) "
                "WHERE run_id = ?", ["failed" if stopped else "running" if live
                                     else "finished", stopped, now(), run_id, run_id])
    con.execute("INSERT INTO imports VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [run_id, clean_text(report.source), fmt, now(), report.lines,
                 report.imported + counts[0], report.skipped + counts[2], report.failed,
                 to_json(report.errors[:100])])


def record_failure(db_path, run_id: str, fmt: str, source: str, errors: list[str]) -> None:
    """An ``imports`` row for a file that could not be imported at all (a follower's log that
    does not open): what a restarted follower reads to leave that version of it alone. No run
    is touched (it may not exist: nothing of the file was read)."""
    for attempt in db.attempts(db_path):
        with attempt as con:
            con.execute("INSERT INTO imports VALUES (?, ?, ?, ?, 0, 0, 0, 1, ?)",
                        [run_id, clean_text(source), fmt, now(), to_json(errors[:100])])
