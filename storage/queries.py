"""Every read the app does. Each function opens the store read-only, reads, closes (storage/db.py
explains why) and returns a pandas DataFrame (or a plain value).

A *store* is one DuckDB file. The app shows every store under ``sample_runs/`` and the user's
``runs/`` directory; a run is addressed by (store path, run_id). The environment variable
``AGENTRL_STORE_DIRS`` (directories separated by ``os.pathsep``) replaces that default list, e.g.
to point the app at a test fixture or at another machine's copied runs.

Every query filters on ``run_id`` first (and ``traj_id`` / ``step`` where it can), so DuckDB's
zone maps skip the row groups of other runs.
"""
from __future__ import annotations

import io
import json
from datetime import datetime
from pathlib import Path

import pandas as pd

from storage import chat_export, db
from storage.migrations import check_version
from storage.trajectory import TOKEN, columns
# The run list and the keys that say a run changed live in storage/run_queries.py.
from storage.run_queries import (  # noqa: F401  re-exported: the app reads one API
    METRICS_VERSION_SQL, OPEN_CLASS, OPEN_SQL, SHOWN_CLASS_SQL, STALE_AFTER_S, STORE_DIRS,
    STORE_DIRS_ENV, STORE_SUFFIXES, TRAJ_ROW_HASH, _read, _read_many, all_runs, discover_stores,
    is_team_store, metric_names, metric_series, metrics, row_hash, run_config, run_version, runs,
    shown_status, steps, store_dirs, team_store_snapshot)

# -- trajectories ----------------------------------------------------------------------------------
TRAJ_COLUMNS = ", ".join(c for c in columns("trajectories") if c not in ("run_id", "rank"))
"""A trajectory's columns as pages and exports read them (the trajectory model's,
storage/trajectory.py; the run and the torchrun rank left out)."""
_WHILE_OPEN = {"reward": "NULL", "success": "NULL", "failure_class": f"'{OPEN_CLASS}'"}
SHOWN_COLUMNS = ", ".join(
    f"CASE WHEN {OPEN_SQL} THEN {_WHILE_OPEN[c]} ELSE t.{c} END AS {c}" if c in _WHILE_OPEN
    else f"t.{c}" for c in TRAJ_COLUMNS.split(", "))
"""TRAJ_COLUMNS as the pages show them: an open OTLP trajectory has no reward, success or class
yet (it reads as 'open'; the store keeps what the receiver wrote, 0.0 and all)."""


def trajectories(path: str | Path, run_id: str, step: int | None = None,
                 group_id: str | None = None) -> pd.DataFrame:
    """A run's trajectories, optionally of one step and/or one group, ordered by step, group."""
    sql = f"SELECT {SHOWN_COLUMNS} FROM trajectories t WHERE run_id = ?"
    params: list = [run_id]
    if step is not None:
        sql += " AND step = ?"
        params.append(int(step))
    if group_id is not None:
        sql += " AND group_id = ?"
        params.append(group_id)
    return _read(path, sql + " ORDER BY step, group_id, traj_id", params)


def trajectory(path: str | Path, run_id: str, traj_id: str) -> dict | None:
    """One trajectory's row as a dict, or None when the run has no such trajectory."""
    df = _read(path, f"SELECT {SHOWN_COLUMNS} FROM trajectories t WHERE run_id = ? AND traj_id = ?",
               [run_id, traj_id])
    return None if df.empty else df.iloc[0].to_dict()


TURN_COLUMNS = [c for c in columns("turns") if c not in ("run_id", "step")]
"""What ``turns`` returns. ``state_key`` and ``info`` came with schema 3: a store recorded
before (a read-only sample run, an older Parquet export) reads them as NULL."""


def turns(path: str | Path, run_id: str, traj_ids: list[str]) -> pd.DataFrame:
    """Turns of the given trajectories, in order."""
    # ``*``: a store without the newer columns is read as it is (opened read-only, it cannot
    # be migrated), and the missing columns are added as NULL below.
    df = _read(path, """
        SELECT * EXCLUDE (run_id, step)
        FROM turns WHERE run_id = ? AND traj_id IN (SELECT unnest(?))
        ORDER BY traj_id, turn""", [run_id, list(traj_ids)])
    for name in TURN_COLUMNS:
        if name not in df:
            df[name] = pd.Series([None] * len(df), index=df.index, dtype=object)
    return df[TURN_COLUMNS]


def tokens(path: str | Path, run_id: str, traj_id: str) -> pd.DataFrame:
    """Every token of one trajectory's context, by position; ``train_logprob`` is NULL in stores
    recorded before it (schema < 6), ``rejected`` (rollout correction's, schema 10) likewise."""
    with db.reading(path) as con:
        version = check_version(con, where=str(path))
        if version == 0:
            raise db.StoreError(f"{path} is not a store of this project (no schema recorded)")
        have = {c for (c,) in con.execute("SELECT column_name FROM information_schema.columns "
                                          "WHERE table_name = 'tokens'").fetchall()}
        listed = ", ".join(f.name if f.name in have else f"NULL::{f.sql} AS {f.name}"
                           for f in TOKEN if f.name in TOKEN_COLUMNS)
        return con.execute(f"SELECT {listed} FROM tokens WHERE run_id = ? AND traj_id = ? "
                           "ORDER BY pos", [run_id, traj_id]).df()


TOKEN_COLUMNS = tuple(c for c in columns("tokens") if c not in ("run_id", "step", "traj_id"))
"""What ``tokens`` returns (the trajectory model's token columns); a column newer than the
store (``train_logprob``, schema 6; ``rejected``, schema 10) reads as NULL."""


def rewards(path: str | Path, run_id: str, traj_ids: list[str]) -> pd.DataFrame:
    """Long table (traj_id, component, value) of reward components."""
    return _read(path, """
        SELECT traj_id, component, value FROM rewards
        WHERE run_id = ? AND traj_id IN (SELECT unnest(?)) ORDER BY traj_id, component""",
                 [run_id, list(traj_ids)])


def test_results(path: str | Path, run_id: str, traj_ids: list[str]) -> pd.DataFrame:
    """Unit-test outcomes (apps-style environments) of the given trajectories."""
    return _read(path, """
        SELECT traj_id, name, passed, detail FROM test_results
        WHERE run_id = ? AND traj_id IN (SELECT unnest(?)) ORDER BY traj_id, name""",
                 [run_id, list(traj_ids)])


def groups(path: str | Path, run_id: str, step: int) -> pd.DataFrame:
    """One row per task group of a step: size, reward mean/std, successes, filtered."""
    # an open OTLP trajectory (its agent still runs) has no reward yet: not averaged as 0.0
    return _read(path, f"""
        SELECT group_id, any_value(task_id) AS task_id, count(*) AS size,
               avg(CASE WHEN {OPEN_SQL} THEN NULL ELSE reward END) AS reward_mean,
               coalesce(stddev_samp(CASE WHEN {OPEN_SQL} THEN NULL ELSE reward END), 0)
                   AS reward_std,
               sum(CASE WHEN success AND NOT {OPEN_SQL} THEN 1 ELSE 0 END) AS successes,
               bool_or(coalesce(filtered, false)) AS filtered
        FROM trajectories t WHERE run_id = ? AND step = ?
        GROUP BY group_id ORDER BY group_id""", [run_id, int(step)])


def grad_stats(path: str | Path, run_id: str, step: int | None = None) -> pd.DataFrame:
    """Per-module gradient norms (step, module, norm)."""
    return _read(path, *_grad_stats_sql(run_id, step))


def _grad_stats_sql(run_id: str, step: int | None) -> tuple[str, list]:
    sql = "SELECT step, module, norm FROM grad_stats WHERE run_id = ?"
    params: list = [run_id]
    if step is not None:
        sql += " AND step = ?"
        params.append(int(step))
    return sql + " ORDER BY step, module", params


TOP_GRADIENT_SQL = """
    SELECT traj_id, group_id, task_id, reward, advantage, grad_norm, failure_class
    FROM trajectories WHERE run_id = ? AND step = ? AND grad_norm IS NOT NULL
    ORDER BY grad_norm DESC LIMIT ?"""


def top_gradient_trajectories(path: str | Path, run_id: str, step: int,
                              limit: int = 20) -> pd.DataFrame:
    """A step's trajectories ranked by their gradient contribution (trajectories.grad_norm)."""
    return _read(path, TOP_GRADIENT_SQL, [run_id, int(step), int(limit)])


def step_gradients(path: str | Path, run_id: str, step: int, limit: int = 20
                   ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``top_gradient_trajectories`` and ``grad_stats`` of one step, read in one open."""
    top, modules = _read_many(path, [(TOP_GRADIENT_SQL, [run_id, int(step), int(limit)]),
                                     _grad_stats_sql(run_id, step)])
    return top, modules


# -- failures, search, tasks, tags -----------------------------------------------------------------
def failure_counts(path: str | Path, run_id: str) -> pd.DataFrame:
    """Counts per (step, split, failure_class); a NULL class reads 'success' or 'unclassified',
    an OTLP trajectory whose agent still runs 'open' (SHOWN_CLASS_SQL)."""
    return _read(path, f"""
        SELECT step, split, {SHOWN_CLASS_SQL} AS failure_class, count(*) AS n
        FROM trajectories t WHERE run_id = ? GROUP BY ALL ORDER BY step, failure_class""",
                 [run_id])


def search_trajectories(path: str | Path, run_id: str, text: str = "",
                        classes: list[str] | None = None, step_range: tuple[int, int] | None = None,
                        splits: list[str] | None = None, success: bool | None = None,
                        limit: int | None = 500, tags: list[str] | None = None) -> pd.DataFrame:
    """Trajectories matching the facets, the first ``limit`` (None: all); ``text`` is searched
    (case-insensitive substring, as a parameter: never spliced into SQL) in every turn's action
    and observation, in the prompt and in the tags and notes users saved; ``tags``: only
    trajectories carrying at least one of them."""
    where, params = _facets(run_id, text, classes, step_range, splits, success, tags)
    sql = f"""SELECT t.step, t.traj_id, t.group_id, t.task_id, t.split,
                     CASE WHEN {OPEN_SQL} THEN NULL ELSE t.reward END AS reward,
                     CASE WHEN {OPEN_SQL} THEN NULL ELSE t.success END AS success,
                     t.num_turns, t.finish_reason, {SHOWN_CLASS_SQL} AS failure_class
              FROM trajectories t WHERE {where}
              ORDER BY t.step, t.group_id, t.traj_id"""
    if limit is None:
        return _read(path, sql, params)
    return _read(path, sql + " LIMIT ?", params + [int(limit)])


def count_trajectories(path: str | Path, run_id: str, text: str = "",
                       classes: list[str] | None = None, step_range: tuple[int, int] | None = None,
                       splits: list[str] | None = None, success: bool | None = None,
                       tags: list[str] | None = None) -> int:
    """How many trajectories ``search_trajectories`` would list without its limit."""
    where, params = _facets(run_id, text, classes, step_range, splits, success, tags)
    return int(_read(path, f"SELECT count(*) AS n FROM trajectories t WHERE {where}",
                     params)["n"].iloc[0])


def _facets(run_id, text, classes, step_range, splits, success, tags=None) -> tuple[str, list]:
    """The WHERE clause (over ``trajectories t``) and parameters of the search's facets."""
    where = ["t.run_id = ?"]
    params: list = [run_id]
    if classes:
        where.append(f"{SHOWN_CLASS_SQL} IN (SELECT unnest(?))")
        params.append(list(classes))
    if step_range is not None:
        where.append("t.step BETWEEN ? AND ?")
        params += [int(step_range[0]), int(step_range[1])]
    if splits:
        where.append("t.split IN (SELECT unnest(?))")
        params.append(list(splits))
    if success is not None:
        where.append(f"coalesce(t.success, false) = ? AND NOT {OPEN_SQL}")  # open: no outcome
        params.append(bool(success))
    if tags:
        where.append("EXISTS (SELECT 1 FROM tags g WHERE g.run_id = t.run_id "
                     "AND g.traj_id = t.traj_id AND g.tag IN (SELECT unnest(?)))")
        params.append(list(tags))
    if text:
        # A literal substring test: no wildcards to escape. ILIKE with an ESCAPE clause takes
        # DuckDB's general pattern matcher, ~40% more CPU on 250k turns (bench/queries.py).
        where.append("""(contains(lower(t.prompt), lower(?)) OR EXISTS (
            SELECT 1 FROM turns u WHERE u.run_id = t.run_id AND u.traj_id = t.traj_id
              AND (contains(lower(u.action), lower(?))
                   OR contains(lower(u.observation), lower(?))))
            OR EXISTS (SELECT 1 FROM tags g WHERE g.run_id = t.run_id AND g.traj_id = t.traj_id
              AND (contains(lower(g.tag), lower(?)) OR contains(lower(g.note), lower(?)))))""")
        params += [text, text, text, text, text]
    return " AND ".join(where), params


def table_columns(path: str | Path) -> pd.DataFrame:
    """The store's tables and views with their columns in order, for the SQL box:
    (table, columns), ``columns`` as "name TYPE, ..." (the schema's own bookkeeping left out)."""
    return _read(path, """
        SELECT table_name AS "table",
               string_agg(column_name || ' ' || data_type, ', ' ORDER BY ordinal_position)
                   AS columns
        FROM information_schema.columns
        WHERE table_catalog = current_database() AND table_schema = 'main'
          AND NOT starts_with(table_name, '_')
        GROUP BY table_name ORDER BY table_name""")


def task_history(path: str | Path, run_id: str, task_id: str) -> pd.DataFrame:
    """One task followed across steps: (step, split, rollouts, successes, reward_mean, classes)."""
    return _read(path, f"""
        SELECT step, split, count(*) AS rollouts,
               sum(CASE WHEN success AND NOT {OPEN_SQL} THEN 1 ELSE 0 END) AS successes,
               avg(CASE WHEN {OPEN_SQL} THEN NULL ELSE reward END) AS reward_mean,
               string_agg(DISTINCT {SHOWN_CLASS_SQL}, ', ') AS classes
        FROM trajectories t WHERE run_id = ? AND task_id = ?
        GROUP BY step, split ORDER BY step, split""", [run_id, task_id])


def task_ids(path: str | Path, run_id: str) -> list[str]:
    df = _read(path, "SELECT DISTINCT task_id FROM trajectories WHERE run_id = ? "
                     "AND task_id IS NOT NULL ORDER BY task_id", [run_id])
    return df["task_id"].tolist()


def tags(path: str | Path, run_id: str, traj_ids: list[str] | None = None) -> pd.DataFrame:
    """Tags and notes users saved on trajectories (storage/annotations.py writes them)."""
    sql = "SELECT traj_id, tag, note, created_at FROM tags WHERE run_id = ?"
    params: list = [run_id]
    if traj_ids is not None:
        sql += " AND traj_id IN (SELECT unnest(?))"
        params.append(list(traj_ids))
    return _read(path, sql + " ORDER BY created_at", params)


# -- export ----------------------------------------------------------------------------------------
def export_trajectories(path: str | Path, run_id: str, traj_ids: list[str],
                        fmt: str = "jsonl") -> bytes:
    """The given trajectories with their turns, reward components and the tags and notes users
    saved on them, as JSONL (one trajectory per line, turns nested) or Parquet (one row per
    trajectory, turns and tags as JSON strings); ``messages``: the chat dataset with tool calls
    that TRL's SFTTrainer loads (storage/chat_export.py)."""
    if fmt == "messages":
        return chat_export.messages_bytes(path, run_id, traj_ids)
    if fmt not in ("jsonl", "parquet"):
        raise ValueError(f"format must be jsonl, parquet or messages, got {fmt!r}")
    traj = _read(path, f"SELECT {TRAJ_COLUMNS} FROM trajectories WHERE run_id = ? "
                       "AND traj_id IN (SELECT unnest(?)) ORDER BY step, traj_id",
                 [run_id, list(traj_ids)])
    turn_rows = turns(path, run_id, traj_ids)
    comp = rewards(path, run_id, traj_ids)
    saved = tags(path, run_id, traj_ids)
    records = []
    for row in traj.to_dict("records"):
        tid = row["traj_id"]
        record = {k: _plain(v) for k, v in row.items()}
        record["run_id"] = run_id
        record["turns"] = [{k: _plain(v) for k, v in t.items() if k != "traj_id"}
                           for t in turn_rows[turn_rows["traj_id"] == tid].to_dict("records")]
        record["rewards"] = {c: _plain(v) for c, v in
                             comp[comp["traj_id"] == tid][["component", "value"]].values}
        record["tags"] = [{"tag": g, "note": _plain(n)} for g, n in
                          saved[saved["traj_id"] == tid][["tag", "note"]].values]
        records.append(record)
    if fmt == "jsonl":
        return "".join(json.dumps(r, default=str) + "\n" for r in records).encode("utf-8")
    flat = pd.DataFrame([{**r, "turns": json.dumps(r["turns"], default=str),
                          "rewards": json.dumps(r["rewards"]), "tags": json.dumps(r["tags"])}
                         for r in records])
    buf = io.BytesIO()
    flat.to_parquet(buf, index=False)
    return buf.getvalue()


def _plain(value):
    """A JSON-friendly Python value (NaN -> None, numpy scalars -> Python)."""
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, (pd.Timestamp, datetime)):
        return value.isoformat()
    return value


# The per-turn analyses live in storage/turn_queries.py; pages read them from here, like the rest.
# Cross-evaluations (core/jobs/evaluation.py) and the adapter snapshots they load, for Compare.
from storage.evalsets import adapter_steps, cross_evaluations  # noqa: E402,F401

# The training-inference mismatch of one step's tokens (core/learn/mismatch.py), for Dynamics.
from storage.mismatch_queries import distribution as mismatch_distribution  # noqa: E402,F401
from storage.mismatch_queries import ranking as mismatch_ranking  # noqa: E402,F401
from storage.turn_queries import (BRANCH_SIGNALS, branch_children, branch_estimates, branch_parent,
                                  branch_worst_turns, eval_diff, evaluations, failure_clusters,
                                  first_divergence, renders, signal_by_turn, signal_names,
                                  turn_signals)  # noqa: E402,F401

# The trajectories behind a step's advantage covariance with a behaviour (storage/behaviours/).
from storage.behaviour_queries import contributors as behaviour_contributors  # noqa: E402,F401
