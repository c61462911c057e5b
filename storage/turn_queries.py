"""Reads of the per-turn analyses the app shows: training's per-turn signals, branch-from-turn
estimates, failure clusters and checkpoint A vs B. Part of the app's read layer: pages reach these
through ``storage.queries``, which re-exports them. Every function returns an empty result for a
store recorded before its table existed.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from storage import db, evaldiff
from storage.migrations import check_version


# -- per-turn signals (turn_signals, migration m004) -----------------------------------------------
def turn_signals(path: str | Path, run_id: str, traj_ids: list[str],
                 names: list[str] | None = None) -> pd.DataFrame:
    """Per-turn signals of ``traj_ids`` (traj_id, turn, name, value, source), by trajectory and
    turn; empty for a store recorded before the table existed (schema < 4) or when none was
    computed."""
    cols = ["traj_id", "turn", "name", "value", "source"]
    with db.reading(path) as con:
        check_version(con, where=str(path))
        if not traj_ids or not _has_table(con, "turn_signals"):
            return pd.DataFrame(columns=cols)
        sql = ("SELECT traj_id, turn, name, value, source FROM turn_signals WHERE run_id = ? "
               "AND traj_id IN (SELECT unnest(?))")
        params: list = [run_id, list(traj_ids)]
        if names:
            sql += " AND name IN (SELECT unnest(?))"
            params.append(list(names))
        return con.execute(sql + " ORDER BY traj_id, turn, name", params).df()


def signal_by_turn(path: str | Path, run_id: str, name: str = "info_gain") -> pd.DataFrame:
    """Mean of one per-turn signal by step and turn index over the run's training trajectories
    (step, turn, mean, n); empty when the store has no turn_signals table or none of ``name``."""
    with db.reading(path) as con:
        check_version(con, where=str(path))
        if not _has_table(con, "turn_signals"):
            return pd.DataFrame(columns=["step", "turn", "mean", "n"])
        return con.execute(
            "SELECT step, turn, avg(value) AS mean, count(*) AS n FROM turn_signals "
            "WHERE run_id = ? AND name = ? AND source = 'train' GROUP BY step, turn "
            "ORDER BY step, turn", [run_id, name]).df()


def signal_names(path: str | Path, run_id: str, source: str = "train") -> list[str]:
    """The per-turn signal names a run recorded from ``source`` (sorted; [] before schema 4)."""
    with db.reading(path) as con:
        check_version(con, where=str(path))
        if not _has_table(con, "turn_signals"):
            return []
        return [r[0] for r in con.execute(
            "SELECT DISTINCT name FROM turn_signals WHERE run_id = ? AND source = ? ORDER BY 1",
            [run_id, source]).fetchall()]


# -- an environment's own pictures (renders, migration m007) --------------------------------------
RENDER_READ_CAP = 300_000
"""The largest picture body read back (the rollout keeps at most 200,000 bytes, 267,000 as PNG
base64): a bigger one, in a store written by other means, is read as NULL with its size."""


def renders(path: str | Path, run_id: str, traj_id: str) -> pd.DataFrame:
    """The environment's pictures of one trajectory's states (turn, kind, body, size): turn -1
    the state after reset. Empty for a store recorded before the table existed (schema < 7), or
    an environment without ``render``."""
    cols = ["turn", "kind", "body", "size"]
    with db.reading(path) as con:
        check_version(con, where=str(path))
        if not _has_table(con, "renders"):
            return pd.DataFrame(columns=cols)
        return con.execute(
            "SELECT turn, kind, CASE WHEN strlen(body) <= ? THEN body END AS body, "
            "strlen(body) AS size FROM renders WHERE run_id = ? AND traj_id = ? "
            "ORDER BY turn", [RENDER_READ_CAP, run_id, traj_id]).df()


# -- branch-from-turn analyses (branches + turn_signals source 'branch', core/jobs/branch.py) -----------
BRANCH_SIGNALS = ["v", "q", "a", "v_lo", "v_hi", "q_lo", "q_hi", "a_lo", "a_hi", "n", "k_needed",
                  "worst"]


def branch_estimates(path: str | Path, run_id: str, traj_id: str) -> pd.DataFrame:
    """Per analysed turn of ``traj_id``: V, Q, A = Q - V with their intervals, n continuations per
    kind, k_needed (continuations per kind to tell A from 0; NaN in jobs recorded before it),
    worst (1.0 on the turn that lost the most); empty when never branched (or schema < 4)."""
    with db.reading(path) as con:
        check_version(con, where=str(path))
        if not _has_table(con, "turn_signals"):
            return pd.DataFrame(columns=["turn", *BRANCH_SIGNALS])
        long = con.execute("SELECT turn, name, value FROM turn_signals WHERE run_id = ? AND "
                           "traj_id = ? AND source = 'branch'", [run_id, traj_id]).df()
    if long.empty:
        return pd.DataFrame(columns=["turn", *BRANCH_SIGNALS])
    wide = long.pivot_table(index="turn", columns="name", values="value", aggfunc="last")
    return wide.reindex(columns=BRANCH_SIGNALS).reset_index().sort_values("turn")


def branch_children(path: str | Path, run_id: str, traj_id: str) -> pd.DataFrame:
    """The continuations of ``traj_id``: (turn, kind, child_traj_id, return, success,
    finish_reason, num_turns, step, checkpoint_step, job_id, seed), by turn and kind."""
    cols = ["turn", "kind", "child_traj_id", "return", "success", "finish_reason", "num_turns",
            "step", "checkpoint_step", "job_id", "seed"]
    with db.reading(path) as con:
        check_version(con, where=str(path))
        if not _has_table(con, "branches"):
            return pd.DataFrame(columns=cols)
        return con.execute(
            "SELECT b.turn, b.kind, b.child_traj_id, b.return, t.success, t.finish_reason, "
            "t.num_turns, t.step, b.checkpoint_step, b.job_id, b.seed FROM branches b "
            "LEFT JOIN trajectories t ON t.run_id = b.run_id AND t.traj_id = b.child_traj_id "
            "WHERE b.run_id = ? AND b.traj_id = ? ORDER BY b.turn, b.kind, b.child_traj_id",
            [run_id, traj_id]).df()


def branch_snapshots(path: str | Path, run_id: str) -> list[int]:
    """The adapter snapshot steps ``run_id``'s branch jobs continued with, ascending: what a
    copy of the store must carry for its branch forms to run again."""
    with db.reading(path) as con:
        check_version(con, where=str(path))
        if not _has_table(con, "branches"):
            return []
        rows = con.execute("SELECT DISTINCT checkpoint_step FROM branches WHERE run_id = ? "
                           "ORDER BY 1", [run_id]).fetchall()
    return [int(r[0]) for r in rows]


def branch_parent(path: str | Path, run_id: str, child_traj_id: str) -> dict | None:
    """For a continuation: {traj_id (its parent), turn, kind, step}; None for any other."""
    with db.reading(path) as con:
        check_version(con, where=str(path))
        if not _has_table(con, "branches"):
            return None
        row = con.execute(
            "SELECT b.traj_id, b.turn, b.kind, t.step FROM branches b LEFT JOIN trajectories t "
            "ON t.run_id = b.run_id AND t.traj_id = b.traj_id "
            "WHERE b.run_id = ? AND b.child_traj_id = ?", [run_id, child_traj_id]).fetchone()
    return None if row is None else {"traj_id": row[0], "turn": int(row[1]), "kind": row[2],
                                     "step": None if row[3] is None else int(row[3])}


def branch_worst_turns(path: str | Path, run_id: str, traj_ids: list[str]) -> pd.DataFrame:
    """Of ``traj_ids``, those with a branch analysis: (traj_id, analysed turns, worst turn or NULL
    when no recorded action lost value)."""
    cols = ["traj_id", "turns", "worst_turn"]
    with db.reading(path) as con:
        check_version(con, where=str(path))
        if not traj_ids or not _has_table(con, "turn_signals"):
            return pd.DataFrame(columns=cols)
        return con.execute(
            "SELECT traj_id, count(*) AS turns, "
            "min(turn) FILTER (WHERE value = 1.0) AS worst_turn FROM turn_signals "
            "WHERE run_id = ? AND traj_id IN (SELECT unnest(?)) AND source = 'branch' "
            "AND name = 'worst' GROUP BY traj_id ORDER BY traj_id", [run_id, list(traj_ids)]).df()


# -- failure clusters (core/jobs/clusters.py writes them; a store before schema 5 has none) -----------
def _has_table(con, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.tables "
                            "WHERE table_schema = 'main' AND table_name = ?", [name]).fetchone()[0])


def failure_clusters(path: str | Path, run_id: str) -> dict[str, pd.DataFrame]:
    """The run's latest failure clusters, read in one open; empty frames when none were computed.

    ``clusters``: cluster, size, share (of the clustered trajectories), terms, central (the 3
    members closest to the centroid, comma-separated), classes (failure classes by count), model,
    k, silhouette, created_at. ``per_step``: step, cluster, n, share (of that step's clustered
    failures). ``members``: traj_id, step, cluster, distance, failure_class, split, task_id."""
    empty = {"clusters": pd.DataFrame(columns=["cluster", "size", "share", "terms", "central",
                                               "classes", "model", "k", "silhouette",
                                               "created_at"]),
             "per_step": pd.DataFrame(columns=["step", "cluster", "n", "share"]),
             "members": pd.DataFrame(columns=["traj_id", "step", "cluster", "distance",
                                              "failure_class", "split", "task_id"])}
    with db.reading(path) as con:
        if check_version(con, where=str(path)) == 0:
            raise db.StoreError(f"{path} is not a store of this project (no schema recorded)")
        if not _has_table(con, "failure_clusters"):
            return empty
        # The newest clustering of the run (a job replaces one model's rows; two models' results
        # may coexist: show the one computed last).
        latest = """(SELECT model FROM failure_clusters WHERE run_id = ?
                     ORDER BY created_at DESC LIMIT 1)"""
        members = con.execute(f"""
            SELECT f.traj_id, f.step, f.cluster, f.distance,
                   coalesce(t.failure_class, 'unclassified') AS failure_class, t.split, t.task_id,
                   f.terms, f.model, f.k, f.silhouette, f.created_at
            FROM failure_clusters f
            LEFT JOIN trajectories t ON t.run_id = f.run_id AND t.traj_id = f.traj_id
            WHERE f.run_id = ? AND f.model = {latest}
            ORDER BY f.cluster, f.distance, f.traj_id""", [run_id, run_id]).df()
    if members.empty:
        return empty
    rows = []
    for cid, g in members.groupby("cluster", sort=True):
        classes = g["failure_class"].value_counts()
        rows.append({"cluster": int(cid), "size": len(g), "share": len(g) / len(members),
                     "terms": g["terms"].iloc[0], "central": ", ".join(g["traj_id"].head(3)),
                     "classes": ", ".join(f"{k} {v}" for k, v in classes.items()),
                     "model": g["model"].iloc[0], "k": int(g["k"].iloc[0]),
                     "silhouette": g["silhouette"].iloc[0], "created_at": g["created_at"].iloc[0]})
    per_step = members.groupby(["step", "cluster"], as_index=False).size().rename(
        columns={"size": "n"})
    per_step["share"] = per_step["n"] / per_step.groupby("step")["n"].transform("sum")
    return {"clusters": pd.DataFrame(rows), "per_step": per_step,
            "members": members[empty["members"].columns.tolist()]}


# -- checkpoint A vs B (storage/evaldiff.py computes; these are the page's entry points) ----------
def evaluations(path: str | Path, imported_train: bool = False) -> pd.DataFrame:
    """Every held-out evaluation (run_id, name, step, split, trajectories, tasks, solved) in the
    store; ``imported_train``: imported runs' train steps too (storage.evaldiff.evaluations)."""
    return evaldiff.evaluations(path, imported_train)


def eval_diff(path: str | Path, a: tuple[str, int], b: tuple[str, int],
              imported_train: bool = False) -> dict:
    """Evaluation ``a`` vs ``b`` (each (run_id, step)): see storage.evaldiff.diff."""
    return evaldiff.diff(path, a, b, imported_train)


def first_divergence(turns_a: pd.DataFrame, turns_b: pd.DataFrame) -> int | None:
    """The first turn where two trajectories differ (storage.evaldiff.first_divergence)."""
    return evaldiff.first_divergence(turns_a, turns_b)
