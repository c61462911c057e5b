"""A run recorded from a real TRL ``GRPOTrainer`` (the callback, tests/test_trl_callback.py's
``trl_run``: tiny model, 2 steps, two reward functions) in a real headless Chromium, as a TRL user
opens it: the runs list names its base model and "GRPO (loss_type=...)", Dynamics charts the mean
of each reward function, Groups lists the step's completions with each function's value, and
Failures says why no failure class applies instead of labelling every completion ``no_answer``.

Run alone: ``.venv/bin/python -m pytest -q tests/test_browser_trl.py``.
"""
from __future__ import annotations

import shutil
import urllib.parse

import pytest

pytest.importorskip("trl", reason="TRL is optional: make extras (make test installs it)")

from tests.browser_harness import ROOT, browser_fixtures, scratch_dir, served_app  # noqa: E402
from tests.test_browser import no_exception, settle  # noqa: E402
from tests.test_trl_callback import trl_run  # noqa: E402,F401 (a fixture)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(trl_run):
    path, callback = trl_run
    base = scratch_dir("browser-trl")
    (ROOT / base / "stores").mkdir(parents=True)
    shutil.copy(path, ROOT / base / "stores" / "trl.duckdb")
    with served_app(base, [base / "stores"], base / "runs") as url:
        yield url, str(base / "stores" / "trl.duckdb"), callback.run_id


browser, page = browser_fixtures(1400, 900)


def _open(page, server, name: str, heading: str, **params) -> str:
    url, store, run_id = server
    query = urllib.parse.urlencode({"store": store, "run": run_id, **params})
    page.goto(f"{url}/{name}?{query}")
    page.get_by_role("heading", name=heading, exact=True).first.wait_for(timeout=60_000)
    settle(page)
    return page.locator("[data-testid=stMain]").inner_text()


def test_the_runs_list_names_the_base_model_and_grpos_loss_type(page, server):
    shown = _open(page, server, "runs", "Runs")
    page.get_by_text("trl grpo test").first.wait_for(timeout=30_000)
    shown = page.locator("[data-testid=stMain]").inner_text()
    assert "GRPO (loss_type=" in shown
    assert "PeftModel" not in shown
    no_exception(page)


def test_dynamics_charts_each_reward_function(page, server):
    _open(page, server, "dynamics", "Dynamics")
    page.get_by_text("Mean reward per reward function").first.wait_for(timeout=30_000)
    page.locator(".js-plotly-plot .legendtext").first.wait_for(timeout=30_000)
    legend = page.locator(".js-plotly-plot .legendtext").evaluate_all(
        "els => els.map(e => e.textContent)")
    assert {"trl/rewards/format_reward/mean", "trl/rewards/length_reward/mean"} <= set(legend)
    no_exception(page)


def test_groups_lists_the_completions_and_failures_says_no_class_applies(page, server):
    _open(page, server, "groups", "Groups", step=1, group="s1-g0")
    page.get_by_text("Every completion of step 1, as TRL logs them").first.wait_for(
        timeout=30_000)
    grid = page.locator("[data-testid='stDataFrameResizable']").first  # the expander's, first
    grid.wait_for(timeout=30_000)
    grid.locator("[role=columnheader]").first.wait_for(state="attached", timeout=30_000)
    headers = grid.evaluate("d => [...d.querySelectorAll('[role=columnheader]')]"
                            ".map(e => e.textContent.trim())")
    assert {"prompt", "completion", "format_reward", "length_reward"} <= set(headers), headers
    assert not {"format", "outcome"} & set(headers)              # each reward function once
    no_exception(page)
    shown = _open(page, server, "failures", "Failures")
    assert "no failure class applies" in shown and "no_answer" not in shown
    no_exception(page)
