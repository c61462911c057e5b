"""A run whose rollout correction rejected tokens (``--rollout-correction mis``) keeps its
mismatch through an export: the JSONL export writes each token's ``rejected``, the import reads
it back, and the metrics the import derives are over the same tokens as the trainer's (trained
and rejected, storage/mismatch_queries.py ``MISMATCH_TOKENS``). Before, the importer dropped the
mark and derived the mismatch over the trained tokens alone: abs_mean 0.00098 in the trainer,
0.00046 after the round trip. A partitioned Parquet export, served as a store, reads the same.
One real tiny-model step."""
from __future__ import annotations

import json

import pytest

from storage import db, io, mismatch_queries, queries
from tests.test_mismatch_rejected import rejected_step  # noqa: F401  (fixture)

NAMES = ("mismatch/abs_mean", "mismatch/abs_p95", "mismatch/ratio_out_frac", "mismatch/kl_k3",
         "mismatch/nonfinite_tokens")


def _marks(store, run_id: str) -> list[tuple]:
    with db.reading(store) as con:
        return con.execute("SELECT traj_id, pos, role, trained, rejected, train_logprob, logprob "
                           "FROM tokens WHERE run_id = ? ORDER BY traj_id, pos",
                           [run_id]).fetchall()


def _trainer(store, run_id: str) -> dict[tuple[int, str], float]:
    m = queries.metrics(store, run_id)
    m = m[m["name"].str.startswith("mismatch/") | m["name"].str.startswith("training/rollout_")]
    return {(int(s), n): float(v) for s, n, v in zip(m["step"], m["name"], m["value"])}


def test_an_exported_and_imported_run_keeps_its_rejection_and_its_mismatch(rejected_step,
                                                                            tmp_path):
    store, run_id = rejected_step
    out, copy = tmp_path / "run.jsonl", tmp_path / "copy.duckdb"
    assert io.main(["export", "--db", str(store), "--run", run_id, "--out", str(out)]) == 0
    assert io.main(["import", str(out), "--db", str(copy), "--run-id", "copy"]) == 0

    before, after = _marks(store, run_id), _marks(copy, "copy")
    assert sum(1 for r in before if r[4]) > 0              # the band rejected some tokens
    assert after == before                                 # token by token, marks and logprobs

    trainer, imported = _trainer(store, run_id), _trainer(copy, "copy")
    assert {n for _, n in trainer} >= set(NAMES)
    assert set(imported) == set(trainer)
    for key, value in trainer.items():                     # what the import derived
        assert imported[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    recomputed = mismatch_queries.step_metrics(copy, "copy").set_index("step")
    for (step, name), value in trainer.items():            # what the store reads after it
        if name in NAMES:
            assert float(recomputed.loc[step, name]) == pytest.approx(value, rel=1e-9, abs=1e-12)


def test_a_partitioned_parquet_export_reads_the_same_mismatch(rejected_step, tmp_path):
    store, run_id = rejected_step
    out = tmp_path / "parts"
    assert io.main(["export", "--db", str(store), "--run", run_id, "--out", str(out),
                    "--format", "parquet", "--partitioned"]) == 0
    assert _marks(out, run_id) == _marks(store, run_id)
    trainer = _trainer(store, run_id)
    served = mismatch_queries.step_metrics(out, run_id).set_index("step")
    for (step, name), value in trainer.items():
        if name in NAMES:
            assert float(served.loc[step, name]) == pytest.approx(value, rel=1e-9, abs=1e-12)


def test_a_rejected_mark_that_is_not_true_or_false_fails_its_line_by_name(tmp_path, capsys):
    tokens = [{"text": "Q", "role": "prompt"},
              {"text": " a", "role": "action", "trained": False, "rejected": "yes",
               "logprob": -1.0, "train_logprob": -1.5}]
    good = {"traj_id": "ok", "task_id": "q", "reward": 1.0, "turns": [{"action": " a"}],
            "tokens": [dict(tokens[1], rejected=True)]}
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"traj_id": "bad", "task_id": "q", "reward": 1.0,
                               "turns": [{"action": " a"}], "tokens": tokens}) + "\n"
                   + json.dumps(good) + "\n", encoding="utf-8")
    io.main(["import", str(src), "--db", str(tmp_path / "s.duckdb"), "--run-id", "r"])
    assert "line 1: field 'tokens[1].rejected' must be true/false" in capsys.readouterr().err
    with db.reading(tmp_path / "s.duckdb") as con:
        assert con.execute("SELECT traj_id, trained, rejected FROM tokens").fetchall() == [
            ("ok", False, True)]


def test_the_token_view_shows_rejected_tokens_as_rejected_not_as_mask_errors(rejected_step):
    """Replay's token view and mask lint (pages/_tokens.py) read ``rejected`` from the store's
    token read: an action token rollout correction left out is not an 'action not trained'."""
    from pages import _tokens
    store, run_id = rejected_step
    with db.reading(store) as con:
        (tid,), = con.execute("SELECT traj_id FROM tokens WHERE run_id = ? AND rejected "
                              "GROUP BY traj_id ORDER BY count(*) DESC LIMIT 1",
                              [run_id]).fetchall()
    toks = queries.tokens(store, run_id, tid)
    rejected = toks[toks["rejected"].fillna(False).astype(bool)]
    assert len(rejected) > 0 and not rejected["trained"].any()
    lint = _tokens.mask_lint(toks, queries.turns(store, run_id, [tid]), updated=True)
    assert "action token not trained" not in set(lint["issue"])
    view = _tokens.token_html(toks, "loss mask", updated=True)
    assert view.count(_tokens._REJECTED_BG) == len(rejected)
    assert _tokens._WRONG_BG not in view
    assert view.count("rejected by rollout correction") == len(rejected)
