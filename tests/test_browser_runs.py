"""Runs that share a name, and the walkthrough's apps step, in a real browser (Debian's chromium).

The Train page used to name every run ``demo``. Streamlit's selectbox sends the *label* of the
chosen option back to the server and maps it to an option by label (the last one wins), so two
runs labelled alike were one option: the first click on any widget switched the page to the other
run, and a tag saved "on" the run shown was written to the other one. Here two runs named ``demo``
(recorded through the real Recorder, with the same trajectory ids, as two Train-page runs would
have) are opened, a trajectory is selected and tagged, and the tag must land on the run and
trajectory on screen.

Run alone: ``.venv/bin/python -m pytest -q tests/test_browser_runs.py``.
"""
from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

import pytest

from storage import queries
from storage.recorder import Recorder
from tests.browser_harness import ROOT, browser_fixtures, scratch_dir, served_app
from tests.test_browser import no_exception, settle

pytestmark = pytest.mark.browser
ANSWERS = {"older": "Phoenix", "newer": "Dragon"}   # what each run's trajectories answered
TRAJS = ("s00-g0-r0", "s00-g0-r1")


def _record_demo_run(path: Path, answer: str) -> str:
    """One finished run named ``demo``: a step of two failed bandit trajectories."""
    rec = Recorder(path)
    run_id = rec.start_run({"env": "bandit", "model": "tiny", "algo": "dr_grpo", "max_turns": 1},
                           name="demo")
    trajs = [dict(traj_id=t, group_id="s00-g0", task_id="arms-0", reward=0.0, advantage=0.0,
                  success=False, num_turns=1, finish_reason="answered", split="train",
                  prompt="Pick an arm.", answer=answer, failure_class="wrong_answer")
             for t in TRAJS]
    turns = [dict(traj_id=t, turn=0, action=f"<answer>{answer}</answer>", observation="",
                  action_valid=True, action_type="answer") for t in TRAJS]
    rec.record_step(0, metrics={"reward/mean": 0.0}, trajectories=trajs, turns=turns)
    rec.finish("finished")
    return run_id


@pytest.fixture(scope="module")
def server():
    """(base URL, store path, {'older': run_id, 'newer': run_id}) of an app serving one store
    with two runs named ``demo``, and the committed sample runs."""
    base = scratch_dir("browser-runs")
    stores = base / "stores"
    (ROOT / stores).mkdir(parents=True)
    store = stores / "store.duckdb"
    ids = {which: _record_demo_run(ROOT / store, answer) for which, answer in ANSWERS.items()}
    with served_app(base, [stores, "sample_runs"], base / "runs") as url:
        yield url, str(store), ids


browser, page = browser_fixtures(1400, 2400)


def _goto(page, url: str, path: str, title: str, **params) -> None:
    page.goto(f"{url}/{path}?{urllib.parse.urlencode(params)}")
    page.get_by_role("heading", name=title, exact=True).first.wait_for(timeout=60_000)
    settle(page)


def _run_picker(page):
    return page.locator('[data-testid="stSidebar"]').get_by_role("combobox", name="Run")


def _select_first_row(page, key: str) -> None:
    """Tick the row-selection box of a st.dataframe's first row (the grid draws on a canvas)."""
    grid = page.locator(f".st-key-{key} [data-testid='stDataFrameResizable']")
    grid.wait_for(timeout=30_000)
    grid.click(position={"x": 18, "y": 35 + 17})     # header row 35 px, then the first row


def test_two_runs_named_demo_are_told_apart_and_tagged_where_shown(page, server):
    url, store, ids = server
    _goto(page, url, "failures", "Failures", store=store, run=ids["newer"])
    shown = _run_picker(page).input_value()
    _select_first_row(page, "fail_results")                      # the first interaction
    page.get_by_role("heading", name=f"Trajectory {TRAJS[0]}").wait_for(timeout=30_000)
    settle(page)
    no_exception(page)
    assert f"run={ids['newer']}" in page.url, page.url            # still the run that was opened
    assert _run_picker(page).input_value() == shown
    page.get_by_text(f"<answer>{ANSWERS['newer']}</answer>").first.wait_for(timeout=10_000)

    page.get_by_role("textbox", name="Tag").fill("seen-on-newer")
    page.get_by_role("textbox", name="Note").fill("tagged in the browser")
    page.get_by_role("button", name="Save tag").click()
    settle(page)
    no_exception(page)
    newer = queries.tags(store, ids["newer"])
    assert newer[["traj_id", "tag", "note"]].values.tolist() == [
        [TRAJS[0], "seen-on-newer", "tagged in the browser"]]
    assert queries.tags(store, ids["older"]).empty                # nothing went to the other run
    assert f"run={ids['newer']}" in page.url

    picker = _run_picker(page)
    picker.click()
    labels = [o.inner_text() for o in page.get_by_role("option").all()]
    page.keyboard.press("Escape")
    demo_labels = [label for label in labels if label.startswith("demo ")]
    assert len(demo_labels) == 2 and len(set(demo_labels)) == 2, demo_labels   # told apart
    assert ids["newer"][-6:] in shown, shown                     # the short id names the run


def test_walkthrough_apps_step_opens_the_damaging_turn(page, server):
    """README step 3 links to the turn where the careless agent archives the unread email; the
    slider and the caption name that turn by the same number the link uses."""
    url = server[0]
    readme = (ROOT / "README.md").read_text()
    link = re.search(r"\[Replay, apps world, a careless agent\]\((http://[^)]+)\)", readme)[1]
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(link).query))
    turns = queries.turns(str(ROOT / query["store"]), query["run"], [query["traj"]])
    turn = int(query["turn"])
    row = turns.set_index("turn").loc[turn]
    assert "archive_email" in row["action"]
    diff = __import__("json").loads(row["state_diff"])
    assert diff[0]["before"]["is_read"] == 0                     # the unread one
    assert diff[0]["before"]["folder"] == "inbox" and diff[0]["after"]["folder"] == "archive"

    _goto(page, url, "replay", "Replay", **query)
    page.get_by_text(f"Turn {turn} of {len(turns)}").wait_for(timeout=30_000)
    slider = page.get_by_role("slider", name="Turn")
    assert slider.input_value() == str(turn)                     # slider and caption agree
    assert slider.get_attribute("min") == "0"
    table = page.locator("table.state-table").first                # the diff as a table
    table.wait_for(timeout=30_000)
    rows = [[c.inner_text() for c in r.locator("td").all()]
            for r in table.locator("tbody tr").all()]
    assert ["emails", "folder", "inbox", "archive"] in [[r[0], r[3], r[4], r[5]] for r in rows]
    assert "is_read" not in [r[3] for r in rows]                   # an unchanged field is left out
    no_exception(page)


def test_train_page_offers_a_unique_run_name(page, server):
    from playwright.sync_api import expect
    url = server[0]
    _goto(page, url, "train", "Train")
    name = page.get_by_role("textbox", name="Run name")
    expect(name).to_have_value(re.compile(r"^workshop-demo-\d{8}-\d{6}$"))  # not a fixed 'demo'
    page.get_by_role("combobox", name="Preset").click()
    page.get_by_role("option", name="tiny-smoke").click()
    expect(name).to_have_value(re.compile(r"^tiny-smoke-\d{8}-\d{6}$"), timeout=30_000)
    no_exception(page)
