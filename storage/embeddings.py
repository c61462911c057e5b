"""The failure-cluster job's reads and writes (core/jobs/clusters.py computes, this stores).

Embeddings are cached per (run, trajectory, model) with the hash of the text that was embedded:
a rerun embeds only trajectories that are new or whose text changed. Each chunk of vectors is
its own short write transaction, so a killed job keeps what it had embedded and a running
trainer's steps interleave with it. A store recorded before schema 5 is migrated first (the
tables are added; nothing recorded is touched).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from storage import db
from storage.migrations import check_version, prepare
from storage.recorder import now

OBS_CHARS = 160
"""Characters of each observation read for a trajectory's text (its start names what came back;
the rest is mostly retrieved documents or board drawings that would drown the actions)."""


def failing(path: str | Path, run_id: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The run's trajectories that did not succeed, and their turns (observations trimmed).

    Returns (trajectories: traj_id, step, split, failure_class, answer, finish_reason;
    turns: traj_id, turn, action, observation, error), both ordered."""
    with db.reading(path) as con:
        if check_version(con, where=str(path)) == 0:
            raise db.StoreError(f"{path} is not a store of this project (no schema recorded)")
        known = con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
        if not known:
            raise ValueError(f"{path} has no run {run_id!r}")
        traj = con.execute("""
            SELECT traj_id, step, split, coalesce(failure_class, 'unclassified') AS failure_class,
                   answer, finish_reason
            FROM trajectories WHERE run_id = ? AND NOT coalesce(success, false)
            ORDER BY step, traj_id""", [run_id]).df()
        has_error = con.execute("""SELECT count(*) FROM information_schema.columns
                                   WHERE table_name = 'turns' AND column_name = 'error'""").fetchone()[0]
        turns = con.execute(f"""
            SELECT u.traj_id, u.turn, u.action, left(u.observation, {OBS_CHARS}) AS observation,
                   {'u.error' if has_error else 'NULL'} AS error
            FROM turns u JOIN trajectories t ON t.run_id = u.run_id AND t.traj_id = u.traj_id
            WHERE u.run_id = ? AND NOT coalesce(t.success, false)
            ORDER BY u.traj_id, u.turn""", [run_id]).df()
    return traj, turns


def cached(path: str | Path, run_id: str, model: str) -> dict[str, tuple[str, np.ndarray]]:
    """traj_id -> (text_hash, vector) of the embeddings already stored for this run and model;
    {} for a store recorded before the embeddings table."""
    with db.reading(path) as con:
        if check_version(con, where=str(path)) < 4:
            return {}
        table = con.execute("""SELECT traj_id, text_hash, vector FROM embeddings
                               WHERE run_id = ? AND model = ?""",
                            [run_id, model]).to_arrow_table()
    if table.num_rows == 0:
        return {}
    # Through Arrow: one flat float array, not 10,000 Python lists (~20x faster).
    column = table.column("vector").combine_chunks()
    offsets = column.offsets.to_numpy()
    flat = column.values.to_numpy(zero_copy_only=False).astype(np.float32)
    ids, hashes = table.column("traj_id").to_pylist(), table.column("text_hash").to_pylist()
    return {t: (h, flat[offsets[i]:offsets[i + 1]]) for i, (t, h) in enumerate(zip(ids, hashes))}


def save_embeddings(path: str | Path, run_id: str, model: str, traj_ids: list[str],
                    hashes: list[str], vectors: np.ndarray) -> None:
    """Store (replace) the vectors of ``traj_ids`` in one transaction."""
    prepare(path)
    # deferred: pyarrow (large), only on the Arrow/Parquet path
    import pyarrow as pa
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    offsets = np.arange(0, vectors.size + 1, vectors.shape[1], dtype=np.int32)
    frame = pa.table({"run_id": [run_id] * len(traj_ids), "traj_id": list(traj_ids),
                      "model": [model] * len(traj_ids), "text_hash": list(hashes),
                      "vector": pa.ListArray.from_arrays(pa.array(offsets),
                                                         pa.array(vectors.ravel())),
                      "created_at": pa.array([now()] * len(traj_ids), pa.timestamp("us"))})
    with db.writing(path) as con:
        con.execute("DELETE FROM embeddings WHERE run_id = ? AND model = ? "
                    "AND traj_id IN (SELECT unnest(?))", [run_id, model, list(traj_ids)])
        con.register("new_embeddings", frame)
        con.execute("""INSERT INTO embeddings (run_id, traj_id, model, text_hash, vector,
                                               created_at)
                       SELECT run_id, traj_id, model, text_hash, vector::FLOAT[], created_at
                       FROM new_embeddings""")
        con.unregister("new_embeddings")


def save_clusters(path: str | Path, run_id: str, model: str, rows: pd.DataFrame) -> None:
    """Replace the run's clusters for ``model`` with ``rows`` (columns of failure_clusters less
    run_id, model and created_at)."""
    prepare(path)
    frame = rows.assign(run_id=run_id, model=model, created_at=now())
    with db.writing(path) as con:
        con.execute("DELETE FROM failure_clusters WHERE run_id = ? AND model = ?",
                    [run_id, model])
        con.register("new_clusters", frame)
        con.execute("""INSERT INTO failure_clusters (run_id, model, traj_id, step, cluster,
                                                     distance, terms, k, silhouette, created_at)
                       SELECT run_id, model, traj_id, step, cluster, distance, terms, k,
                              silhouette, created_at FROM new_clusters""")
        con.unregister("new_clusters")
