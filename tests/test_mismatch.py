"""Training-inference mismatch (core/learn/mismatch.py): the metrics and verl's corrections by hand, the
loss weighted by them, and a real tiny-model RL step that records the trainer's own logprob of
every trained token beside the sampler's, the per-step metrics from them, and the corrections."""
import math

import pytest
import torch

from core.config import ConfigError, TrainConfig, validate
from core.learn.losses import policy_loss
from core.learn.mismatch import distribution, mis_keep, mismatch_metrics, tis_weights
from storage import ingest, queries
from tests.credit_checks import one_rl_step

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- by hand --------------------------------------------------------------------------------------
def test_metrics_by_hand():
    train = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    sampler = torch.tensor([-1.0, -2.2, -0.45, -3.0])
    mask = torch.tensor([True, True, True, False])          # the last token is not trained
    m = mismatch_metrics(train, sampler, mask)
    d = [0.0, 0.2, -0.05]                                     # lp_train - lp_sampler
    assert m["mismatch/abs_mean"] == pytest.approx(0.25 / 3)
    # r = e^0.2 = 1.22 leaves [0.9, 1.1]; e^-0.05 = 0.951 and 1 stay in
    assert m["mismatch/ratio_out_frac"] == pytest.approx(1 / 3)
    assert m["mismatch/kl_k3"] == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 3)
    # p95 of |d| = (0, 0.05, 0.2) by linear interpolation: 0.05 + 0.9 * 0.15
    assert m["mismatch/abs_p95"] == pytest.approx(0.185)
    table = distribution(train, sampler, mask)
    assert table["tokens"] == 3 and table["max"] == pytest.approx(0.2)
    assert table["sd"] == pytest.approx(torch.tensor([0.0, 0.2, 0.05]).std().item())
    assert mismatch_metrics(train, sampler, torch.zeros(4, dtype=torch.bool)) == {}


def test_truncated_and_masked_importance_sampling_by_hand():
    train = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
    sampler = torch.tensor([[-1.0, -1.5, -3.0, -0.2]])        # r = 1, e^0.5, e^2, e^-0.8
    assert tis_weights(train, sampler, 2.0).tolist()[0] == pytest.approx(
        [1.0, math.exp(0.5), 2.0, math.exp(-0.8)])             # only the top is truncated
    mask = torch.tensor([[True, True, True, True]])
    # the band [1/2, 2] in log space is [-0.693, 0.693]: e^2 and e^-0.8 leave it
    assert mis_keep(train, sampler, mask, 2.0).tolist() == [[True, True, False, False]]
    # sequence level: sum of d = 0 + 0.5 + 2 - 0.8 = 1.7 > log 2: the whole row goes
    assert mis_keep(train, sampler, mask, 2.0, "sequence").tolist() == [[False] * 4]
    assert mis_keep(train, sampler, mask, 8.0, "sequence").tolist() == [[True] * 4]
    with pytest.raises(ValueError, match="cap"):
        tis_weights(train, sampler, 0.5)


# verl's rollout correction, the example: trainer [-1, -1, -1], sampler [-1.5, -1.2, -4],
# C = 2, A = 1, token-mean. d = (0.5, 0.2, 3), r = (e^0.5, e^0.2, e^3): the third leaves [1/2, 2].
VERL_TRAIN = torch.tensor([[-1.0, -1.0, -1.0]])
VERL_SAMPLER = torch.tensor([[-1.5, -1.2, -4.0]])


def _corrected_loss(kind, level="token"):
    """The update's loss on the example after ``correct_rollout`` (the trainer's path)."""
    from core.rollout.trajectory import Trajectory
    from core.learn.mismatch import correct_rollout
    from core.learn.update import Sample
    traj = Trajectory(traj_id="t", group_id="g", task=None, turns=[])
    traj.trained = [True] * 3
    s = Sample(traj=traj, ids=torch.tensor([[1, 2, 3]]), mask=torch.ones(1, 3, dtype=torch.bool),
               old_logprobs=VERL_SAMPLER.clone())
    s.train_logprobs = VERL_TRAIN.clone()
    cfg = TrainConfig(rollout_correction=kind, rollout_is_cap=2.0, rollout_correction_level=level)
    metrics = correct_rollout([s], cfg)
    loss, _ = policy_loss(VERL_TRAIN.clone().requires_grad_(), s.old_logprobs,
                          torch.ones(1, 3), s.mask, is_weights=s.is_weights)
    return float(loss.detach()), metrics, s


def test_mis_weights_kept_tokens_by_their_ratio_as_verl_does():
    loss, metrics, s = _corrected_loss("mis")
    # -(e^0.5 + e^0.2) / 2: the rejected token leaves the loss and its denominator
    assert loss == pytest.approx(-(math.exp(0.5) + math.exp(0.2)) / 2) and round(loss, 4) == -1.4351
    assert s.mask.tolist() == [[True, True, False]] and s.traj.trained == [True, True, False]
    assert metrics["rollout_corr/masked_frac"] == pytest.approx(1 / 3)
    assert metrics["rollout_corr/weight_max"] == pytest.approx(math.exp(0.5), rel=1e-6)
    # rejection alone keeps the same tokens with weight 1: the old "mis"
    loss, metrics, s = _corrected_loss("rs")
    assert loss == pytest.approx(-1.0) and s.is_weights is None
    assert metrics == {"rollout_corr/masked_frac": pytest.approx(1 / 3)}
    # token TIS: every token, the third truncated at C
    loss, metrics, _ = _corrected_loss("tis")
    assert loss == pytest.approx(-(math.exp(0.5) + math.exp(0.2) + 2.0) / 3)
    assert metrics["rollout_corr/truncated_frac"] == pytest.approx(1 / 3)


def test_sequence_level_tis_weights_the_row_by_its_summed_ratio():
    # sum d = 3.7: min(e^3.7, 2) = 2 on every token (verl's sequence TIS), not token weights
    loss, metrics, s = _corrected_loss("tis", "sequence")
    assert s.is_weights.tolist() == [[2.0, 2.0, 2.0]] and loss == pytest.approx(-2.0)
    assert metrics["rollout_corr/truncated_frac"] == 1.0
    # a row inside the cap takes exp(sum d) on every token: d = (0.1, -0.3) -> e^-0.2
    w = tis_weights(torch.tensor([[-1.0, -1.0, 0.0]]), torch.tensor([[-1.1, -0.7, -5.0]]), 2.0,
                    torch.tensor([[True, True, False]]), "sequence")
    assert w[0].tolist() == pytest.approx([math.exp(-0.2)] * 3)
    # sequence MIS: e^3.7 leaves the band, the whole row goes
    _, metrics, s = _corrected_loss("mis", "sequence")
    assert s.mask.tolist() == [[False] * 3] and metrics["rollout_corr/masked_frac"] == 1.0


def test_verls_probability_space_metrics_by_hand():
    train = torch.tensor([-0.1, -1.0, -2.0, -0.5])
    sampler = torch.tensor([-0.2, -1.0, -1.5, -9.0])
    mask = torch.tensor([True, True, True, False])
    m = mismatch_metrics(train, sampler, mask)
    p_t = [math.exp(x) for x in (-0.1, -1.0, -2.0)]
    p_s = [math.exp(x) for x in (-0.2, -1.0, -1.5)]
    diff = [abs(a - b) for a, b in zip(p_t, p_s)]
    mean = sum(diff) / 3
    assert m["training/rollout_probs_diff_max"] == pytest.approx(max(diff))
    assert m["training/rollout_probs_diff_mean"] == pytest.approx(mean)
    assert m["training/rollout_probs_diff_std"] == pytest.approx(
        math.sqrt(sum((x - mean) ** 2 for x in diff) / 2))               # unbiased, as torch.std
    import numpy as np
    assert m["training/rollout_actor_probs_pearson_corr"] == pytest.approx(
        float(np.corrcoef(p_t, p_s)[0, 1]))
    # one token: no correlation to report, the rest still there
    one = mismatch_metrics(train[:1], sampler[:1], mask[:1])
    assert "training/rollout_actor_probs_pearson_corr" not in one
    assert one["training/rollout_probs_diff_std"] == 0.0


def test_non_finite_logprobs_are_counted_not_averaged():
    train = torch.tensor([-1.0, float("nan"), -2.0, float("-inf"), -0.5])
    sampler = torch.tensor([-1.0, -1.0, -2.2, -1.0, float("inf")])
    mask = torch.ones(5, dtype=torch.bool)
    m = mismatch_metrics(train, sampler, mask)
    assert m["mismatch/nonfinite_tokens"] == 3.0
    assert m["mismatch/abs_mean"] == pytest.approx(0.1)
    assert all(math.isfinite(v) for v in m.values())
    assert distribution(train, sampler, mask)["tokens"] == 2
    only_bad = mismatch_metrics(train[1:2], sampler[1:2], mask[1:2])
    assert only_bad == {"mismatch/nonfinite_tokens": 1.0}


def test_the_weights_multiply_each_tokens_policy_gradient_loss():
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old, adv = lp.detach().clone(), torch.tensor([[1.0, 1.0]])
    mask = torch.tensor([[True, True]])
    plain, _ = policy_loss(lp, old, adv, mask)
    weighted, _ = policy_loss(lp, old, adv, mask, is_weights=torch.tensor([[0.5, 2.0]]))
    # ratio 1 at the start: pg = -A per token; token mean of (-0.5, -2.0) against (-1, -1)
    assert plain.item() == pytest.approx(-1.0) and weighted.item() == pytest.approx(-1.25)


def test_correction_settings_are_validated():
    for field, value in (("rollout_correction", "pis"), ("rollout_is_cap", 0.9),
                         ("rollout_correction_level", "turn")):
        with pytest.raises(ConfigError, match=field):
            validate(TrainConfig(**{field: value}))


# -- a real step ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    """(store, run id) of one real tiny-model RL step per correction: none, tis, rs (token level
    with a cap so close to 1 that fp32 rounding between the passes decides); and one sampled
    under bf16 autocast (the update in fp32)."""
    base = tmp_path_factory.mktemp("mismatch")
    return {"none": one_rl_step(base, "none"),
            "tis": one_rl_step(base, "tis", rollout_correction="tis"),
            "rs": one_rl_step(base, "rs", rollout_correction="rs", rollout_is_cap=1.000001),
            "bf16": one_rl_step(base, "bf16", rollout_dtype="bf16")}


def _tokens(db, run_id):
    trajs = queries.trajectories(db, run_id)
    return {t: queries.tokens(db, run_id, t) for t in trajs["traj_id"]}


def test_a_step_records_the_trainers_logprob_and_the_metrics(steps):
    db, run_id = steps["none"]
    toks = _tokens(db, run_id)
    trained = [tok[tok["trained"]] for tok in toks.values()]
    assert sum(len(t) for t in trained) > 0
    for tok in toks.values():
        assert tok[tok["trained"]]["train_logprob"].notna().all()       # every trained token
        assert tok[~tok["trained"]]["train_logprob"].isna().all()
    train = torch.tensor([x for t in trained for x in t["train_logprob"]])
    sampler = torch.tensor([x for t in trained for x in t["logprob"]])
    want = mismatch_metrics(train, sampler, torch.ones(len(train), dtype=torch.bool))
    metrics = queries.metrics(db, run_id)
    got = {n: float(metrics[metrics["name"] == n]["value"].iloc[-1]) for n in want}
    assert got == pytest.approx(want, abs=1e-6)
    # the same weights, fp32 on both sides: the KV-cached sampling pass and the full-sequence
    # training pass differ by rounding only
    assert got["mismatch/abs_mean"] < 1e-3 and got["mismatch/ratio_out_frac"] == 0.0


def test_tis_and_rejection_steps_record_their_correction(steps):
    db, run_id = steps["tis"]
    m = queries.metrics(db, run_id)
    names = set(m["name"])
    assert {"rollout_corr/weight_mean", "rollout_corr/truncated_frac", "mismatch/abs_mean"} <= names
    assert float(m[m["name"] == "rollout_corr/weight_mean"]["value"].iloc[-1]) == pytest.approx(
        1.0, abs=1e-2)
    db, run_id = steps["rs"]
    m = queries.metrics(db, run_id)
    masked = float(m[m["name"] == "rollout_corr/masked_frac"]["value"].iloc[-1])
    # the recorded loss mask is the one the optimiser applied: masked tokens are not "trained"
    toks = _tokens(db, run_id)
    actions = sum(int((t["role"] == "action").sum()) for t in toks.values())
    kept = sum(int(t["trained"].sum()) for t in toks.values())
    assert kept == pytest.approx(actions * (1 - masked))
    out = [t["train_logprob"][t["role"] == "action"] - t["logprob"][t["role"] == "action"]
           for t in toks.values()]
    band = math.log(1.000001)
    assert actions - kept == sum(int((d.abs() > band).sum()) for d in out)


def test_rejection_narrows_the_loss_mask_and_the_trajectorys_trained_flags():
    from core.rollout.trajectory import Trajectory
    from core.learn.mismatch import correct_rollout
    from core.learn.update import Sample
    traj = Trajectory(traj_id="t", group_id="g", task=None, turns=[])
    traj.trained = [False, True, True, True]
    s = Sample(traj=traj, ids=torch.tensor([[1, 2, 3, 4]]),
               mask=torch.tensor([[False, True, True, True]]),
               old_logprobs=torch.tensor([[0.0, -1.0, -3.0, -1.0]]))   # the sampler's
    s.train_logprobs = torch.tensor([[0.0, -1.0, -1.0, -1.1]])         # d = 0, 2, -0.1
    cfg = TrainConfig(rollout_correction="rs", rollout_is_cap=2.0)
    metrics = correct_rollout([s], cfg)
    assert s.mask.tolist() == [[False, True, False, True]] and traj.trained == s.mask[0].tolist()
    assert metrics == {"rollout_corr/masked_frac": pytest.approx(1 / 3)}
    assert torch.equal(s.old_logprobs, s.train_logprobs)   # the ratio is against the trainer's


# -- the drift alarm --------------------------------------------------------------------------------
def test_the_drift_alarm_fires_on_a_drift_and_not_on_a_healthy_run():
    import numpy as np
    import pandas as pd
    from pages._signals import mismatch_alarms
    steps = range(1, 31)
    # slime/vime issue 64's stack: 0.011 -> 0.036 over 30 steps
    drift = pd.DataFrame({"mismatch/abs_mean": np.linspace(0.011, 0.036, 30)}, index=steps)
    (alarm,) = mismatch_alarms(drift)
    assert alarm["kind"] == "mismatch" and 15 <= alarm["step"] <= 30
    # a healthy fp32 run: rounding-level noise that doubles and halves, and a flat bf16 run
    rng = np.random.default_rng(0)
    assert mismatch_alarms(pd.DataFrame({"mismatch/abs_mean": rng.uniform(2e-7, 1e-6, 30)},
                                        index=steps)) == []
    flat = 0.011 + rng.normal(0, 0.001, 30)
    flat[12] = 0.05   # one odd step: the rolling median does not follow it
    assert mismatch_alarms(pd.DataFrame({"mismatch/abs_mean": flat}, index=steps)) == []
    assert mismatch_alarms(drift.head(9)) == []   # too few steps to judge


# -- the pages --------------------------------------------------------------------------------------
def test_dynamics_and_replay_show_the_mismatch(steps, monkeypatch, tmp_path):
    from streamlit.testing.v1 import AppTest
    from streamlit.testing.v1 import app_test
    import streamlit as st
    from pages import _jobs
    from tests.test_pages import APP, ROOT, _NavigationPagesManager
    db, run_id = steps["none"]
    monkeypatch.setattr(app_test, "PagesManager", _NavigationPagesManager)
    monkeypatch.setenv(queries.STORE_DIRS_ENV, str(db.parent))
    monkeypatch.setenv(_jobs.RUNS_DIR_ENV, str(tmp_path / "runs"))
    monkeypatch.chdir(ROOT)
    st.cache_data.clear()

    def open_page(page, **params):
        at = AppTest.from_file(APP, default_timeout=60).run()
        at.query_params.update({k: str(v) for k, v in params.items()})
        return at.switch_page(f"pages/{page}.py").run()

    m = queries.metrics(db, run_id)
    step = int(m[m["name"] == "mismatch/abs_mean"]["step"].iloc[0])
    at = open_page("dynamics", store=str(db), run=run_id, mismatch_step=step)
    assert not at.exception, at.exception
    assert any("Training-inference mismatch" in h.value for h in at.subheader)
    # verl's probability-space names, recorded and charted beside ours (behind "All curves"
    # on this fp32 run, whose ratio never leaves the band)
    assert any("verl's names: |p_train - p_sampler|" in cap.value for cap in at.caption)
    assert any("verl's Pearson r" in cap.value for cap in at.caption)
    table = next(f.value for f in at.dataframe if "out_of_band" in f.value.columns
                 and "p95" in f.value.columns)
    assert int(table["tokens"].iloc[0]) == sum(
        int(t["trained"].sum()) for t in _tokens(db, run_id).values())
    ranked = next(f.value for f in at.dataframe if "max_abs" in f.value.columns)
    assert ranked["replay"].str.contains("colour=mismatch").all()
    traj = ranked["traj_id"].iloc[0]
    at = open_page("replay", store=str(db), run=run_id, step=step, traj=traj, colour="mismatch")
    assert not at.exception, at.exception
    assert at.selectbox(key="replay_colour").value == "mismatch"
    view = next(h.value for h in at.get("html") if "token-view" in h.value)
    assert "mismatch d " in view and "train_logprob " in view


# -- imported runs ----------------------------------------------------------------------------------
def test_an_exported_run_reimports_with_both_logprobs_and_the_same_metrics(steps, tmp_path):
    from storage.export import export_jsonl
    from storage.ingest import import_file
    db, run_id = steps["none"]
    out = tmp_path / "run.jsonl"
    export_jsonl(db, run_id, out)
    assert '"train_logprob"' in out.read_text()
    store = tmp_path / "imported.duckdb"
    rep = import_file(out, store, "jsonl")
    assert rep.imported == len(queries.trajectories(db, run_id))
    mine = queries.metrics(db, run_id)
    theirs = queries.metrics(store, rep.run_id)
    for name in ("mismatch/abs_mean", "mismatch/abs_p95", "mismatch/ratio_out_frac",
                 "mismatch/kl_k3"):
        a = mine[mine["name"] == name].set_index("step")["value"]
        b = theirs[theirs["name"] == name].set_index("step")["value"]
        assert len(a) == len(b) == 1 and b.to_dict() == pytest.approx(a.to_dict(), abs=1e-9)
    step = int(theirs[theirs["name"] == "mismatch/abs_mean"]["step"].iloc[0])
    assert queries.mismatch_ranking(store, rep.run_id, step)["traj_id"].tolist()


def test_bf16_sampling_against_an_fp32_update_is_a_measurable_mismatch(steps):
    got = {}
    for kind in ("none", "bf16"):
        db, run_id = steps[kind]
        m = queries.metrics(db, run_id)
        got[kind] = float(m[m["name"] == "mismatch/abs_mean"]["value"].iloc[-1])
        assert queries.runs(db).set_index("run_id").loc[run_id, "config"] is not None
    # fp32 on both sides differs by rounding (~5e-7); bf16 sampling by ~1e-3 on the tiny model
    assert got["bf16"] > 100 * got["none"] and got["bf16"] > 1e-4
    with pytest.raises(ConfigError, match="rollout_dtype"):
        validate(TrainConfig(rollout_dtype="fp16"))
