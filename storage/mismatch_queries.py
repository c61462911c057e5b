"""Reads of the training-inference mismatch (core/learn/mismatch.py) from ``tokens``: each trained
token's d = train_logprob - logprob (the trainer's logprob against the sampler's, under the same
weights). Stores recorded before ``train_logprob`` existed (schema < 6) read as empty.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from storage import db
from storage.migrations import check_version

BAND_LOG = (-0.10536051565782628, 0.09531017980432493)
"""log 0.9 and log 1.1: a ratio outside [0.9, 1.1] (core/learn/mismatch.py ``BAND``)."""

_D = "(train_logprob - logprob)"
_WHERE = ("run_id = ? AND step = ? AND trained AND train_logprob IS NOT NULL "
          "AND logprob IS NOT NULL")


def _read(path: str | Path, sql: str, params: list, columns: list[str]) -> pd.DataFrame:
    with db.reading(path) as con:
        if check_version(con, where=str(path)) < 6:
            return pd.DataFrame(columns=columns)
        return con.execute(sql, params).df()


def distribution(path: str | Path, run_id: str, step: int) -> pd.DataFrame:
    """One row: the step's trained tokens with both logprobs (``tokens``), and mean, sd, p95, max
    of |d| and the share whose ratio exp(d) lies outside [0.9, 1.1] (TRL issue 6789's table);
    no row when the step has none."""
    cols = ["tokens", "mean", "sd", "p95", "max", "out_of_band"]
    df = _read(path, f"""
        SELECT count(*) AS tokens, avg(abs({_D})) AS mean, stddev_samp(abs({_D})) AS sd,
               quantile_cont(abs({_D}), 0.95) AS p95, max(abs({_D})) AS max,
               avg(CASE WHEN {_D} < ? OR {_D} > ? THEN 1.0 ELSE 0.0 END) AS out_of_band
        FROM tokens WHERE {_WHERE}""", [*BAND_LOG, run_id, int(step)], cols)
    return df[df["tokens"] > 0].reset_index(drop=True) if not df.empty else df


def ranking(path: str | Path, run_id: str, step: int, limit: int = 20) -> pd.DataFrame:
    """The step's trajectories by their largest |d|: traj_id, the position and turn of that
    token, its d, the trajectory's mean |d| and its share of tokens outside the band."""
    cols = ["traj_id", "max_abs", "pos", "turn", "d", "mean_abs", "out_of_band", "tokens"]
    return _read(path, f"""
        SELECT traj_id, max(abs({_D})) AS max_abs, arg_max(pos, abs({_D})) AS pos,
               arg_max(turn, abs({_D})) AS turn, arg_max({_D}, abs({_D})) AS d,
               avg(abs({_D})) AS mean_abs,
               avg(CASE WHEN {_D} < ? OR {_D} > ? THEN 1.0 ELSE 0.0 END) AS out_of_band,
               count(*) AS tokens
        FROM tokens WHERE {_WHERE}
        GROUP BY traj_id ORDER BY max_abs DESC, traj_id LIMIT ?""",
                 [*BAND_LOG, run_id, int(step), int(limit)], cols)
