"""A user's first minute, in a real browser: a run in its first seconds, and Replay's layout.

A TRL run starting or a job just launched has a ``runs`` row and nothing else, so its
``last_step`` is NULL, which pandas hands over as ``pd.NA``. Every page once raised
``TypeError: int() argument must be ... not 'NAType'`` from the sidebar's run picker for those
seconds. Here such a run (recorded through the real Recorder, left ``running``) is opened on every
page; none may show an exception, and the run must be the one picked.

Replay's token view, the heart of the product, once sat about 2,000 px down the page, under the
outcome, information-gain, branch and tag panels; it now follows the turns. And an invalid action
was labelled "invalid · invalid" (its type, then its validity).

Run alone: ``.venv/bin/python -m pytest -q tests/test_browser_first_minute.py``.
"""
from __future__ import annotations

import urllib.parse

import pandas as pd
import pytest

from pages import _common as c
from storage import queries
from storage.recorder import Recorder
from tests.browser_harness import ROOT, browser_fixtures, scratch_dir, served_app
from tests.test_browser import no_exception, settle

PAGES = {"runs": "Runs", "replay": "Replay", "groups": "Groups", "dynamics": "Dynamics",
         "failures": "Failures", "compare": "Compare", "train": "Train"}


def test_one_reading_of_null_for_every_form_pandas_gives_it():
    for null in (None, float("nan"), pd.NA, pd.NaT):
        assert c.missing(null) and c.text_of(null) is None and c.int_of(null, -1) == -1
    for value, text, number in ((0, "0", 0), (7, "7", 7), ("x", "x", None), (2.0, "2.0", 2)):
        assert not c.missing(value) and c.text_of(value) == text
        if number is not None:
            assert c.int_of(value, -1) == number
    assert c.text_of("") is None and not c.missing([1, 2])
    assert c.int_of(pd.array([None], dtype="Int64")[0], -5) == -5


@pytest.fixture(scope="module")
def server():
    """(base URL, store path, run id) of an app serving one store holding a run that has started
    and recorded nothing yet."""
    base = scratch_dir("browser-new-run")
    stores = base / "stores"
    (ROOT / stores).mkdir(parents=True)
    store = stores / "store.duckdb"
    rec = Recorder(ROOT / store)
    run_id = rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo"}, name="just-started")
    rec.close()
    row = queries.runs(ROOT / store).set_index("run_id").loc[run_id]
    assert row["last_step"] is pd.NA and row["shown_status"] == "running"   # the case itself
    with served_app(base, [stores, "sample_runs"], base / "runs") as url:
        yield url, str(store), run_id


browser, page = browser_fixtures(1400, 900)
pytestmark = pytest.mark.browser


@pytest.mark.parametrize("path", list(PAGES))
def test_every_page_opens_on_a_run_with_no_step_yet(page, server, path):
    url, store, run_id = server
    page.goto(f"{url}/{path}?{urllib.parse.urlencode({'store': store, 'run': run_id})}")
    page.get_by_role("heading", name=PAGES[path], exact=True).first.wait_for(timeout=60_000)
    settle(page)
    no_exception(page)
    picker = page.locator('[data-testid="stSidebar"]').get_by_role("combobox", name="Run")
    assert "just-started" in picker.input_value() or "just-started" in picker.inner_text() \
        or page.get_by_text("just-started").count() > 0


LAKE = ("sample_runs/spike_frozenlake.duckdb", "20261129-224034-6beb19", 21, "s21-g0-r0")
"""A sample trajectory whose first turn's action is invalid."""


def test_replay_shows_the_tokens_within_two_screens_and_labels_an_action_once(page, server):
    url = server[0]
    store, run, step, traj = LAKE
    query = {"store": store, "run": run, "step": step, "traj": traj, "turn": 0}
    page.goto(f"{url}/replay?{urllib.parse.urlencode(query)}")
    page.get_by_role("heading", name="Replay", exact=True).first.wait_for(timeout=60_000)
    settle(page)
    no_exception(page)
    view = page.locator(".token-view")
    view.wait_for(timeout=30_000)
    top = view.bounding_box()["y"] + page.evaluate("window.scrollY")
    assert top < 2 * 900, f"the token view starts {top:.0f} px down the page"
    main = page.locator('[data-testid="stMain"]').inner_text()
    assert "invalid · invalid" not in main
    assert "Action · invalid" in main
