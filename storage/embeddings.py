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


K_FIRST = 12
"""The cluster job tries k = 2..K_FIRST first (core/jobs/clusters.py)."""
K_LIMIT = 24
"""... and, while the best k is the top of the range tried, extends it by K_FIRST up to K_LIMIT.
A best k at K_LIMIT is still at the edge: the failures may split further than was tried."""
SILHOUETTE_REASONABLE = 0.5
SILHOUETTE_WEAK = 0.25
"""The usual reading of a mean silhouette (Kaufman & Rousseeuw 1990, "Finding Groups in Data"):
above 0.5 a reasonable structure, 0.25 to 0.5 weak (it could be artificial), below 0.25 no
substantial structure. Below SILHOUETTE_WEAK the Failures page does not name the clusters."""


def confidence(k: int, silhouette: float | None, k_limit: int = K_LIMIT) -> tuple[str, bool, str]:
    """(level, named, sentence): how far a clustering can be read as failure modes.

    level: "reasonable" (s > 0.5), "weak" (0.25 <= s <= 0.5, or k at ``k_limit``, the edge of the
    searched range), "none" (s < 0.25: no substantial structure), "single" (k = 1, no silhouette).
    named: whether the clusters may be named by their terms (not when level is "none")."""
    if k <= 1 or silhouette is None or silhouette != silhouette:
        return "single", True, ("One cluster: too few distinct failures to compare (no "
                                "silhouette).")
    s = float(silhouette)
    if s < SILHOUETTE_WEAK:
        level, said = "none", (f"Silhouette {s:.2f} < {SILHOUETTE_WEAK}: no substantial "
                               "structure (Kaufman & Rousseeuw). These clusters are a partition "
                               "of the failures, not failure modes: they are not named.")
    elif s <= SILHOUETTE_REASONABLE:
        level, said = "weak", (f"Silhouette {s:.2f}, between {SILHOUETTE_WEAK} and "
                               f"{SILHOUETTE_REASONABLE}: a weak structure; check a cluster's "
                               "members before trusting its name.")
    else:
        level, said = "reasonable", (f"Silhouette {s:.2f} > {SILHOUETTE_REASONABLE}: a "
                                     "reasonable structure.")
    if k >= k_limit:
        said += (f" k = {k} is the top of the range searched (2..{k_limit}): the failures may "
                 "split further, so k is a bound, not a finding.")
        level = "weak" if level == "reasonable" else level
    return level, level != "none", said


def failing(path: str | Path, run_id: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The run's trajectories that did not succeed, and their turns (observations trimmed).

    Returns (trajectories: traj_id, step, split, failure_class, answer, finish_reason, task_id,
    golds;
    turns: traj_id, turn, action, observation, error), both ordered."""
    with db.reading(path) as con:
        if check_version(con, where=str(path)) == 0:
            raise db.StoreError(f"{path} is not a store of this project (no schema recorded)")
        known = con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
        if not known:
            raise ValueError(f"{path} has no run {run_id!r}")
        traj = con.execute("""
            SELECT traj_id, step, split, coalesce(failure_class, 'unclassified') AS failure_class,
                   answer, finish_reason, task_id, golds
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
