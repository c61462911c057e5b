"""Pages that explain themselves, as a newcomer meets them in a real headless Chromium (issue 51,
item 4): each page opens with what it shows and what healthy looks like; a term there links to
its Glossary anchor, and following the link lands on that entry with its definition in view.
(Dynamics' x ranges: tests/test_browser_dynamics.py.)

Run alone: ``.venv/bin/python -m pytest -q tests/test_browser_glossary.py``.
"""
from __future__ import annotations

import urllib.parse

import pytest

from pages import _terms
from tests.browser_harness import ROOT, browser_fixtures, scratch_dir, served_app
from tests.test_browser import no_exception, settle

pytestmark = pytest.mark.browser
STORE, RUN = "sample_runs/search_smollm2.duckdb", "20261129-233052-4ded2d"
QUERY = urllib.parse.urlencode({"store": STORE, "run": RUN})
PAGES = {"runs": "Runs", "replay": "Replay", "groups": "Groups", "dynamics": "Dynamics",
         "failures": "Failures", "compare": "Compare", "train": "Train"}


@pytest.fixture(scope="module")
def server():
    base = scratch_dir("browser-glossary")
    (ROOT / base).mkdir(parents=True)
    with served_app(base, ["sample_runs"], base / "runs") as url:
        yield url


browser, page = browser_fixtures(1280, 900)


def _open(page, url: str, path: str, title: str) -> None:
    query = urllib.parse.urlencode({"store": STORE, "run": RUN})
    page.goto(f"{url}/{path}?{query}")
    page.get_by_role("heading", name=title, exact=True).first.wait_for(timeout=60_000)
    settle(page)


def test_every_page_says_what_it_shows_and_links_its_terms(page, server):
    for path, title in PAGES.items():
        _open(page, server, path, title)
        intro = page.locator(".st-key-page_intro")
        intro.wait_for(timeout=30_000)
        text = intro.inner_text()
        assert "Healthy:" in text and text.startswith(_terms.INTROS[path][0][:40]), path
        hrefs = [a.get_attribute("href") for a in intro.locator("a").all()]
        assert hrefs == [f"glossary?{QUERY}#{a}" for a in _terms.INTROS[path][1]], (path, hrefs)
        no_exception(page)


def test_a_term_link_lands_on_its_definition(page, server):
    _open(page, server, "replay", "Replay")
    link = page.locator(".st-key-page_intro a", has_text="Advantage")
    href = link.get_attribute("href")
    assert href == f"glossary?{QUERY}#advantage"
    page.goto(f"{server}/{href}")          # as the browser resolves the page's relative link
    entry = page.locator("#advantage")
    entry.wait_for(timeout=60_000)
    settle(page)
    assert entry.inner_text().strip() == "Advantage"
    definition = page.get_by_text("How much better a trajectory did than the baseline")
    definition.wait_for(timeout=10_000)
    assert "A = (r − mean_g) / (std_g + 1e-6)" in definition.inner_text()
    box, view = entry.bounding_box(), page.viewport_size
    assert 0 <= box["y"] < view["height"], box      # the page scrolled to the entry
    no_exception(page)


def test_a_clicked_term_link_keeps_its_anchor_and_the_run(page, server):
    """Streamlit opens a markdown link in a new tab, a new session: the link carried no run, so
    that tab showed the newest run in the sidebar, and writing it into the address dropped the
    ``#anchor`` (the entry was not scrolled to)."""
    _open(page, server, "replay", "Replay")
    shown = page.locator('[data-testid="stSidebar"]').get_by_role("combobox", name="Run")
    run_label = shown.input_value()
    with page.context.expect_page() as opened:
        page.locator(".st-key-page_intro a", has_text="V / Q (branches)").click()
    tab = opened.value
    try:
        tab.get_by_role("heading", name="Glossary", exact=True).first.wait_for(timeout=60_000)
        settle(tab)
        assert tab.url.endswith("#value-q") and f"run={RUN}" in tab.url, tab.url
        picker = tab.locator('[data-testid="stSidebar"]').get_by_role("combobox", name="Run")
        assert picker.input_value() == run_label
        entry = tab.locator("#value-q")
        box, view = entry.bounding_box(), tab.viewport_size
        assert 0 <= box["y"] < view["height"], box         # the page scrolled to the entry
        no_exception(tab)
    finally:
        tab.close()
