"""Walkthrough step 11 run live, in a real browser: the branch form on a sample store.

The sample stores' runs trained into a checkpoint folder that is not committed, so the branch form
was offered on every sample run and its job failed ("no saved adapter"). The snapshots the sample
analyses used now ship beside the store (sample_runs/checkpoints/RUN/adapters/), and the page and
the job both look there. Here a copy of sample_runs/branch_failures.duckdb with its checkpoints is
served; README's step 11 link opens Replay with the form, and a job started from it (K = 2, the
fall's turn) runs and replaces that turn's analysis with its own.

Run alone: ``.venv/bin/python -m pytest -q tests/test_browser_branch_live.py``.
"""
from __future__ import annotations

import re
import shutil
import urllib.parse

import pytest

from storage import turn_queries
from tests.browser_harness import ROOT, browser_fixtures, scratch_dir, served_app
from tests.test_browser import no_exception, settle

STORE = "branch_failures.duckdb"
LINK = re.compile(r"\(http://127\.0\.0\.1:8501/replay\?(store=sample_runs%2Fbranch_failures[^)]*)\)")


def _step_11() -> dict:
    """The query of README's step 11 link (run, step, trajectory and turn of the lake's fall)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    query = LINK.search(text[text.index("11. **Which turn lost the reward?**"):]).group(1)
    return {k: v[0] for k, v in urllib.parse.parse_qs(query).items()}


@pytest.fixture(scope="module")
def server():
    """(base URL, the store copy's path relative to the root) of an app serving a copy of the
    branch sample store with its shipped checkpoints."""
    base = scratch_dir("browser-branch-live")
    stores = base / "stores"
    (ROOT / stores).mkdir(parents=True)
    shutil.copy(ROOT / "sample_runs" / STORE, ROOT / stores / STORE)
    shutil.copytree(ROOT / "sample_runs" / "checkpoints", ROOT / stores / "checkpoints")
    with served_app(base, [stores], base / "runs") as url:
        yield url, str(stores / STORE)


browser, page = browser_fixtures(1400, 900)
pytestmark = pytest.mark.browser


def test_step_11_branch_form_runs_on_the_shipped_adapters(page, server):
    url, store = server
    query = {**_step_11(), "store": store}
    run, traj, fall = query["run"], query["traj"], int(query["turn"])
    before = turn_queries.branch_children(ROOT / store, run, traj)
    assert len(before) == 2 * 64 * 4  # the committed K = 64 analysis
    page.goto(f"{url}/replay?{urllib.parse.urlencode(query)}")
    page.get_by_role("heading", name="Replay", exact=True).first.wait_for(timeout=60_000)
    settle(page)
    no_exception(page)
    assert page.get_by_text("No branch job here").count() == 0
    k = page.locator(".st-key-branch_k input")
    k.wait_for(timeout=30_000)
    k.fill("2")
    turns = page.locator(".st-key-branch_turns input")
    turns.fill(str(fall))
    turns.press("Tab")
    page.get_by_role("button", name="Start the branch job").click()
    page.get_by_text("The last branch job on this trajectory finished.").wait_for(timeout=240_000)
    no_exception(page)
    after = turn_queries.branch_children(ROOT / store, run, traj)
    # the fall's turn analysed again with 2 continuations per kind; the other turns kept theirs
    mine = after[after["turn"] == fall]
    assert len(mine) == 2 * 2 and set(mine["kind"]) == {"keep", "resample"}
    assert len(after) == len(before) - 2 * 64 + 2 * 2
    assert set(after["checkpoint_step"]) == set(before["checkpoint_step"])
    est = turn_queries.branch_estimates(ROOT / store, run, traj).set_index("turn")
    assert est.loc[fall, "n"] == 2.0 and (est.drop(index=fall)["n"] == 64.0).all()
