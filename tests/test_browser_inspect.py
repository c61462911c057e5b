"""Two agents' Inspect AI logs (sample_runs/inspect_agents.duckdb) in a real headless Chromium
(Debian's package through playwright), the way a user meets them: Replay shows a tool call as a
call (its name, its arguments in a grid) and not as text a second time; Failures opens with what
each class of the evaluation means; Compare counts the gained and lost samples.

Run alone: ``.venv/bin/python -m pytest -q tests/test_browser_inspect.py``.
"""
from __future__ import annotations

import shutil
import urllib.parse

import duckdb
import pytest

from tests.browser_harness import ROOT, browser_fixtures, scratch_dir, served_app
from tests.test_browser import no_exception, settle

pytestmark = pytest.mark.browser
SOURCE = ROOT / "sample_runs" / "inspect_agents.duckdb"
CAREFUL = "inspect-agents-shop_desk-mockllm-careful-7ab7146f"
HASTY = "inspect-agents-shop_desk-mockllm-hasty-1c4018c9"


@pytest.fixture(scope="module")
def server():
    """(base URL, store path) of an app on a copy of the committed Inspect store."""
    if not SOURCE.exists():
        pytest.skip("sample_runs/inspect_agents.duckdb is not recorded: make.sh inspect")
    base = scratch_dir("browser-inspect")
    stores = base / "stores"
    (ROOT / stores).mkdir(parents=True)
    store = stores / SOURCE.name
    shutil.copy(SOURCE, ROOT / store)
    with served_app(base, [stores], base / "runs") as url:
        yield url, str(store)


browser, page = browser_fixtures(1280, 900)


def goto(page, server, path: str, title: str, **params) -> None:
    url, store = server
    page.goto(f"{url}/{path}?{urllib.parse.urlencode({'store': store, **params})}")
    page.get_by_role("heading", name=title, exact=True).first.wait_for(timeout=60_000)
    settle(page)
    page.wait_for_timeout(1000)          # tables draw after the script has run


def _kiwi() -> str:
    with duckdb.connect(str(SOURCE), read_only=True) as con:
        return con.execute("SELECT traj_id FROM trajectories WHERE run_id = ? AND task_id = "
                           "'kiwi'", [HASTY]).fetchone()[0]


def test_replay_shows_the_call_by_name_and_arguments(page, server):
    goto(page, server, "replay", "Replay", run=HASTY, step=0, traj=_kiwi(), turn=1)
    main = page.locator("[data-testid=stMain]")
    main.get_by_text("Tool call").first.wait_for(timeout=30_000)
    assert "Tool call · catalogue" in main.inner_text()
    grids = page.locator("[data-testid='stDataFrameResizable']")
    grids.first.wait_for(timeout=30_000)
    headers = [[h.strip() for h in grid.evaluate(
        "d => [...d.querySelectorAll('[role=columnheader]')].map(e => e.textContent)")
        if h.strip()] for grid in grids.all()]
    assert ["argument", "value"] in headers, headers  # the call's arguments, a grid of text
    codes = page.locator("[data-testid=stCode]").all_inner_texts()
    assert "tool call for tool catalogue" in codes
    assert not any("catalogue(item=" in c for c in codes)   # the call is not shown twice
    assert "Evaluation sample (as the Inspect log recorded it)" in main.inner_text()
    no_exception(page)


def test_failures_opens_with_what_each_class_means(page, server):
    goto(page, server, "failures", "Failures", run=CAREFUL)
    text = page.locator("[data-testid=stMain]").inner_text()
    assert "What the 5 classes of this run mean" in text
    assert "refused · 1 (17%): The model declined the task" in text    # open by itself
    assert "limit_exceeded · 1 (17%)" in text
    no_exception(page)


def test_compare_counts_gained_and_lost_samples(page, server):
    goto(page, server, "compare", "Compare", run=CAREFUL, a=f"{CAREFUL}:0", b=f"{HASTY}:0")
    metrics = page.locator("[data-testid=stMetric]").all_inner_texts()
    assert any(m.startswith("gained") and m.rstrip().endswith("2") for m in metrics), metrics
    assert any(m.startswith("lost") and m.rstrip().endswith("1") for m in metrics), metrics
    no_exception(page)
