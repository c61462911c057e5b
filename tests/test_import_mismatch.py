"""Issue 47, point 3: one non-finite logprob no longer blanks a step's mismatch.

At the door, a token's log-probabilities must be finite and <= 0 (NaN, +-inf as numbers or the
strings export writes, and values above 0 fail the line by name). Behind it, a store that already
holds such a token (written before the door was shut, or a trainer's NaN) gets its mismatch over
the finite tokens with the others counted beside them (``mismatch/nonfinite_tokens``): the
metrics an import derives, the Dynamics panel's table and ranking, the page itself, and the drift
alarm, which fires again.
"""
from __future__ import annotations

import json
import math

import pytest

from pages import _signals
from storage import db, ingest, io, queries
from tests.test_pages import app, demo, texts  # noqa: F401  (fixtures)

# (sampler's logprob, trainer's logprob) of four trained tokens: d = 0, -0.2, 0.1, 0.5
PAIRS = [(-1.0, -1.0), (-1.0, -1.2), (-2.0, -1.9), (-1.5, -1.0)]


def _line(traj_id: str, step: int = 0, pairs=PAIRS) -> dict:
    tokens = [{"text": "Q", "role": "prompt"}]
    tokens += [{"text": f" a{i}", "role": "action", "trained": True, "logprob": lp,
                "train_logprob": tlp, "turn": 0} for i, (lp, tlp) in enumerate(pairs)]
    return {"traj_id": traj_id, "task_id": "q", "step": step, "reward": 1.0,
            "turns": [{"action": "".join(t["text"] for t in tokens[1:])}], "tokens": tokens}


def _write(path, lines) -> None:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines),
                    encoding="utf-8")


def _q(store, sql, params=()):
    with db.reading(store) as con:
        return con.execute(sql, list(params)).fetchall()


def _metrics(store, run_id, step=0) -> dict[str, float]:
    return dict(_q(store, "SELECT name, value FROM metrics WHERE run_id = ? AND step = ? AND "
                          "name LIKE 'mismatch/%'", [run_id, step]))


# -- the door ------------------------------------------------------------------------------------
def test_impossible_logprobs_fail_their_line_by_name_and_the_rest_import(tmp_path, capsys):
    def bad(traj_id, field, value):
        line = _line(traj_id)
        line["tokens"][2][field] = value
        return json.dumps(line)

    source = tmp_path / "lp.jsonl"
    _write(source, [_line("ok"),
                    bad("nan", "train_logprob", "NaN"),              # as export writes them
                    bad("inf", "logprob", "Infinity"),
                    bad("ninf", "train_logprob", "-Infinity"),
                    bad("pos", "logprob", 0.5),
                    bad("lit", "train_logprob", 1).replace(": 1,", ": NaN,", 1),  # not JSON
                    bad("ref", "ref_logprob", "NaN"),
                    bad("slack", "logprob", 5e-5),                   # a float32 hair above 0
                    bad("word", "logprob", "-inf")])
    store = tmp_path / "s.duckdb"
    assert io.main(["import", str(source), "--db", str(store), "--run-id", "lp"]) == 1
    err = capsys.readouterr().err
    for lineno, field, shown in ((2, "train_logprob", "NaN"), (3, "logprob", "Infinity"),
                                 (4, "train_logprob", "-Infinity"), (5, "logprob", "0.5"),
                                 (7, "ref_logprob", "NaN")):
        assert (f"error: line {lineno}: field 'tokens[2].{field}' must be a log-probability "
                f"(finite and <= 0), got {shown}") in err, (lineno, err)
    assert "error: line 6: NaN is not a JSON number" in err
    assert "error: line 9: field 'tokens[2].logprob' must be a number, got str" in err
    assert sorted(r[0] for r in _q(store, "SELECT traj_id FROM trajectories")) == ["ok", "slack"]
    assert _q(store, "SELECT logprob FROM tokens WHERE traj_id = 'slack' AND pos = 2") == [(0.0,)]
    assert _q(store, "SELECT lines, imported, failed FROM imports") == [(9, 2, 7)]


# -- behind the door: a store that holds them already ---------------------------------------------
@pytest.fixture
def spoiled(tmp_path):
    """(store, run id): an import of two trajectories at step 0 and one at step 1, then, as a
    store written before the door was shut holds them, trained tokens with a NaN and a -inf
    trainer's logprob at step 0 and every token of step 1 NaN; metrics derived again by
    importing the same file once more (every line skipped)."""
    source, store = tmp_path / "run.jsonl", tmp_path / "stores" / "s.duckdb"
    store.parent.mkdir()
    _write(source, [_line("a"), _line("b"), _line("c", step=1)])
    args = ["import", str(source), "--db", str(store), "--run-id", "spoiled"]
    assert io.main(args) == 0
    before = _metrics(store, "spoiled")
    assert before["mismatch/nonfinite_tokens"] == 0.0
    with db.writing(store) as con:
        con.execute("UPDATE tokens SET train_logprob = 'NaN' WHERE traj_id = 'b' AND pos = 3")
        con.execute("UPDATE tokens SET train_logprob = '-inf' WHERE traj_id = 'b' AND pos = 4")
        con.execute("UPDATE tokens SET train_logprob = 'NaN' WHERE traj_id = 'c' AND trained")
        con.execute("DELETE FROM metrics")
    assert io.main(args) == 0
    return store, "spoiled"


def test_the_derived_metrics_are_over_the_finite_tokens_with_the_others_counted(spoiled):
    store, run_id = spoiled
    finite = [0.0, -0.2, 0.1, 0.5] + [0.0, -0.2]  # a's four, b's first two
    m = _metrics(store, run_id)
    assert m["mismatch/nonfinite_tokens"] == 2.0
    assert m["mismatch/abs_mean"] == pytest.approx(sum(map(abs, finite)) / 6)
    ordered = sorted(map(abs, finite))
    at = 0.95 * (len(ordered) - 1)
    assert m["mismatch/abs_p95"] == pytest.approx(
        ordered[int(at)] + (at - int(at)) * (ordered[int(at) + 1] - ordered[int(at)]))
    assert m["mismatch/ratio_out_frac"] == pytest.approx(4 / 6)  # -0.2, 0.1, 0.5, -0.2
    assert m["mismatch/kl_k3"] == pytest.approx(sum(math.exp(d) - 1 - d for d in finite) / 6)
    assert all(math.isfinite(v) for v in m.values())
    # step 1: every token left out, so only the count: nothing NaN, nothing "not recorded"
    assert _metrics(store, run_id, step=1) == {"mismatch/nonfinite_tokens": 4.0}


def test_the_panels_table_and_ranking_leave_them_out_and_count_them(spoiled):
    store, run_id = spoiled
    table = queries.mismatch_distribution(store, run_id, 0)
    row = table.iloc[0]
    assert (int(row["tokens"]), int(row["nonfinite"])) == (6, 2)
    assert row["mean"] == pytest.approx(1.0 / 6) and row["max"] == pytest.approx(0.5)
    ranked = queries.mismatch_ranking(store, run_id, 0)
    assert list(ranked["traj_id"]) == ["b", "a"]  # the one holding them first
    b = ranked.iloc[0]
    assert (int(b["nonfinite"]), int(b["tokens"]), int(b["pos"])) == (2, 2, 3)
    assert math.isnan(b["d"])  # the first one left out: its d as it is
    assert ranked.iloc[1]["max_abs"] == pytest.approx(0.5)
    only = queries.mismatch_distribution(store, run_id, 1).iloc[0]
    assert (int(only["tokens"]), int(only["nonfinite"])) == (0, 4)


def test_dynamics_shows_the_count_instead_of_not_recorded(app, spoiled):
    store, run_id = spoiled
    at = app("dynamics", store_dir=str(store.parent), store=str(store), run=run_id,
             mismatch_step=1)
    assert not at.exception
    captions = " ".join(texts(at, "caption"))
    assert ("6 trained tokens had a logprob (the sampler's or the trainer's) that is not "
            "finite, at 2 step(s) (0, 1)") in captions
    assert "mismatch/abs_mean, mismatch/abs_p95)" not in captions  # never "not recorded"
    assert any("Step 1: 4 trained token(s) with a logprob that is not finite" in w
               for w in texts(at, "warning"))
    titles = [json.loads(e.proto.spec)["layout"].get("title", {}).get("text")
              for e in at.get("plotly_chart")]
    assert "Trained tokens left out of the mismatch (a logprob not finite)" in titles


def test_the_drift_alarm_fires_with_a_non_finite_token_at_every_step(tmp_path):
    """A drift (|d| 0.01 -> 0.05) with one NaN trainer's logprob at every step: before, every
    step's mismatch was NaN and the alarm could never fire."""
    source, store = tmp_path / "drift.jsonl", tmp_path / "s.duckdb"
    lines = []
    for step in range(12):
        d = 0.01 if step < 5 else 0.05
        line = _line(f"t{step}", step, pairs=[(-1.0, -1.0 - d)] * 3 + [(-1.0, -1.0)])
        lines.append(line)
    _write(source, lines)
    assert io.main(["import", str(source), "--db", str(store), "--run-id", "drift"]) == 0
    with db.writing(store) as con:
        con.execute("UPDATE tokens SET train_logprob = 'NaN' WHERE pos = 4")
    report = ingest.import_file(source, store, run_id="drift")  # skipped; metrics again
    assert report.skipped == 12
    wide = queries.metrics(store, "drift").pivot_table(index="step", columns="name",
                                                       values="value")
    assert (wide["mismatch/nonfinite_tokens"] == 1.0).all()
    assert wide["mismatch/abs_mean"].notna().all()
    alarms = _signals.mismatch_alarms(wide)
    # steps 3-7: the 5-step median is 0.05, past 2x the first steps' 0.01 (and 0.01 + 0.005)
    assert [a["step"] for a in alarms] == [7]


def test_the_derived_metrics_equal_the_trainers_own_function_verls_names_included(spoiled):
    """The import's SQL and core/learn/mismatch.py ``mismatch_metrics`` give the same numbers
    for the same tokens: ours and verl's probability-space ones, non-finite tokens counted."""
    import torch
    from core.learn.mismatch import mismatch_metrics
    store, run_id = spoiled
    rows = _q(store, "SELECT train_logprob, logprob FROM tokens WHERE run_id = ? AND step = 0 "
                     "AND trained AND train_logprob IS NOT NULL AND logprob IS NOT NULL", [run_id])
    train = torch.tensor([r[0] for r in rows], dtype=torch.float64)
    sampler = torch.tensor([r[1] for r in rows], dtype=torch.float64)
    want = mismatch_metrics(train, sampler, torch.ones(len(rows), dtype=torch.bool))
    assert "training/rollout_actor_probs_pearson_corr" in want and want[
        "mismatch/nonfinite_tokens"] == 2.0
    got = dict(_q(store, "SELECT name, value FROM metrics WHERE run_id = ? AND step = 0 AND "
                         "(name LIKE 'mismatch/%' OR name LIKE 'training/%')", [run_id]))
    assert got == pytest.approx(want)
