"""Reads of the behaviours table (storage/behaviours/): the trajectories behind a step's
Cov(A, b). The pages reach it through storage/queries.py, like every other read."""
from __future__ import annotations

import pandas as pd

from storage import db
from storage.migrations import check_version

NOT_TRAINED = ("eval", "sft", "expert", "branch")  # storage/behaviours/job.py, kept in step


def contributors(path, run_id: str, step: int, name: str, n: int = 5) -> pd.DataFrame:
    """The step's trajectories ranked by their share of Cov(A, b), largest first:
    contribution_i = (A_i - mean A)(b_i - mean b) over the step's training trajectories where b
    and an advantage are recorded (the advantage the loss applied: its trained tokens' mean, else
    the stored one, as the job takes it, storage/behaviours/job.py; payoff.contributions). Ties
    are listed by traj_id: the first of equal contributions is no bigger a contributor than the
    next (a group's equal-reward rollouts share one advantage). Empty where the store has no
    behaviours table yet."""
    with db.reading(path) as con:
        if check_version(con, where=str(path)) < 9:
            return pd.DataFrame(columns=["traj_id", "value", "advantage", "reward",
                                         "contribution"])
        return con.execute("""
            WITH j AS (
                SELECT b.traj_id, b.value, t.reward, coalesce((
                           SELECT avg(k.advantage) FROM tokens k WHERE k.run_id = t.run_id
                           AND k.traj_id = t.traj_id AND k.trained AND isfinite(k.advantage)),
                           t.advantage) AS advantage
                FROM behaviours b JOIN trajectories t
                  ON t.run_id = b.run_id AND t.traj_id = b.traj_id
                WHERE b.run_id = ? AND b.step = ? AND b.name = ?
                  AND coalesce(t.split, 'train') NOT IN (SELECT unnest(?::VARCHAR[]))),
            b AS (SELECT * FROM j WHERE advantage IS NOT NULL),
            m AS (SELECT avg(advantage) AS ma, avg(value) AS mv FROM b)
            -- the means joined in, not avg() OVER (): DuckDB 1.5.5's window operator failed
            -- now and then on this small input ("INTERNAL Error: Attempted to access index 0
            -- within vector of size 0", WindowLocalSourceState::Finalize), seen once in the suite
            SELECT traj_id, value, advantage, reward,
                   (advantage - m.ma) * (value - m.mv) AS contribution
            FROM b CROSS JOIN m ORDER BY contribution DESC, traj_id LIMIT ?""",
            [run_id, int(step), name, list(NOT_TRAINED), int(n)]).df()
