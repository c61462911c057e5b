"""Dynamics read as one picture, through Streamlit's AppTest: every step-axis chart spans the
run's steps (so charts line up), legends sit outside the plot, the KL chart says what it was
measured against, and the sidebar's step is marked on every chart; the step picker shows only on
the pages that use it. tests/test_browser_dynamics.py checks the same in a real browser.
"""
from __future__ import annotations

import ast
import base64
import json

import numpy as np
import pytest

from pages import _signals
from storage.recorder import Recorder
from tests.test_page_speed import values
from tests.test_pages import ROOT, app, demo, texts  # noqa: F401  (fixtures)

# SFT steps 1-20, then one RL step (21): most curves hold only step 21.
SAMPLE_STORE, SAMPLE_RUN = "sample_runs/search_smollm2.duckdb", "20261129-215645-4187b5"


def step_charts(at) -> list[dict]:
    """The plotly specs of the page's charts whose x axis is the step."""
    specs = [json.loads(e.proto.spec) for e in at.get("plotly_chart")]
    return [s for s in specs if s["layout"].get("xaxis", {}).get("title", {}).get("text") == "step"]


def kl_caption(at) -> str:
    return next(t for t in texts(at, "caption") if "policy/kl" in t)


def _kl_run(path, config: dict) -> str:
    """A run with KL metrics over steps 3-5 and the given extra config."""
    rec = Recorder(path)
    run_id = rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo", **config}, name="kl")
    for step in (3, 4, 5):
        rec.record_step(step, metrics={"policy/kl": 0.01 * step, "reward/mean": 0.5})
    rec.finish("finished")
    return run_id


# -- x ranges --------------------------------------------------------------------------------------
def _xs(trace: dict) -> list:
    """A trace's x values; plotly sends numeric arrays base64-encoded (``bdata``)."""
    x = trace.get("x") or []
    if isinstance(x, dict):
        x = np.frombuffer(base64.b64decode(x["bdata"]), dtype=x["dtype"]).tolist()
    return [v for v in x if v is not None]


def _first_x(chart: dict) -> float:
    """The first step a chart's curves hold (alarm lines and bands left out)."""
    return min(v for t in chart["data"] if not str(t.get("name", "")).endswith("alarm")
               and t.get("fill") != "toself" for v in _xs(t))


def test_every_step_chart_starts_at_its_data_and_ends_at_the_runs_last_step(app):
    """SFT steps 1-20, then RL step 21: the SFT charts span 1..21, the RL ones start at 21
    (issue 51: a chart starting at step 0 or 1 whose data starts later is mostly empty)."""
    at = app("dynamics", store_dir="sample_runs", store=SAMPLE_STORE, run=SAMPLE_RUN,
             curves="all")
    charts = step_charts(at)
    assert len(charts) >= 10
    starts = {}
    for c in charts:
        lo, hi = c["layout"]["xaxis"]["range"]
        first = _first_x(c)
        assert 21 <= hi < 22 and first - 1 < lo < first, (c["layout"].get("title"), lo, hi, first)
        starts[c["layout"]["title"]["text"] if c["layout"].get("title") else None] = first
    assert starts["Reward (mean ± std)"] == 21 and starts["SFT and value loss"] == 1, starts


# -- legends ---------------------------------------------------------------------------------------
def test_legends_lie_below_the_plot_across_its_width(app, demo):
    at = app("dynamics", store=demo[1], run=demo[2]["demo-search-starpo"])
    for chart in step_charts(at):
        legend = chart["layout"].get("legend", {})
        assert legend.get("orientation") == "h" and legend.get("y", 1) < 0, legend


# -- what KL is measured against -------------------------------------------------------------------
@pytest.mark.parametrize("config,says", [
    ({}, "base model (LoRA adapters off): this run was recorded before"),
    ({"kl_reference": "base", "sft_steps": 4}, "base model (LoRA adapters off), as configured"),
    ({"kl_reference": "sft", "sft_steps": 4},
     "policy at the start of RL: a frozen copy of the LoRA adapter taken after the 4 SFT steps"),
    ({"kl_reference": "sft", "sft_steps": 0}, "no SFT steps, so that is the base model"),
])
def test_kl_reference_sentence_follows_the_config(config, says):
    assert says in _signals.kl_reference_note(config)


def test_kl_chart_of_a_sample_run_says_it_was_the_base_model(app):
    at = app("dynamics", store_dir="sample_runs", store=SAMPLE_STORE, run=SAMPLE_RUN)
    assert "base model (LoRA adapters off): this run was recorded before" in kl_caption(at)


def test_kl_chart_of_a_new_run_says_it_was_the_policy_after_sft(app, tmp_path):
    path = tmp_path / "kl" / "kl.duckdb"
    path.parent.mkdir()
    run_id = _kl_run(path, {"kl_reference": "sft", "sft_steps": 2, "kl_coef": 0.001})
    at = app("dynamics", store_dir=str(path.parent), store=str(path), run=run_id)
    caption = kl_caption(at)
    assert "frozen copy of the LoRA adapter taken after the 2 SFT steps" in caption
    assert "0.001" in caption


def test_an_imported_runs_kl_is_the_other_trainers(app, tmp_path):
    path = tmp_path / "imp" / "imp.duckdb"
    path.parent.mkdir()
    rec = Recorder(path)
    run_id = rec.start_run({"env": "search", "model": "verl", "algo": "grpo"}, name="imp",
                           source="import")
    rec.record_step(1, metrics={"policy/kl": 0.02})
    rec.finish("finished")
    at = app("dynamics", store_dir=str(path.parent), store=str(path), run=run_id)
    assert "trainer that recorded it" in kl_caption(at)


def test_the_step_size_chart_draws_how_far_each_update_moved_the_adapter(app, tmp_path):
    path = tmp_path / "delta" / "delta.duckdb"
    path.parent.mkdir()
    rec = Recorder(path)
    run_id = rec.start_run({"env": "search", "model": "tiny", "algo": "grpo", "lr": 2e-4},
                           name="delta")
    for step, rms in ((1, 2e-4), (2, 3e-5), (3, 1e-5)):
        rec.record_step(step, metrics={"update/delta_rms": rms, "update/delta_rel": rms * 10,
                                       "reward/mean": 0.5})
    rec.finish("finished")
    at = app("dynamics", store_dir=str(path.parent), store=str(path), run=run_id)
    charts = {c["layout"]["title"]["text"]: c for c in step_charts(at)}
    delta = charts["Step size: RMS weight change per update"]
    assert values(delta["data"][0]["y"]) == [2e-4, 3e-5, 1e-5]
    assert any("moves every weight by the learning rate" in t and "This run's RL lr: 0.0002." in t
               for t in texts(at, "caption"))


def test_a_run_recorded_before_the_step_size_metric_says_so(app):
    old = app("dynamics", store_dir="sample_runs", store=SAMPLE_STORE, run=SAMPLE_RUN)
    assert any("Step size: RMS weight change per update: not recorded" in t
               for t in texts(old, "caption"))


# -- the sidebar's step ----------------------------------------------------------------------------
def _marked_steps(chart: dict) -> set:
    return {(s.get("x0"), s.get("x1")) for s in chart["layout"].get("shapes", [])}


def test_dynamics_marks_the_sidebar_step_on_every_chart(app, demo):
    at = app("dynamics", store=demo[1], run=demo[2]["demo-search-starpo"])
    step = at.selectbox(key="step").value
    assert step == 11
    for chart in step_charts(at):
        assert (11, 11) in _marked_steps(chart), chart["layout"].get("title")
    at.selectbox(key="step").set_value(5).run()
    for chart in step_charts(at):
        assert _marked_steps(chart) == {(5, 5)}, chart["layout"].get("title")
    assert any("step 5" in t and "sidebar" in t for t in texts(at, "caption"))


def test_the_step_picker_shows_only_where_a_page_uses_it(app, demo):
    run = demo[2]["demo-search-starpo"]
    for page, shown in (("replay", True), ("groups", True), ("dynamics", True),
                        ("runs", False), ("failures", False), ("train", False)):
        at = app(page, store=demo[1], run=run)
        keys = [s.key for s in at.sidebar.selectbox]
        assert ("step" in keys) is shown, (page, keys)


def test_the_picked_step_survives_a_visit_to_a_page_without_it(app, demo):
    at = app("replay", store=demo[1], run=demo[2]["demo-search-starpo"])
    at.selectbox(key="step").set_value(5).run()
    at = at.switch_page("pages/runs.py").run()
    assert not at.exception
    assert "step" not in [s.key for s in at.sidebar.selectbox]
    at = at.switch_page("pages/replay.py").run()
    assert not at.exception
    assert at.selectbox(key="step").value == 5


# -- no stray text ---------------------------------------------------------------------------------
@pytest.mark.parametrize("script", ["app.py"] + sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "pages").glob("[!_]*.py")))
def test_no_bare_string_after_the_docstring(script):
    """Streamlit's magic draws a bare string statement of a page script on the page: a constant's
    "docstring" (MARKERS_UP_TO's, STEP_PAGES') showed above the Dynamics title / on every page."""
    body = ast.parse((ROOT / script).read_text()).body
    stray = [n.lineno for n in body[1:] if isinstance(n, ast.Expr)
             and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)]
    assert stray == [], f"{script}: bare strings at lines {stray}"


# -- the first paint -------------------------------------------------------------------------------
def _titles(at) -> list[str]:
    return [c["layout"]["title"]["text"] for c in step_charts(at) if c["layout"].get("title")]


def _many_curves_run(path, config: dict, extra: dict) -> str:
    """A run recording every curve of the page's list (and ``extra``) over steps 1-4."""
    names = ["reward/mean", "reward/std", "reward/group_std_mean", "reward/frac_zero_std",
             "success/rate", "policy/kl", "policy/entropy", "response/length_mean",
             "policy/clipfrac", "collapse/repeat_frac", "env/turns_mean", "sft/loss",
             "update/delta_rms", "update/delta_rel", "mismatch/abs_mean",
             "mismatch/ratio_out_frac", "grad/norm", "time/step_s"]
    rec = Recorder(path)
    run_id = rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo", **config},
                           name="many")
    for step in range(1, 5):
        rec.record_step(step, metrics={**{n: 0.1 * step for n in names},
                                       "mismatch/ratio_out_frac": 0.0, **extra})
    rec.finish("finished")
    return run_id


def test_a_run_with_many_curves_draws_the_core_ones_first_and_all_on_demand(app, tmp_path):
    path = tmp_path / "many" / "many.duckdb"
    path.parent.mkdir()
    run_id = _many_curves_run(path, {}, {})
    at = app("dynamics", store_dir=str(path.parent), store=str(path), run=run_id)
    first = _titles(at)
    assert first == ["Reward (mean ± std)", "In-group reward std, zero-std groups", "Success",
                     "KL (to the reference; approx. to the sampler)"], first
    assert any(t.startswith("Also recorded: Entropy; Response length")
               for t in texts(at, "caption"))
    every = _titles(app("dynamics", store_dir=str(path.parent), store=str(path), run=run_id,
                        curves="all"))
    assert {"Entropy", "Clip fraction", "Step size: RMS weight change per update",
            "Training-inference mismatch |lp_train - lp_sampler|"} <= set(every), every
    assert every[:4] == first


def test_a_trl_run_opens_on_what_trl_users_chart(app, tmp_path):
    """A TRL run's first view: mean reward per reward function, loss, learning rate, KL, response
    length and step time (W&B's default panels for GRPOTrainer), not success, which TRL does not
    log."""
    path = tmp_path / "trl" / "trl.duckdb"
    path.parent.mkdir()
    run_id = _many_curves_run(path, {"trainer": "trl.GRPOTrainer", "loss_type": "dapo"},
                              {"trl/rewards/format_reward/mean": 0.5,
                               "trl/rewards/accuracy/mean": 0.25, "policy/loss": 0.01,
                               "optim/lr": 1e-5})
    at = app("dynamics", store_dir=str(path.parent), store=str(path), run=run_id)
    first = _titles(at)
    assert first == ["Reward (mean ± std)", "Mean reward per reward function",
                     "In-group reward std, zero-std groups",
                     "KL (to the reference; approx. to the sampler)", "Loss", "Learning rate",
                     "Response length (tokens)", "Step time (s)"], first
    rewards = next(c for c in step_charts(at)
                   if c["layout"]["title"]["text"] == "Mean reward per reward function")
    assert [t["name"] for t in rewards["data"]] == ["trl/rewards/accuracy/mean",
                                                    "trl/rewards/format_reward/mean"]


def test_mismatch_curves_come_first_when_the_sampler_and_trainer_disagree(app, tmp_path):
    path = tmp_path / "mm" / "mm.duckdb"
    path.parent.mkdir()
    run_id = _many_curves_run(path, {}, {"mismatch/ratio_out_frac": 0.012})
    first = _titles(app("dynamics", store_dir=str(path.parent), store=str(path), run=run_id))
    assert "Training-inference mismatch |lp_train - lp_sampler|" in first
    assert "Ratio outside [0.9, 1.1]; k3 KL(sampler || trainer)" in first
