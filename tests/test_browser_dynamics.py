"""The Dynamics page read as one picture in a 1280 x 900 window, in a real headless Chromium
(Debian's package through playwright): every step-axis chart starts at its own data's first step
and ends at the run's last, and charts of a column with one range put a step at the same pixel;
every legend lies whole inside its chart and off the plot (also in an 800 px window); the KL chart
says, under it, what it was measured against; the sidebar's step is drawn on every chart and
follows the picker, which pages showing whole runs hide (keeping its value).
tests/test_pages_dynamics.py checks the same through AppTest.

Run alone: ``.venv/bin/python -m pytest -q tests/test_browser_dynamics.py``.
"""
from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

import pytest

from storage.recorder import Recorder
from tests.app_fixtures import RUN_NAMES, make_demo_store
from tests.browser_harness import ROOT, browser_fixtures, scratch_dir, served_app
from tests.test_browser import no_exception, settle

pytestmark = pytest.mark.browser
WIDTH, HEIGHT = 1280, 900
# SFT steps 1-20, then one RL step (21): most of its curves hold only step 21.
SAMPLE_STORE, SAMPLE_RUN = "sample_runs/search_smollm2.duckdb", "20261129-215645-4187b5"


def _sft_reference_run(path: Path) -> str:
    """A run recorded with the KL reference this trainer uses now (the adapter after SFT)."""
    rec = Recorder(path)
    run_id = rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo", "sft_steps": 3,
                            "kl_reference": "sft", "kl_coef": 0.001}, name="kl-after-sft")
    for step in range(1, 4):
        rec.record_step(step, metrics={"sft/loss": 1.0 / step})
    for step in range(4, 9):
        rec.record_step(step, metrics={"reward/mean": 0.1 * step, "policy/kl": 0.01 * step,
                                       "policy/approx_kl": 0.001, "grad/norm": 0.3})
    rec.finish("finished")
    return run_id


@pytest.fixture(scope="module")
def server():
    """(base URL, demo store, {run name: run_id}) of an app serving the sample runs and a store
    holding the demo runs (tests/app_fixtures.py) and one run with kl_reference = sft."""
    base = scratch_dir("browser-dynamics")
    stores = base / "stores"
    (ROOT / stores).mkdir(parents=True)
    store = stores / "demo.duckdb"
    runs = dict(zip(RUN_NAMES, make_demo_store(ROOT / store)))
    runs["kl-after-sft"] = _sft_reference_run(ROOT / store)
    with served_app(base, ["sample_runs", stores], base / "runs") as url:
        yield url, str(store), runs


browser, page = browser_fixtures(WIDTH, HEIGHT)


def goto(page, url: str, path: str, title: str, **params) -> None:
    page.goto(f"{url}/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else ""))
    page.get_by_role("heading", name=title, exact=True).first.wait_for(timeout=60_000)
    settle(page)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stSkeleton\"]')", timeout=30_000)
    page.wait_for_timeout(1500)          # charts draw after the script has run


# Per plotly chart of the page: its title, the container's box, the x axis's range and title,
# the plot area's box, the page x of two steps, the legend's box, its items' boxes and whether it
# scrolls, and the x of each shape (plotly's own layout objects, as drawn).
CHARTS_JS = """(steps) => [...document.querySelectorAll('[data-testid=stPlotlyChart]')].map(ch => {
    const box = e => { const r = e.getBoundingClientRect();
                       return [r.left, r.top, r.right, r.bottom]; };
    const gd = ch.querySelector('.js-plotly-plot');
    const L = gd._fullLayout, x = L.xaxis;
    const plot = gd.querySelector('.nsewdrag');
    const left = gd.getBoundingClientRect().left + L._size.l;
    const legend = gd.querySelector('.legend');
    const bar = legend && legend.querySelector('.scrollbar');
    return {title: L.title && L.title.text, chart: box(ch), range: x.range,
            x_title: x.title && x.title.text, plot: plot && box(plot),
            at: steps.map(s => left + x.l2p(s)),
            legend: legend && box(legend),
            items: legend ? [...legend.querySelectorAll('.traces')].map(box) : [],
            scrolls: !!(bar && +bar.getAttribute('height') > 0),
            shapes: (L.shapes || []).map(s => [s.x0, s.x1])};
})"""


def step_charts(page, steps=(0, 1)) -> list[dict]:
    charts = page.evaluate(CHARTS_JS, list(steps))
    return [c for c in charts if c["x_title"] == "step"]


def _inside(inner, outer, tol=1.0) -> bool:
    return (inner[0] >= outer[0] - tol and inner[1] >= outer[1] - tol
            and inner[2] <= outer[2] + tol and inner[3] <= outer[3] + tol)


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


# -- x ranges --------------------------------------------------------------------------------------
def test_step_charts_start_at_their_data_and_end_together(page, server):
    """SFT steps 1-20, then RL step 21: every chart ends at step 21 (+ a margin), the SFT loss
    starts at step 1 and the reward at 21 (issue 51: not a chart mostly empty), and charts of a
    column with the same range put a step at the same pixel."""
    url, _, _ = server
    goto(page, url, "dynamics", "Dynamics", store=SAMPLE_STORE, run=SAMPLE_RUN, curves="all")
    charts = step_charts(page, steps=(1, 21))
    assert len(charts) >= 10, [c["title"] for c in charts]
    his = {round(c["range"][1], 6) for c in charts}
    assert len(his) == 1 and 21 < his.pop() < 22
    lo = {re.sub("<[^>]+>", "", c["title"] or ""): c["range"][0] for c in charts}  # <b>..</b>
    assert 20 < lo["Reward (mean ± std)"] < 21 and 0 < lo["SFT and value loss"] < 1, lo
    columns: dict[tuple, list[dict]] = {}
    for c in charts:                     # the charts of a column with one range
        key = (round(c["chart"][0]), round(c["chart"][2]), round(c["range"][0], 6))
        columns.setdefault(key, []).append(c)
    assert max(len(c) for c in columns.values()) >= 2, columns.keys()
    for column in columns.values():
        for c in column:                 # step 21 at the same pixel in each chart
            assert abs(c["at"][1] - column[0]["at"][1]) <= 1, (c["title"], column[0]["title"])
    no_exception(page)


# -- legends ---------------------------------------------------------------------------------------
# 1280: a laptop; 800: a window beside an editor, where the right-hand legends of before covered
# the plot (a 64 px plot under a 179 px legend on the sample search run's reward chart). At 1280
# they fitted, with no pixel to spare: the reward legend's right edge was the chart's.
@pytest.mark.parametrize("which,width", [("demo", WIDTH), ("sample", WIDTH), ("sample", 800)])
def test_every_legend_is_whole_inside_its_chart(page, server, which, width):
    url, store, runs = server
    page.set_viewport_size({"width": width, "height": HEIGHT})
    if which == "demo":   # the most legend entries: three clip fractions, alarm lines, a band
        goto(page, url, "dynamics", "Dynamics", store=store, run=runs["demo-search-starpo"])
    else:
        goto(page, url, "dynamics", "Dynamics", store=SAMPLE_STORE, run=SAMPLE_RUN)
    charts = [c for c in step_charts(page) if c["legend"]]
    assert len(charts) >= 5
    for c in charts:
        assert _inside(c["legend"], c["chart"]), (c["title"], c["legend"], c["chart"])
        for item in c["items"]:
            assert _inside(item, c["chart"]), (c["title"], item, c["chart"])
        assert not c["scrolls"], f"{c['title']}: the legend scrolls (entries hidden)"
        assert not _overlap(c["legend"], c["plot"]), (c["title"], c["legend"], c["plot"])
    no_exception(page)


# -- what KL is measured against -------------------------------------------------------------------
def _text_under_kl(page) -> str:
    """The text of the first caption below the KL chart, in the KL chart's column."""
    return page.evaluate("""() => {
        const kl = [...document.querySelectorAll('[data-testid=stPlotlyChart]')].find(ch =>
            ch.querySelector('.js-plotly-plot')._fullLayout.title.text.includes('KL (to the'));
        const r = kl.getBoundingClientRect();
        const below = [...document.querySelectorAll('[data-testid=stCaptionContainer]')]
            .filter(e => { const b = e.getBoundingClientRect();
                           return b.top >= r.bottom - 1 && b.left >= r.left - 1
                                  && b.right <= r.right + 1; })
            .sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top);
        return below.length ? below[0].textContent : '';
    }""")


def test_kl_chart_says_what_it_was_measured_against(page, server):
    url, store, runs = server
    goto(page, url, "dynamics", "Dynamics", store=SAMPLE_STORE, run=SAMPLE_RUN)
    text = _text_under_kl(page)
    assert "measured against the base model (LoRA adapters off)" in text, text
    assert "recorded before the reference became configurable" in text, text
    goto(page, url, "dynamics", "Dynamics", store=store, run=runs["kl-after-sft"])
    text = _text_under_kl(page)
    assert "a frozen copy of the LoRA adapter taken after the 3 SFT steps" in text, text
    no_exception(page)


# -- the sidebar's step ----------------------------------------------------------------------------
def _step_picker(page):
    return page.locator('[data-testid="stSidebar"]').get_by_role("combobox", name="Step")


def test_the_sidebar_step_is_marked_and_hidden_where_unused(page, server):
    url, store, runs = server
    run = runs["demo-search-starpo"]
    goto(page, url, "dynamics", "Dynamics", store=store, run=run, step=5)
    charts = step_charts(page)
    assert charts and all([5, 5] in c["shapes"] for c in charts), \
        {c["title"]: c["shapes"] for c in charts}
    picker = _step_picker(page)
    picker.click()
    page.get_by_role("option", name="8", exact=True).click()
    settle(page)
    page.wait_for_timeout(1500)
    charts = step_charts(page)
    assert all(c["shapes"] == [[8, 8]] for c in charts), {c["title"]: c["shapes"] for c in charts}
    sidebar = page.locator('[data-testid="stSidebar"]')
    for title in ("Runs", "Failures", "Train"):         # whole-run pages: no step picker
        sidebar.get_by_role("link", name=title, exact=True).click()
        page.get_by_role("heading", name=title, exact=True).first.wait_for(timeout=60_000)
        settle(page)
        assert _step_picker(page).count() == 0, title
    sidebar.get_by_role("link", name="Replay", exact=True).click()
    page.get_by_role("heading", name="Replay", exact=True).first.wait_for(timeout=60_000)
    settle(page)
    assert _step_picker(page).input_value() == "8"        # kept through the other pages
    no_exception(page)


# -- the first paint -------------------------------------------------------------------------------
COLLAPSE_STORE, COLLAPSE_RUN = "sample_runs/collapse_bandit.duckdb", "20261130-001943-c1079a"


def test_the_first_paint_draws_the_core_and_alarmed_curves_then_all_on_demand(page, server):
    """Walkthrough step 5's link: a page load's browser time grows with each chart, so the first
    paint draws reward, group std, success, KL and the curves an alarm points at (entropy, for
    this run's std+entropy alarms); 'All curves' draws every recorded one and puts curves=all in
    the address, so the link opens the same view."""
    url, _, _ = server
    goto(page, url, "dynamics", "Dynamics", store=COLLAPSE_STORE, run=COLLAPSE_RUN)
    first = [re.sub(r"<[^>]+>", "", c["title"]) for c in step_charts(page)]
    assert first[:4] == ["Reward (mean ± std)", "In-group reward std, zero-std groups", "Success",
                         "KL (to the reference; approx. to the sampler)"], first
    assert "Entropy" in first
    assert "Clip fraction" not in first and len(first) <= 7, first
    page.get_by_text("All curves", exact=False).first.click()
    settle(page)
    page.wait_for_function("n => document.querySelectorAll('[data-testid=stPlotlyChart]').length"
                           " > n", arg=len(first) + 1, timeout=30_000)
    every = [re.sub(r"<[^>]+>", "", c["title"]) for c in step_charts(page)]
    assert "Clip fraction" in every and set(first) <= set(every), every
    assert "curves=all" in page.url
    no_exception(page)
