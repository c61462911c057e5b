"""Reads of the training-inference mismatch (core/learn/mismatch.py) from ``tokens``: each scored
token's d = train_logprob - logprob (the trainer's logprob against the sampler's, under the same
weights). Stores recorded before ``train_logprob`` existed (schema < 6) read as empty.

Which tokens (``MISMATCH_TOKENS``): the generated tokens the trainer scored, with both logprobs:
the trained ones and those rollout correction's rejection took out of the loss
(``tokens.rejected``, schema 10; ``--rollout-correction mis|rs``). The trainer's
``mismatch/*`` metrics are taken before the rejection, over the same tokens; read over the
trained tokens alone, the store's figures left out exactly the most mismatched ones (docs/
mismatch.md's example, trainer [-1, -1, -1] against sampler [-1.5, -1.2, -4], C = 2: abs_mean
1.233 in the trainer over the three, 0.350 over the two ``mis`` kept). Every mismatch
number the store gives -- Dynamics' distribution and ranking here, ``step_metrics`` (what an
import derives, storage/ingest/import_batch.py) -- reads this one predicate.

Only tokens whose two logprobs are finite enter the figures; the others (a NaN or infinite
logprob: a trainer's NaN, or a store written before imports refused them) are counted beside
them (``nonfinite``), as the per-step metrics do (core/learn/mismatch.py,
storage/ingest/import_batch.py), so one such token no longer makes a whole step's figures NaN.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from storage import db
from storage.migrations import check_version

BAND_LOG = (-0.10536051565782628, 0.09531017980432493)
"""log 0.9 and log 1.1: a ratio outside [0.9, 1.1] (core/learn/mismatch.py ``BAND``)."""

MISMATCH_TOKENS = ("(trained OR coalesce(rejected, false)) AND train_logprob IS NOT NULL "
                   "AND logprob IS NOT NULL")
"""The tokens every mismatch figure is over (module docstring), as a SQL predicate on
``tokens`` (schema >= 10)."""
_BEFORE_REJECTED = "trained AND train_logprob IS NOT NULL AND logprob IS NOT NULL"
"""The same on a store recorded before ``tokens.rejected`` (no rejection was kept apart)."""
REJECTED_SCHEMA = 10

_D = "(train_logprob - logprob)"
_OK = "(isfinite(train_logprob) AND isfinite(logprob))"


def tokens_predicate(version: int) -> str:
    """``MISMATCH_TOKENS`` for a store of schema ``version``."""
    return MISMATCH_TOKENS if version >= REJECTED_SCHEMA else _BEFORE_REJECTED


def _read(path: str | Path, sql: str, params: list, columns: list[str]) -> pd.DataFrame:
    """``sql`` with ``{tokens}`` replaced by the store's ``tokens_predicate``."""
    with db.reading(path) as con:
        version = check_version(con, where=str(path))
        if version < 6:
            return pd.DataFrame(columns=columns)
        return con.execute(sql.replace("{tokens}", tokens_predicate(version)), params).df()


STEP_METRICS_SQL = f"""
    SELECT step, avg(abs(d)) FILTER (ok) AS "mismatch/abs_mean",
           quantile_cont(abs(d), 0.95) FILTER (ok) AS "mismatch/abs_p95",
           avg((d < ln(0.9) OR d > ln(1.1))::DOUBLE) FILTER (ok) AS "mismatch/ratio_out_frac",
           avg(exp(d) - 1 - d) FILTER (ok) AS "mismatch/kl_k3",
           count(*) FILTER (NOT ok)::DOUBLE AS "mismatch/nonfinite_tokens"
    FROM (SELECT step, {_D} AS d, {_OK} AS ok FROM tokens
          WHERE run_id = ? AND {{tokens}})
    GROUP BY step ORDER BY step"""
"""Per step, the trainer's ``mismatch/*`` metrics (core/learn/mismatch.py ``mismatch_metrics``)
recomputed from the store's tokens."""


def step_metrics(path: str | Path, run_id: str) -> pd.DataFrame:
    """One row per step with scored tokens: step and the ``mismatch/*`` metrics
    (``STEP_METRICS_SQL``), read from the store -- equal to what the trainer recorded."""
    cols = ["step", "mismatch/abs_mean", "mismatch/abs_p95", "mismatch/ratio_out_frac",
            "mismatch/kl_k3", "mismatch/nonfinite_tokens"]
    return _read(path, STEP_METRICS_SQL, [run_id], cols)


def distribution(path: str | Path, run_id: str, step: int) -> pd.DataFrame:
    """One row: the step's scored tokens (``MISMATCH_TOKENS``) with both logprobs finite
    (``tokens``), and mean, sd, p95, max of |d| and the share whose ratio exp(d) lies outside
    [0.9, 1.1] (TRL issue 6789's table) over them, and ``nonfinite``, the tokens left out
    (module docstring); no row when the step has no token with both logprobs."""
    cols = ["tokens", "mean", "sd", "p95", "max", "out_of_band", "nonfinite"]
    df = _read(path, f"""
        SELECT count(*) FILTER ({_OK}) AS tokens,
               avg(abs({_D})) FILTER ({_OK}) AS mean,
               stddev_samp(abs({_D})) FILTER ({_OK}) AS sd,
               quantile_cont(abs({_D}), 0.95) FILTER ({_OK}) AS p95,
               max(abs({_D})) FILTER ({_OK}) AS max,
               avg(CASE WHEN {_D} < ? OR {_D} > ? THEN 1.0 ELSE 0.0 END) FILTER ({_OK})
                   AS out_of_band,
               count(*) FILTER (NOT {_OK}) AS nonfinite
        FROM tokens WHERE run_id = ? AND step = ? AND {{tokens}}""",
               [*BAND_LOG, run_id, int(step)], cols)
    if df.empty:
        return df
    return df[df["tokens"] + df["nonfinite"] > 0].reset_index(drop=True)


def ranking(path: str | Path, run_id: str, step: int, limit: int = 20) -> pd.DataFrame:
    """The step's trajectories, those with tokens left out (``nonfinite``, module docstring)
    first, then by their largest finite |d|: traj_id, the position and turn of that token (of
    the first token left out, where there is one), its d, the trajectory's mean |d| and its
    share of tokens outside the band."""
    cols = ["traj_id", "max_abs", "pos", "turn", "d", "mean_abs", "out_of_band", "tokens",
            "nonfinite"]
    return _read(path, f"""
        SELECT traj_id, max(abs({_D})) FILTER ({_OK}) AS max_abs,
               coalesce(min(pos) FILTER (NOT {_OK}), arg_max(pos, abs({_D})) FILTER ({_OK}))
                   AS pos,
               coalesce(arg_min(turn, pos) FILTER (NOT {_OK}),
                        arg_max(turn, abs({_D})) FILTER ({_OK})) AS turn,
               coalesce(arg_min({_D}, pos) FILTER (NOT {_OK}),
                        arg_max({_D}, abs({_D})) FILTER ({_OK})) AS d,
               avg(abs({_D})) FILTER ({_OK}) AS mean_abs,
               avg(CASE WHEN {_D} < ? OR {_D} > ? THEN 1.0 ELSE 0.0 END) FILTER ({_OK})
                   AS out_of_band,
               count(*) FILTER ({_OK}) AS tokens, count(*) FILTER (NOT {_OK}) AS nonfinite
        FROM tokens WHERE run_id = ? AND step = ? AND {{tokens}}
        GROUP BY traj_id ORDER BY nonfinite DESC, max_abs DESC NULLS LAST, traj_id LIMIT ?""",
                 [*BAND_LOG, run_id, int(step), int(limit)], cols)
