"""Export a run, or a filtered selection of its trajectories, out of a store.

* ``export_jsonl``: generic JSONL (storage/interchange.py), the first line carrying the run's
  configuration under ``run``; importing it gives back the same trajectories (round trip). It is
  standard JSON: NaN and +-inf, stored or in JSON written before the recorder cleaned it, are
  written as ``"NaN"``/``"Infinity"``/``"-Infinity"``, which the importer reads back.
* ``export_parquet``: one flattened file, a row per trajectory with every ``trajectories`` column
  plus ``turns`` and ``tokens`` as lists of structs (in turn / position order) and ``rewards`` as
  a map component -> value.
* ``export_partitioned``: a directory ``OUT/{table}/run_id=R/step=S/*.parquet`` (hive style; run
  tables without a step are partitioned by run only), plus ``OUT/_schema/{table}.parquet``
  (zero-row files with the exact column types) and ``OUT/_store.json``. DuckDB
  (``read_parquet('OUT/tokens/**/*.parquet', hive_partitioning = true)``), pandas
  (``pd.read_parquet('OUT/tokens')``) and Spark read it directly; ``storage.db.reading(OUT)``
  serves it read-only as a store, so the app can open it. Re-exporting a run replaces its
  partitions; other runs already in the directory stay.

Exports read in short transactions (per chunk of trajectories for JSONL), so exporting a live
run never holds its trainer back for long. Run ids are checked (storage.recorder.check_run_id)
before any directory is derived from them.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from storage import db
from storage.interchange import from_rows
from storage.migrations import SCHEMA_VERSION
from storage.recorder import STEP_TABLES, check_run_id, clean_json

TRAJ_KEYED = ("trajectories", "rewards", "turns", "tokens", "test_results", "turn_signals",
              "renders")
"""Tables keyed by trajectory: a filtered export keeps only the rows of the trajectories picked."""
PARQUET_FORMAT = "agentic-rl-store/parquet"


@dataclass
class Filters:
    split: str | None = None
    success: bool | None = None
    failure_class: str | None = None
    step_min: int | None = None
    step_max: int | None = None
    tag: str | None = None
    """only trajectories a user tagged so (storage/annotations.py)"""
    traj_ids: tuple[str, ...] | None = None
    """only these (what a user's read-only query selected: ``ids_from_query``)"""

    def where(self, alias: str = "t") -> tuple[str, list]:
        """SQL conditions on trajectories (to follow ``run_id = ?``) and their parameters."""
        sql, params = "", []
        for column, op, value in (("split", "=", self.split), ("success", "=", self.success),
                                  ("failure_class", "=", self.failure_class),
                                  ("step", ">=", self.step_min), ("step", "<=", self.step_max)):
            if value is not None:
                sql += f" AND {alias}.{column} {op} ?"
                params.append(value)
        if self.tag is not None:
            sql += (f" AND EXISTS (SELECT 1 FROM tags g WHERE g.run_id = {alias}.run_id "
                    f"AND g.traj_id = {alias}.traj_id AND g.tag = ?)")
            params.append(self.tag)
        if self.traj_ids is not None:
            sql += f" AND {alias}.traj_id IN (SELECT unnest(?::VARCHAR[]))"
            params.append(list(self.traj_ids))
        return sql, params

    def steps(self, alias: str = "x") -> tuple[str, list]:
        sql, params = "", []
        for op, value in ((">=", self.step_min), ("<=", self.step_max)):
            if value is not None:
                sql += f" AND {alias}.step {op} ?"
                params.append(value)
        return sql, params


MAX_QUERY_IDS = 200_000
QUERY_TIME_S = 30.0


def ids_from_query(db_path, run_id: str, sql: str | None = None, where: str | None = None
                   ) -> tuple[str, ...]:
    """The trajectory ids a user's query selects (``export --sql`` / ``--where``), run in the
    Failures page's SQL box (storage/sql_box.py: read-only, one SELECT, no file access, bounded
    in time, memory and rows). ``sql`` must return a ``traj_id`` column (rows of other runs,
    when it has a ``run_id`` column, are left out); ``where`` is a condition on
    ``trajectories`` (``reward > 0.5 AND num_turns <= 3``). More than ``MAX_QUERY_IDS`` rows
    is an error, never a silently shorter export."""
    from storage import sql_box  # deferred: only a query's export starts its child process
    if (sql is None) == (where is None):
        raise ValueError("give one of --sql and --where")
    if where is not None:
        check_run_id(run_id)  # safe inside the quotes below: letters, digits, '.', '_', '-'
        sql = f"SELECT traj_id FROM trajectories WHERE run_id = '{run_id}' AND ({where})"
    try:
        frame, truncated = sql_box.run_query(db_path, sql, max_rows=MAX_QUERY_IDS,
                                             timeout_s=QUERY_TIME_S)
    except sql_box.SqlRefused as exc:
        raise ValueError(f"the selection query was refused: {exc}") from None
    if truncated:
        raise ValueError(f"the selection query returns more than {MAX_QUERY_IDS} rows: narrow it")
    if "traj_id" not in frame.columns:
        raise ValueError(f"the selection query must return a traj_id column; it returns "
                         f"{list(frame.columns)}")
    if "run_id" in frame.columns:
        frame = frame[frame["run_id"] == run_id]
    return tuple(dict.fromkeys(str(t) for t in frame["traj_id"].dropna()))


def _dicts(cursor) -> list[dict]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def _run_config(con, run_id: str) -> dict:
    row = con.execute("SELECT config FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        raise db.StoreError(f"no run {run_id!r} in this store")
    return clean_json(json.loads(row[0])) if row[0] else {}  # NaN/Infinity as our importer reads


def _sql_path(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


# -- JSONL ----------------------------------------------------------------------------------------
def selected_ids(con, run_id: str, filters: Filters) -> list[str]:
    """The trajectory ids ``filters`` select, in step then id order."""
    where, params = filters.where()
    return [r[0] for r in con.execute(f"SELECT traj_id FROM trajectories t WHERE run_id = ?"
                                      f"{where} ORDER BY step, traj_id", [run_id, *params]
                                      ).fetchall()]


def export_jsonl(db_path, run_id: str, out, filters: Filters = Filters(), chunk: int = 200) -> int:
    """Write the selected trajectories as generic JSONL; return how many."""
    with db.reading(db_path) as con:
        config = _run_config(con, run_id)
        ids = selected_ids(con, run_id, filters)
    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    with open(partial, "w", encoding="utf-8") as f:
        for start in range(0, len(ids), chunk):
            with db.reading(db_path) as con:  # short reads: a live run's writer gets its turns
                for rec in _records(con, run_id, ids[start:start + chunk]):
                    if f.tell() == 0:
                        rec["run"] = config
                    f.write(json.dumps(rec, ensure_ascii=False, allow_nan=False) + "\n")
    partial.replace(out)  # a reader of OUT never sees half an export
    return len(ids)


def _records(con, run_id: str, ids: list[str]) -> Iterator[dict]:
    def rows(table: str, order: str) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for row in _dicts(con.execute(f"SELECT * FROM {table} WHERE run_id = ? AND traj_id IN "
                                      f"(SELECT unnest(?)) ORDER BY traj_id, {order}",
                                      [run_id, ids])):
            out.setdefault(row["traj_id"], []).append(row)
        return out

    trajs = {tid: r[0] for tid, r in rows("trajectories", "step").items()}
    turns, rewards, tokens = rows("turns", "turn"), rows("rewards", "component"), rows("tokens", "pos")
    tests = rows("test_results", "rowid")  # test_results has no order column: keep insert order
    tags = rows("tags", "created_at")      # users' tags and notes (storage/annotations.py)
    for tid in ids:
        rec = from_rows(trajs[tid], turns.get(tid, []), rewards.get(tid, []),
                        tokens.get(tid, []), tests.get(tid, []))
        if tid in tags:   # only when tagged: an import keeps them under info.extra
            rec["tags"] = [{"tag": g["tag"], "note": g["note"]} for g in tags[tid]]
        yield rec


# -- one flattened Parquet file ---------------------------------------------------------------------
def _struct_list(con, table: str, order: str) -> str:
    cols = [c for (c,) in con.execute("SELECT column_name FROM information_schema.columns WHERE "
                                      "table_name = ? ORDER BY ordinal_position", [table]).fetchall()
            if c not in ("run_id", "step", "traj_id")]
    fields = ", ".join(f'"{c}" := x."{c}"' for c in cols)
    return (f"(SELECT list(struct_pack({fields}) ORDER BY x.{order}) FROM {table} x "
            f"WHERE x.run_id = t.run_id AND x.traj_id = t.traj_id)")


def export_parquet(db_path, run_id: str, out, filters: Filters = Filters()) -> int:
    """One flattened Parquet file: a row per trajectory with its turns, rewards and tokens."""
    where, params = filters.where()
    with db.reading(db_path) as con:
        _run_config(con, run_id)
        n = con.execute(f"SELECT count(*) FROM trajectories t WHERE run_id = ?{where}",
                        [run_id, *params]).fetchone()[0]
        con.execute(f"""COPY (
            SELECT t.*, {_struct_list(con, 'turns', 'turn')} AS turns,
                   (SELECT map(list(component ORDER BY component), list(value ORDER BY component))
                    FROM rewards x WHERE x.run_id = t.run_id AND x.traj_id = t.traj_id) AS rewards,
                   {_struct_list(con, 'tokens', 'pos')} AS tokens
            FROM trajectories t WHERE run_id = ?{where} ORDER BY step, traj_id
        ) TO {_sql_path(Path(out))} (FORMAT parquet)""", [run_id, *params])
    return n


# -- partitioned Parquet directory ----------------------------------------------------------------------
def export_partitioned(db_path, out_dir, run_ids: list[str] | None = None,
                       filters: Filters = Filters()) -> dict[str, int]:
    """Write the runs (default: all) as a hive-partitioned directory; rows written per table."""
    out_dir = Path(out_dir)
    where, where_params = filters.where("t")
    steps, step_params = filters.steps("x")
    counts = {}
    with db.reading(db_path) as con:
        known = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
        run_ids = list(run_ids or known)
        for run_id in run_ids:
            check_run_id(run_id)
            if run_id not in known:
                raise db.StoreError(f"no run {run_id!r} in {db_path}")
        tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                            "WHERE table_schema = 'main'").fetchall()]
        (out_dir / "_schema").mkdir(parents=True, exist_ok=True)
        for table in tables:
            con.execute(f"COPY (SELECT * FROM {table} LIMIT 0) TO "
                        f"{_sql_path(out_dir / '_schema' / f'{table}.parquet')} (FORMAT parquet)")
            for run_id in run_ids:  # a re-export replaces the run's partitions
                shutil.rmtree(out_dir / table / f"run_id={run_id}", ignore_errors=True)
            columns = {c for (c,) in con.execute("SELECT column_name FROM information_schema.columns "
                                                 "WHERE table_name = ?", [table]).fetchall()}
            if "run_id" not in columns:  # store-wide tables (_migrations): one plain file
                (out_dir / table).mkdir(exist_ok=True)
                con.execute(f"COPY {table} TO {_sql_path(out_dir / table / 'data.parquet')} "
                            "(FORMAT parquet)")
                continue
            sql, params = f"SELECT * FROM {table} x WHERE x.run_id IN (SELECT unnest(?))", [run_ids]
            if table in TRAJ_KEYED and where:
                sql += (f" AND x.traj_id IN (SELECT t.traj_id FROM trajectories t "
                        f"WHERE t.run_id = x.run_id{where})")
                params += where_params
            elif table in STEP_TABLES:
                sql += steps
                params += step_params
            counts[table] = con.execute(f"SELECT count(*) FROM ({sql})", params).fetchone()[0]
            if counts[table]:
                keys = "run_id, step" if "step" in columns else "run_id"
                con.execute(f"COPY ({sql}) TO {_sql_path(out_dir / table)} (FORMAT parquet, "
                            f"PARTITION_BY ({keys}), OVERWRITE_OR_IGNORE true)", params)
    marker = out_dir / db.PARQUET_MARKER
    previous = json.loads(marker.read_text())["runs"] if marker.exists() else []
    marker.write_text(json.dumps({"format": PARQUET_FORMAT, "schema_version": SCHEMA_VERSION,
                                  "runs": sorted(set(previous) | set(run_ids))}, indent=1))
    return counts
