"""What a first look at the app shows in a 1280 x 900 window (a laptop), in a real headless Chromium
(Debian's package through playwright): the committed sample runs newest first with their key
columns in view, the newest run picked, a group's rollouts all on screen, and on the Train page
the current job without scrolling, its held-out success plotted, links to its run and a log
without the checkpoint's per-step library warning.

Run alone: ``.venv/bin/python -m pytest -q tests/test_browser_clarity.py``.
"""
from __future__ import annotations

import re
import urllib.parse

import pytest

from pages import _runlist
from storage import queries
from storage.recorder import Recorder
from tests.app_fixtures import RUN_NAMES, SCRIPT_TEXT, SCRIPT_TRAJ, make_demo_store
from tests.browser_harness import ROOT, browser_fixtures, fill_until_held, scratch_dir, served_app
from tests.test_browser import _stop_job, _trainer_available, no_exception, settle

pytestmark = pytest.mark.browser
WIDTH, HEIGHT = 1280, 900
SAMPLES = "sample_runs"
# A search group of 8 rollouts whose actions run to hundreds of characters.
SEARCH_STORE, SEARCH_RUN, SEARCH_STEP, SEARCH_GROUP = (
    "sample_runs/search_smollm2.duckdb", "20261129-215645-4187b5", 21, "s21-g0")
PEFT_WARNING = "save_embedding_layers"
LIVE_MARKUP = "[data-testid=stMain] [data-testid=stHtml] :is(script, img, b)"  # the page's HTML


def _record_cross_evaluation(path) -> None:
    """A trained run, then a cross-evaluation of its checkpoint: one evaluation step, no reward
    curve, recorded last (as core/jobs/evaluation.py's runs are, after the runs they pair)."""
    rec = Recorder(path)
    trained = rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo"}, name="trained")
    for step in range(1, 4):
        rec.record_step(step, metrics={"reward/mean": 0.2 * step, "success/rate": 0.1 * step})
    rec.finish("finished")
    rec = Recorder(path)
    rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo",
                   "cross_eval": {"checkpoint_run": trained}}, name="trained@3 on other@3's tasks")
    rec.record_step(3, metrics={"eval/success": 0.5})
    rec.finish("finished")


@pytest.fixture(scope="module")
def server():
    """(base URL, demo store, runs dir) of an app serving the sample runs, the demo store
    (tests/app_fixtures.py) and a Train page's own store."""
    base = scratch_dir("browser-clarity")
    runs, stores = base / "runs", base / "stores"
    (ROOT / runs).mkdir(parents=True)
    (ROOT / stores).mkdir(parents=True)
    demo = dict(zip(RUN_NAMES, make_demo_store(ROOT / stores / "demo.duckdb")))
    _record_cross_evaluation(ROOT / stores / "xeval.duckdb")   # the newest run of all
    dirs = (SAMPLES, str(stores), str(runs))
    with served_app(base, dirs, runs) as url:
        try:
            yield url, (str(stores / "demo.duckdb"), demo), runs, dirs
        finally:
            _stop_job(ROOT / runs)


browser, page = browser_fixtures(WIDTH, HEIGHT)


def goto(page, url: str, path: str, title: str, **params) -> None:
    page.goto(f"{url}/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else ""))
    page.get_by_role("heading", name=title, exact=True).first.wait_for(timeout=60_000)
    settle(page)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stSkeleton\"]')", timeout=30_000)
    page.wait_for_timeout(1000)          # tables and charts draw after the script has run


# -- runs ------------------------------------------------------------------------------------------
def test_runs_grouped_by_store_readable_in_the_window_and_a_run_worth_opening_picked(page, server):
    """The first page with no link: the sidebar picks the newest run worth opening (the newest of
    all, a cross-evaluation with no reward curve, is passed over), its store's section is open,
    and in it every column fits the 1280 px window: no table scrolls sideways, no cell cuts its
    text (the run names included)."""
    url, _, _, dirs = server
    goto(page, url, "", "Runs")                          # the first page, no link parameters
    table = queries.all_runs(queries.discover_stores(dirs, root=ROOT))
    table = table[table["run_id"].notna()].reset_index(drop=True)
    want = table.iloc[_runlist.worth_opening(table)].to_dict()
    assert table.iloc[0]["name"].startswith("trained@3")  # the newest: a cross-evaluation
    assert want["name"] == "trained"
    picker = page.locator('[data-testid="stSidebar"]').get_by_role("combobox", name="Run")
    assert picker.input_value().startswith(want["name"] + " · "), picker.input_value()
    assert f"run={want['run_id']}" in page.url
    sections = page.locator("[data-testid=stExpander]")
    assert sections.count() == table["store"].nunique()
    opened = page.locator("[data-testid=stExpander] details[open]")
    assert opened.count() >= 1
    grid = opened.first.locator("table.run-list").first
    heads = grid.locator("th").all_inner_texts()
    assert [h.strip() for h in heads][:5] == ["run", "status", "env", "algo", "model"], heads
    fits = grid.evaluate("""t => {
        const box = t.parentElement.getBoundingClientRect();
        const cut = [...t.querySelectorAll('td, th')].filter(
            c => c.scrollWidth > c.clientWidth + 1).map(c => c.textContent);
        return {right: t.getBoundingClientRect().right, box: box.right, width: innerWidth, cut};
    }""")
    assert fits["right"] <= min(fits["box"], fits["width"]) + 1, fits
    assert fits["cut"] == [], fits["cut"]
    row = grid.locator("tr", has_text="shown in the sidebar")
    assert row.count() == 1 and want["run_id"] in row.inner_text()
    no_exception(page)


# -- groups ----------------------------------------------------------------------------------------
def _turn_grid(page) -> dict:
    """Of the first table below 'Actions per turn': its kind, the parts of it that scroll
    sideways, its right edge, and for each rollout id whether its cell is inside it and the
    window."""
    heading = page.get_by_role("heading", name="Actions per turn")
    return heading.evaluate("""h => {
        const top = h.getBoundingClientRect().top;
        const grid = [...document.querySelectorAll(
            '[data-testid=stTable], [data-testid=stDataFrame], [data-testid=stHtml] table')]
            .filter(e => e.getBoundingClientRect().top > top)
            .sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top)[0];
        const r = grid.getBoundingClientRect();
        const wide = [grid, ...grid.querySelectorAll('*')]
            .filter(e => e.scrollWidth > e.clientWidth + 1
                         && getComputedStyle(e).overflowX !== 'visible')
            .map(e => [e.className, e.scrollWidth, e.clientWidth]);
        const cells = [...grid.querySelectorAll('th, td')];
        const row_ids = cells.filter(c => /-r\\d+$/.test(c.textContent.trim())).map(c => {
            const b = c.getBoundingClientRect();
            return [c.textContent.trim(),
                    b.left >= r.left - 1 && b.right <= r.right + 1 && b.right <= innerWidth];
        });
        return {kind: grid.dataset.testid || grid.tagName, wide, row_ids, right: r.right,
                text: grid.textContent};
    }""")


def test_groups_shows_every_rollout_of_a_group_without_a_sideways_scroll(page, server):
    url, _, _, _ = server
    goto(page, url, "groups", "Groups", store=SEARCH_STORE, run=SEARCH_RUN, step=SEARCH_STEP,
         group=SEARCH_GROUP)
    grid = _turn_grid(page)
    assert grid["wide"] == [], f"the actions grid scrolls sideways: {grid['kind']} {grid['wide']}"
    assert grid["right"] <= WIDTH
    assert dict(grid["row_ids"]) == {f"{SEARCH_GROUP}-r{k}": True for k in range(8)}, grid
    no_exception(page)


def test_groups_grid_shows_hostile_actions_as_text(page, server):
    url, (store, demo), _, _ = server
    page.dialogs = []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    goto(page, url, "groups", "Groups", store=store, run=demo["demo-search-starpo"], step=4,
         group=SCRIPT_TRAJ.rsplit("-", 1)[0])
    grid = _turn_grid(page)
    assert SCRIPT_TEXT in grid["text"]                   # shown, as text
    assert page.locator(LIVE_MARKUP).count() == 0
    page.get_by_text("observation", exact=True).click()  # the tool's output, with its <img onerror>
    settle(page)
    grid = _turn_grid(page)
    assert "<img src=x onerror=alert(2)>" in grid["text"]
    assert page.locator(LIVE_MARKUP).count() == 0
    page.wait_for_timeout(500)
    assert page.dialogs == []
    no_exception(page)


# -- train -----------------------------------------------------------------------------------------
def _current_job_in_view(page, first_line) -> None:
    """The 'Current job' heading and the panel's first line end inside the window."""
    for what in (page.get_by_role("heading", name="Current job"), first_line):
        what.wait_for(timeout=30_000)
        box = what.bounding_box()
        assert box["y"] >= 0 and box["y"] + box["height"] <= HEIGHT, \
            f"{what.inner_text()[:40]!r} ends at y={box['y'] + box['height']:.0f}: " \
            f"below the {HEIGHT} px window"


def test_train_current_job_is_in_view_without_scrolling(page, server):
    url, _, _, _ = server
    goto(page, url, "train", "Train")
    _current_job_in_view(page, page.get_by_text("No training job started yet."))
    no_exception(page)


def test_train_job_plots_eval_success_links_its_run_and_logs_no_peft_warning(page, server):
    """A workshop-demo job (LoRA on lm_head, whose checkpoint made peft warn at every step),
    cut to 3 SFT and 2 RL steps: held-out evaluation runs after SFT and at the end."""
    if not _trainer_available():
        pytest.skip("`python -m core.train --help` does not work here: no trainer to launch")
    from playwright.sync_api import expect
    url, _, runs, _ = server
    goto(page, url, "train", "Train")
    expect(page.get_by_role("combobox", name="Preset")).to_have_value("workshop-demo")
    fill_until_held(page.get_by_role("spinbutton", name="SFT steps"), "3")
    fill_until_held(page.get_by_role("spinbutton", name="RL steps"), "2")
    fill_until_held(page.get_by_role("textbox", name="Run name"), "clarity-job")
    launch = page.get_by_role("button", name="Launch training")
    box = launch.bounding_box()            # clicked where it is: the page is not scrolled
    assert box["y"] + box["height"] <= HEIGHT, f"the launch button ends at y={box['y']:.0f}"
    launch.click()
    page.get_by_text(re.compile(r"pid \d+ · ended")).wait_for(timeout=400_000)
    settle(page)
    _current_job_in_view(page, page.get_by_text(re.compile(r"pid \d+ · ended")))

    run = queries.runs(str(ROOT / runs / "store.duckdb"))
    assert run["name"].tolist() == ["clarity-job"], run
    run_id = run["run_id"].iloc[0]
    assert run["status"].iloc[0] == "finished", run[["status", "error"]]

    chart = page.locator(".stPlotlyChart .js-plotly-plot").first
    chart.wait_for(timeout=30_000)
    traces = chart.evaluate("e => e.data.map(t => [t.name, t.yaxis || 'y'])")
    axes = dict(traces)
    assert "eval/success" in axes, traces
    assert axes.get("sft/loss") not in (None, axes["eval/success"]), traces   # its own axis

    log = "\n".join(p.read_text() for p in (ROOT / runs / "logs").glob("clarity-job-*.log"))
    assert "step 3: eval/success" in log                 # the log is the job's
    assert PEFT_WARNING not in log, log[-3000:]
    assert PEFT_WARNING not in page.locator("[data-testid=stCode]").last.inner_text()

    for target, title in (("Replay", "Replay"), ("Dynamics", "Dynamics")):
        link = page.locator("[data-testid=stMain]").get_by_role(
            "link", name=re.compile(rf"\b{target}\b"))
        expect(link).to_have_count(1)
        href = link.get_attribute("href")
        assert f"run={run_id}" in href, href
        if target == "Dynamics":
            link.click()
            page.get_by_role("heading", name=title, exact=True).wait_for(timeout=60_000)
            settle(page)
            picker = page.locator('[data-testid="stSidebar"]').get_by_role("combobox", name="Run")
            assert picker.input_value().startswith("clarity-job"), picker.input_value()
            assert f"run={run_id}" in page.url
    no_exception(page)
