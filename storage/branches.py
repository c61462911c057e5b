"""Branch-from-turn jobs in the store (core/jobs/branch.py): what a job reads of a recorded trajectory,
and its one write transaction.

A job's continuations are ordinary trajectories (split ``branch``) with their rewards, turns and
tokens, plus one ``branches`` row each and the per-turn summary in ``turn_signals``
(``source = 'branch'``). Everything of a job is written in one transaction, so a job killed
midway leaves nothing; a new job on the same turns of the same trajectory replaces the earlier
analysis of those turns (its continuations included) in that same transaction.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from storage import db
from storage.migrations import prepare
from storage.recorder import insert_frame, to_frame

CHILD_TABLES = ("trajectories", "rewards", "turns", "tokens", "test_results", "renders")


def parent(path: str | Path, run_id: str, traj_id: str) -> dict | None:
    """The run (source, config) and one trajectory with its turns and tokens, or None when the
    run is not in the store; ``traj`` is None when the trajectory is not."""
    with db.reading(path) as con:
        run = con.execute("SELECT source, config, status FROM runs WHERE run_id = ?",
                          [run_id]).fetchone()
        if run is None:
            return None
        traj = con.execute("SELECT * FROM trajectories WHERE run_id = ? AND traj_id = ?",
                           [run_id, traj_id]).df()
        turns = con.execute("SELECT * FROM turns WHERE run_id = ? AND traj_id = ? ORDER BY turn",
                            [run_id, traj_id]).df()
        tokens = con.execute(
            "SELECT pos, token_id, text, role, trained, logprob, turn FROM tokens "
            "WHERE run_id = ? AND traj_id = ? ORDER BY pos", [run_id, traj_id]).df()
    config = run[1]
    return {"source": run[0] or "trainer", "status": run[2],
            "config": json.loads(config) if isinstance(config, str) else (config or {}),
            "traj": None if traj.empty else traj.iloc[0].to_dict(),
            "turns": turns.to_dict("records"), "tokens": tokens}


def write_job(path: str | Path, run_id: str, step: int, traj_id: str, turns: list[int],
              tables: dict, branches: pd.DataFrame, signals: pd.DataFrame) -> None:
    """One transaction: drop an earlier analysis of ``turns`` of ``traj_id`` (its branches rows,
    continuations and branch turn_signals), then insert the continuations' ``tables`` (the
    recorder's per-trajectory tables, at the parent's ``step``), ``branches`` and ``signals``."""
    prepare(path)
    frames = {t: to_frame(t, rows) for t, rows in tables.items()}
    with db.writing(path) as con:
        old = [r[0] for r in con.execute(
            "SELECT child_traj_id FROM branches WHERE run_id = ? AND traj_id = ? "
            "AND list_contains(?::INTEGER[], turn)", [run_id, traj_id, turns]).fetchall()]
        if old:
            for table in CHILD_TABLES:
                con.execute(f"DELETE FROM {table} WHERE run_id = ? "
                            "AND list_contains(?::VARCHAR[], traj_id)", [run_id, old])
        con.execute("DELETE FROM branches WHERE run_id = ? AND traj_id = ? "
                    "AND list_contains(?::INTEGER[], turn)", [run_id, traj_id, turns])
        con.execute("DELETE FROM turn_signals WHERE run_id = ? AND traj_id = ? "
                    "AND source = 'branch' AND list_contains(?::INTEGER[], turn)",
                    [run_id, traj_id, turns])
        for table, frame in frames.items():
            insert_frame(con, table, frame, run_id, step)
        insert_frame(con, "branches", branches, run_id, None)
        insert_frame(con, "turn_signals", signals, run_id, step)
