"""Dynamics' behaviours panel in a real headless Chromium: on a store whose shortcut is paid and
spreading (tests/test_behaviours.py ``constructed_run``, the job run on it), the rate and
Cov(A, b) charts are drawn, the shallow-strategy alarm is listed, and its link opens the step's
top contributing trajectory in Replay.

Run alone: ``.venv/bin/python -m pytest -q tests/test_browser_behaviours.py``.
"""
from __future__ import annotations

import time
import urllib.parse

import pytest

from storage.behaviours import run_job
from storage.recorder import Recorder
from tests.browser_harness import ROOT, browser_fixtures, scratch_dir, served_app
from tests.test_behaviours import constructed_run
from tests.test_browser import no_exception, settle

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server():
    base = scratch_dir("browser-behaviours")
    stores = base / "stores"
    (ROOT / stores).mkdir(parents=True)
    store = stores / "shortcut.duckdb"
    constructed_run(Recorder(ROOT / store), "paid", [8, 10, 12, 14, 16], paid=True)
    run_job(ROOT / store, "paid")
    with served_app(base, [stores], base / "runs") as url:
        yield url, str(store)


browser, page = browser_fixtures(1280, 900)


def open_dynamics(page, url: str, store: str) -> float:
    t0 = time.perf_counter()
    page.goto(f"{url}/dynamics?" + urllib.parse.urlencode({"store": store, "run": "paid"}))
    page.get_by_role("heading", name="Behaviours: what the update paid for").wait_for(
        timeout=60_000)
    settle(page, quiet_ms=300)
    return time.perf_counter() - t0


def test_chart_and_alarm_link_reach_replay(page, server):
    url, store = server
    open_dynamics(page, url, store)
    warm = open_dynamics(page, url, store)
    no_exception(page)
    # the charts, drawn by plotly (their titles and the rate chart's legend, metric names as
    # stored)
    for text in ("Rate (mean over the step)", "Cov(A, b): > 0 was reinforced",
                 "behaviour/no_successful_tool_call/rate, adv_cov"):
        page.locator("[data-testid=stPlotlyChart]").get_by_text(text).first.wait_for(
            timeout=30_000)
    alarm = page.get_by_text("Shallow-strategy alarm at step 3:").first
    alarm.wait_for(timeout=30_000)
    link = page.get_by_role("link", name="(top contributor)").first
    traj = link.inner_text().split()[1].replace("\\", "")
    assert traj.startswith("s3-")
    link.click()
    page.get_by_role("heading", name="Replay", exact=True).first.wait_for(timeout=60_000)
    settle(page)
    no_exception(page)
    assert f"traj={traj}" in page.url and "step=3" in page.url
    # the trajectory behind the alarm answered without searching: its one action is the answer
    page.get_by_text("<answer>Paris</answer>").first.wait_for(timeout=30_000)
    print(f"Dynamics warm load with the behaviours panel: {warm:.2f} s")
