"""The metrics an import derives from its stored rows, per step, as the trainer records them
(``DERIVED_METRICS_SQL``), and ``rederive_metrics``, which replaces them inside the writer's
transaction. storage/ingest/import_batch.py writes the rows; this module reads them back, so a
metric is always the one the stored rows give.
"""
from __future__ import annotations

from storage.mismatch_queries import MISMATCH_TOKENS

_DERIVED_SQL = f"""
WITH t AS (SELECT * FROM trajectories WHERE run_id = $run AND split <> 'eval' /*steps*/),
g AS (SELECT step, stddev_samp(reward) AS sd FROM t GROUP BY step, group_id HAVING count(*) > 1),
s AS (SELECT step, avg(reward) AS "reward/mean", stddev_samp(reward) AS "reward/std",
             avg(success::DOUBLE) AS "success/rate", avg(num_turns) AS "env/turns_mean",
             avg(response_tokens) AS "response/length_mean" FROM t GROUP BY step),
gs AS (SELECT step, avg(sd) AS "reward/group_std_mean",
              avg((sd = 0)::DOUBLE) AS "reward/frac_zero_std" FROM g GROUP BY step),
wide AS (SELECT * FROM s LEFT JOIN gs USING (step))
SELECT $run AS run_id, step, name, value FROM (UNPIVOT wide ON COLUMNS(* EXCLUDE step)
                                               INTO NAME name VALUE value)
UNION ALL
SELECT $run, step, 'eval/success', avg(success::DOUBLE) FROM trajectories
WHERE run_id = $run AND split = 'eval' AND success IS NOT NULL /*steps*/ GROUP BY step
UNION ALL
SELECT $run, step, name, value FROM (UNPIVOT (
    SELECT step, avg(abs(d)) FILTER (ok) AS "mismatch/abs_mean",
           quantile_cont(abs(d), 0.95) FILTER (ok) AS "mismatch/abs_p95",
           avg((d < ln(0.9) OR d > ln(1.1))::DOUBLE) FILTER (ok) AS "mismatch/ratio_out_frac",
           avg(exp(d) - 1 - d) FILTER (ok) AS "mismatch/kl_k3",
           count(*) FILTER (NOT ok)::DOUBLE AS "mismatch/nonfinite_tokens",
           max(abs(pd)) FILTER (ok) AS "training/rollout_probs_diff_max",
           avg(abs(pd)) FILTER (ok) AS "training/rollout_probs_diff_mean",
           CASE WHEN count(*) FILTER (ok) = 1 THEN 0.0
                ELSE stddev_samp(abs(pd)) FILTER (ok) END AS "training/rollout_probs_diff_std",
           CASE WHEN isnan(corr(pt, ps) FILTER (ok)) THEN NULL
                ELSE corr(pt, ps) FILTER (ok) END AS "training/rollout_actor_probs_pearson_corr"
    FROM (SELECT step, train_logprob - logprob AS d,
                 exp(train_logprob) AS pt, exp(logprob) AS ps,
                 exp(train_logprob) - exp(logprob) AS pd,
                 isfinite(train_logprob) AND isfinite(logprob) AS ok
          FROM tokens WHERE run_id = $run AND {MISMATCH_TOKENS} /*steps*/)
    GROUP BY step) ON COLUMNS(* EXCLUDE step) INTO NAME name VALUE value)
"""
DERIVED_METRICS_SQL = _DERIVED_SQL.replace("/*steps*/", "")
"""Metrics an import derives from its rows, as the trainer records them: rewards, success,
turns and lengths per step, held-out success, and (core/learn/mismatch.py) the training-inference
mismatch of the steps whose tokens carry both the sampler's and the trainer's logprob, ours and
verl's probability-space names (training/rollout_probs_diff_*, the Pearson r, left out where it
is undefined). The mismatch is over the tokens the trainer measured it on, trained and rejected
by rollout correction (``MISMATCH_TOKENS``, the predicate of every store mismatch figure: over
the trained ones alone an import of a ``mis`` run left out its most mismatched tokens). As the
trainer does, it is taken over the tokens whose two logprobs are finite; the others
(a NaN or infinite logprob, kept in stores written before the import refused them) are counted
beside it, ``mismatch/nonfinite_tokens``, instead of making every metric of their step NaN (a
step whose tokens are all such has only the count)."""

# Metrics a later job wrote on the run (agentrl behaviours: storage/behaviours/job.py PREFIXES)
# are its own record, not derived here: a re-import or a followed file keeps them.
JOB_METRIC_PREFIXES = ("behaviour/", "alarm/behaviour/")


def rederive_metrics(con, run_id: str, steps: list[int] | None = None) -> None:
    """Replace the run's derived metrics (``DERIVED_METRICS_SQL``) inside the caller's
    transaction, keeping the metrics other jobs wrote (``JOB_METRIC_PREFIXES``). With ``steps``,
    those steps' only: each metric is one step's, so a trainer-side recorder that wrote one
    step rederives it alone, where the whole run's grew with every step (each step read every
    token row the run had stored)."""
    keep = " AND ".join("NOT starts_with(name, ?)" for _ in JOB_METRIC_PREFIXES)
    if steps is None:
        con.execute(f"DELETE FROM metrics WHERE run_id = ? AND {keep}",
                    [run_id, *JOB_METRIC_PREFIXES])
        con.execute("INSERT INTO metrics BY NAME " + DERIVED_METRICS_SQL, {"run": run_id})
        return
    steps = sorted({int(s) for s in steps})
    if not steps:
        return
    listed = ", ".join(map(str, steps))  # integers, written out: a constant list lets DuckDB
    con.execute(f"DELETE FROM metrics WHERE run_id = ? AND {keep} AND step IN ({listed})",
                [run_id, *JOB_METRIC_PREFIXES])  # skip the row groups of other steps
    con.execute("INSERT INTO metrics BY NAME "
                + _DERIVED_SQL.replace("/*steps*/", f"AND step IN ({listed})"), {"run": run_id})
