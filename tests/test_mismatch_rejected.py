"""After rollout correction's rejection (``--rollout-correction mis|rs``) the store keeps the
rejected tokens apart (``tokens.rejected``) and every mismatch number -- the trainer's metrics,
the store's per-step figures, Dynamics' distribution -- is over the same tokens: the generated
tokens the trainer scored, rejected included (issue 58, item 5). One real tiny-model step."""
from __future__ import annotations

import duckdb
import pytest

from storage import mismatch_queries, queries
from tests.credit_checks import one_rl_step


@pytest.fixture(scope="module")
def rejected_step(tmp_path_factory):
    """bf16 sampling against the fp32 update (|d| ~1e-3 on the tiny model) with a band of
    +-0.001 nats: MIS rejects a good share of the tokens, the most mismatched ones."""
    return one_rl_step(tmp_path_factory.mktemp("rejected"), "mis", rollout_correction="mis",
                       rollout_dtype="bf16", rollout_is_cap=1.001)


def test_the_trainers_mismatch_equals_the_one_recomputed_from_the_store(rejected_step):
    db, run_id = rejected_step
    con = duckdb.connect(str(db), read_only=True)
    counts = con.execute("""
        SELECT count(*) FILTER (rejected), count(*) FILTER (trained),
               count(*) FILTER (rejected AND trained),
               count(*) FILTER (rejected AND train_logprob IS NULL),
               count(*) FILTER (role = 'action' AND rejected IS NULL)
        FROM tokens WHERE run_id = ? AND split_part(traj_id, '-', 1) <> 'eval'""",
                         [run_id]).fetchone()
    only_trained = con.execute("""
        SELECT step, avg(abs(train_logprob - logprob)) FROM tokens
        WHERE run_id = ? AND trained AND train_logprob IS NOT NULL GROUP BY step""",
                               [run_id]).fetchall()
    con.close()
    rejected, trained, both, unscored, unmarked = counts
    assert rejected > 0 and trained > 0          # the band rejected some and kept some
    assert both == 0 and unscored == 0           # apart from the loss mask, with their logprob
    assert unmarked == 0                         # every generated token says kept or rejected
    m = queries.metrics(db, run_id)
    masked = float(m[m["name"] == "rollout_corr/masked_frac"]["value"].iloc[-1])
    assert masked == pytest.approx(rejected / (rejected + trained))   # trained = the loss mask
    trainer = m[m["name"].str.startswith("mismatch/")].pivot(index="step", columns="name",
                                                              values="value")
    store = mismatch_queries.step_metrics(db, run_id).set_index("step")
    assert list(store.index) == list(trainer.index) and len(store) == 1
    for name in ("mismatch/abs_mean", "mismatch/abs_p95", "mismatch/ratio_out_frac",
                 "mismatch/kl_k3", "mismatch/nonfinite_tokens"):
        assert store[name].tolist() == pytest.approx(trainer[name].tolist(), rel=1e-9, abs=1e-12)
    step = int(store.index[0])
    dist = mismatch_queries.distribution(db, run_id, step)
    assert int(dist["tokens"].iloc[0]) == rejected + trained
    assert float(dist["mean"].iloc[0]) == pytest.approx(trainer["mismatch/abs_mean"].iloc[0])
    ranked = mismatch_queries.ranking(db, run_id, step)
    assert int(ranked["tokens"].sum()) == rejected + trained
    # read over the trained tokens alone, the store would leave out the most mismatched ones
    (_, kept_mean), = only_trained
    assert kept_mean < 0.9 * trainer["mismatch/abs_mean"].iloc[0]
