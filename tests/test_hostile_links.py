"""No stored value becomes a link, an image or formatting, in the real browser: a store whose
identifiers (task_id, group_id, split, finish_reason, failure_class, action_type) hold URLs,
``www.`` hosts, e-mail addresses, markdown links, images and emphasis, opened on every page that
shows them; the anchors, images and bold/italic elements whose content comes from those values
are counted (GitHub-flavoured markdown autolinks bare URLs, ``www.`` and addresses, so escaping
brackets alone is not enough). Run alone: ``.venv/bin/python -m pytest -q tests/test_hostile_links.py``.
"""
from __future__ import annotations

import urllib.parse

import pytest

from storage import db
from tests.app_fixtures import RUN_NAMES, SCRIPT_TRAJ, make_demo_store
from tests.browser_harness import ROOT, launched_browser, new_page, scratch_dir, served_app
from tests.test_browser import settle

pytestmark = pytest.mark.browser
URL, WWW, MAIL = "https://evil.example/x", "www.evil.example", "a@evil.example"
IMAGE, LINK = "![i](http://evil.example/y.png)", "[t](http://evil.example/t)"
BOLD, EMPH = "**bold**", "_emph_"
HOSTILE = {   # column -> the value stored (ids keep their original text after it: still unique)
    "task_id": f"{URL} {EMPH} ", "group_id": f"{WWW} {BOLD} ", "split": f"{MAIL} {LINK}",
    "finish_reason": f"{IMAGE} {URL}", "failure_class": f"{LINK} {MAIL} {WWW}",
}
ACTION_TYPE = f"{URL} {MAIL} {BOLD}"
PAGES = [("", "Runs", {}), ("replay", "Replay", {"traj": SCRIPT_TRAJ}), ("groups", "Groups", {}),
         ("dynamics", "Dynamics", {}), ("failures", "Failures", {})]
COUNT_JS = """() => {
  const app = document.querySelector('[data-testid="stApp"]') || document;
  const from = (sel, test) => [...app.querySelectorAll(sel)].filter(test).map(e => e.outerHTML);
  return {
    anchors: from('a', a => /evil/i.test(a.getAttribute('href') || '') ||
                            /evil/i.test(a.textContent) || /^mailto:/i.test(a.href)),
    images: from('img', i => /evil/i.test(i.getAttribute('src') || '')),
    emphasis: from('strong, em, b, i', e => /^(bold|emph)$/.test(e.textContent.trim())),
    // the values are still shown, as text
    shown: (app.innerText.match(/evil[.]example/g) || []).length,
  };
}"""


@pytest.fixture(scope="module")
def hostile_app():
    """(base URL, store path, run id) of a served app on a store with hostile identifiers."""
    base = scratch_dir("hostile-links")
    stores = base / "stores"
    (ROOT / stores).mkdir(parents=True)
    path = ROOT / stores / "demo.duckdb"
    run = dict(zip(RUN_NAMES, make_demo_store(path)))["demo-search-starpo"]
    with db.writing(path) as con:
        sets = ", ".join(f"{col} = ? || {col}" if col.endswith("_id") else f"{col} = ?"
                         for col in HOSTILE)
        con.execute(f"UPDATE trajectories SET {sets} WHERE run_id = ?", [*HOSTILE.values(), run])
        con.execute("UPDATE turns SET action_type = ? WHERE run_id = ?", [ACTION_TYPE, run])
    with served_app(base, [stores], base / "runs") as url:
        yield url, str(stores / "demo.duckdb"), run


@pytest.fixture(scope="module")
def page(hostile_app):
    with launched_browser() as browser, new_page(browser, 1400, 2400) as pg:
        yield pg


@pytest.mark.parametrize("path,title,params", PAGES, ids=[p[1] for p in PAGES])
def test_no_stored_value_becomes_a_link_image_or_formatting(page, hostile_app, path, title,
                                                             params):
    url, store, run = hostile_app
    query = {"store": store, "run": run, "step": 4, **params}
    page.goto(f"{url}/{path}?{urllib.parse.urlencode(query)}")
    page.get_by_role("heading", name=title, exact=True).first.wait_for(timeout=60_000)
    settle(page)
    page.wait_for_timeout(1500)          # markdown, captions and metrics drawn
    assert page.locator('[data-testid="stException"]').count() == 0
    found = page.evaluate(COUNT_JS)
    assert found["anchors"] == [], found["anchors"]
    assert found["images"] == [], found["images"]
    assert found["emphasis"] == [], found["emphasis"]
    if path in ("replay", "groups"):     # the values are shown there, as plain text
        assert found["shown"] > 0
