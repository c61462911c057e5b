"""Failures and Compare for an analyst on the sample runs, in a real headless Chromium at 1400 x 900
(Debian's package through playwright), issue #35 part 7:

* a filtered view is a link: the filters live in the URL, a pasted link opens them, a change
  writes them back;
* export writes exactly the trajectories the filters match, all of them (not only the 500 rows
  the table shows);
* the filters sit under a heading of their own above the clusters, not under the
  cluster-members table, where they looked as if they filtered it;
* solved trajectories are not a bar of "Failed trajectories per class", and branch
  continuations are left out of the counts and of the table by default;
* a cluster job whose texts were all cached says so (it said "0 of 0 texts embedded");
* the SQL box lists every table's columns;
* Compare's task picker marks gained and lost tasks.

Run alone: ``.venv/bin/python -m pytest -q tests/test_browser_failures_filters.py``.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse

import pytest

from pages import _clusterjob
from storage import queries
from tests.app_fixtures import RUN_NAMES, make_demo_store
from tests.browser_harness import ROOT, browser_fixtures, scratch_dir, served_app
from tests.test_browser import no_exception, settle

pytestmark = pytest.mark.browser
LAKE = ("sample_runs/branch_failures.duckdb", "20261203-233011-02a957")
"""FrozenLake run with a branch analysis: 512 continuations (split 'branch') among its rows."""
BANDIT = ("sample_runs/collapse_bandit.duckdb", "20261130-001943-c1079a")
"""GRPO's collapse run: more failures than the table's 500 rows."""
SEARCH = ("sample_runs/search_smollm2.duckdb", "20261129-233052-4ded2d")


@pytest.fixture(scope="module")
def server():
    """(base URL, runs dir, demo store, {run name: id}) of an app serving the sample runs and a
    demo store of this module's own."""
    base = scratch_dir("browser-failures-filters")
    runs, stores = base / "runs", base / "stores"
    (ROOT / runs / "logs").mkdir(parents=True)
    (ROOT / stores).mkdir(parents=True)
    demo = stores / "demo.duckdb"
    names = dict(zip(RUN_NAMES, make_demo_store(ROOT / demo)))
    with served_app(base, ["sample_runs", stores], runs) as url:
        yield url, runs, str(demo), names


browser, page = browser_fixtures(1400, 900)


def goto(page, url: str, path: str, title: str, store: str, run: str, **params) -> None:
    query = urllib.parse.urlencode({"store": store, "run": run, **params}, doseq=True)
    page.goto(f"{url}/{path}?{query}")
    page.get_by_role("heading", name=title, exact=True).first.wait_for(timeout=60_000)
    settle(page)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stSkeleton\"]')", timeout=30_000)
    page.wait_for_timeout(1000)          # tables and charts draw after the script has run


def match_count(page) -> int:
    note = page.get_by_text(re.compile(r"^\d+ trajectories match")).first
    return int(note.inner_text().split()[0])


def url_params(page) -> dict:
    return urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)


def doc_y(locator) -> float:
    return locator.evaluate("e => e.getBoundingClientRect().top + scrollY")


def chart(page, key: str) -> dict:
    """A plotly chart's drawn traces and title, read from the browser's figure."""
    plot = page.locator(f".st-key-{key} .js-plotly-plot")
    plot.wait_for(state="attached", timeout=30_000)
    # _fullData: the traces as drawn, numbers decoded from plotly's binary encoding
    return plot.evaluate("p => ({data: p._fullData.map(t => ({x: Array.from(t.x || []),"
                         " y: Array.from(t.y || []), name: t.name})),"
                         " title: p._fullLayout.title && p._fullLayout.title.text})")


# -- the tests -------------------------------------------------------------------------------------
def test_a_filtered_view_is_a_link_and_a_change_is_written_to_it(page, server):
    url = server[0]
    store, run = LAKE
    goto(page, url, "failures", "Failures", store, run, classes=["unsolved"],
         outcome="failed", q="Up")
    want = queries.count_trajectories(store, run, text="Up", classes=["unsolved"],
                                      splits=["sft", "train"], success=False)
    assert 0 < want < 50
    assert match_count(page) == want
    assert page.locator(".st-key-fail_search input").input_value() == "Up"
    assert page.get_by_role("radio", name="failed").is_checked()
    picked = page.locator(".st-key-fail_classes").inner_text()
    assert "unsolved" in picked and "format_error" not in picked
    box = page.locator(".st-key-fail_search input")
    box.fill("Down")
    box.press("Enter")
    settle(page)
    params = url_params(page)
    assert params["q"] == ["Down"] and params["outcome"] == ["failed"]
    assert params["classes"] == ["unsolved"]
    # back to a default: out of the URL
    page.get_by_role("radio", name="any").check(force=True)
    settle(page)
    assert "outcome" not in url_params(page)
    no_exception(page)


def test_export_writes_exactly_the_matches(page, server):
    url = server[0]
    store, run = LAKE
    goto(page, url, "failures", "Failures", store, run, classes=["unsolved"], q="Up")
    shown = match_count(page)
    with page.expect_download(timeout=60_000) as got:
        page.get_by_role("button", name="Export matches as JSONL").click()
    lines = [json.loads(x) for x in open(got.value.path(), encoding="utf-8").read().splitlines()]
    assert len(lines) == shown
    assert {r["failure_class"] for r in lines} == {"unsolved"}
    assert all(any("Up" in (t["action"] or "") + (t["observation"] or "") for t in r["turns"])
               for r in lines)
    no_exception(page)


def test_export_writes_every_match_past_the_rows_shown(page, server):
    url = server[0]
    store, run = BANDIT
    goto(page, url, "failures", "Failures", store, run)
    classes = set(queries.failure_counts(store, run)["failure_class"]) - {"success"}
    total = queries.count_trajectories(store, run, classes=sorted(classes))
    assert total > 500
    assert match_count(page) == total
    page.get_by_text(re.compile(r"first 500 shown; export writes all")).first.wait_for()
    with page.expect_download(timeout=120_000) as got:
        page.get_by_role("button", name="Export matches as JSONL").click()
    lines = open(got.value.path(), encoding="utf-8").read().splitlines()
    assert len(lines) == total
    no_exception(page)


def test_filters_have_a_heading_of_their_own_above_the_clusters(page, server):
    url = server[0]
    store, run = SEARCH
    goto(page, url, "failures", "Failures", store, run)
    main = page.locator("[data-testid=stMain]")
    heading = doc_y(main.get_by_role("heading", name="Find trajectories"))
    filters = doc_y(page.locator(".st-key-fail_classes"))
    table = doc_y(page.locator(".st-key-fail_results"))
    clusters = doc_y(main.get_by_role("heading", name="Clusters of similar failures"))
    members = page.locator(".st-key-cluster_members")
    assert heading < filters < table < clusters, (heading, filters, table, clusters)
    if members.count():
        assert doc_y(members) > table
    no_exception(page)


def test_solved_is_no_bar_and_branch_continuations_are_not_counted(page, server):
    url = server[0]
    store, run = LAKE
    goto(page, url, "failures", "Failures", store, run)
    counts = queries.failure_counts(store, run)
    own = counts[counts["split"] != "branch"]
    per_class = chart(page, "fail_per_class")
    classes = [y for trace in per_class["data"] for y in trace["y"]]
    assert "success" not in classes
    failed = own[own["failure_class"] != "success"]
    assert sum(x for trace in per_class["data"] for x in trace["x"]) == failed["n"].sum()
    solved = int(own[own["failure_class"] == "success"]["n"].sum())
    assert f"({solved} solved not drawn)" in per_class["title"]
    per_step = chart(page, "fail_per_step")
    assert sum(x for trace in per_step["data"] for x in trace["y"]) == own["n"].sum()
    branch = int(counts[counts["split"] == "branch"]["n"].sum())
    page.get_by_text(re.compile(rf"{branch} trajectories of other splits")).wait_for()
    picked = page.locator(".st-key-fail_splits").inner_text()
    assert "branch" not in picked and "train" in picked
    assert match_count(page) == int(failed["n"].sum())
    no_exception(page)


def test_a_cluster_job_on_cached_texts_says_so(page, server):
    url, runs, demo, names = server
    run = names["demo-search-starpo"]
    stem = _clusterjob._stem(demo, run)
    # a process that looks like the job (its command line names core.clusters), in the state
    # the job writes when every text was cached: nothing left to embed
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                                "core.clusters"])
    try:
        logs = ROOT / runs / "logs"
        (logs / f"{stem}.job").write_text(json.dumps({"pid": sleeper.pid, "store": demo,
                                                      "run_id": run}))
        (logs / f"{stem}.json").write_text(json.dumps({"phase": "embedding", "done": 0,
                                                       "total": 0, "cached": 35}))
        goto(page, url, "failures", "Failures", demo, run)
        page.get_by_text("All 35 texts already embedded (cached)", exact=False).wait_for(
            timeout=30_000)
        assert page.get_by_text("0 of 0", exact=False).count() == 0
    finally:
        sleeper.kill()
        sleeper.wait()
    no_exception(page)


def test_the_sql_box_lists_each_tables_columns(page, server):
    url, _, demo, names = server
    goto(page, url, "failures", "Failures", demo, names["demo-search-starpo"])
    # a tab drawn only when open: the SQL box costs browser time on every load
    assert page.get_by_text(re.compile(r"^Tables and their columns")).count() == 0
    page.get_by_role("tab", name="SQL (read-only)").click()
    page.get_by_text(re.compile(r"^Tables and their columns \(\d+ tables\)")).wait_for()
    page.locator("[data-testid=stMain] [data-testid=stCode]", has_text="trajectories:").first \
        .wait_for(timeout=30_000)
    listing = "\n".join(page.locator("[data-testid=stMain] [data-testid=stCode]").all_inner_texts())
    assert "trajectories: run_id VARCHAR, step INTEGER, traj_id VARCHAR" in listing
    assert "turns: run_id VARCHAR" in listing and "failure_class VARCHAR" in listing
    no_exception(page)


def test_compare_task_picker_marks_gained_and_lost_tasks(page, server):
    """The picker lists gained and lost tasks first, each option marked with its change: the
    default pick is the first gained task, and a task that did not change says so."""
    from storage import evaldiff
    url = server[0]
    store, run = SEARCH
    paired = evaldiff.diff(store, (run, 20), (run, 30))["paired"]
    marks = {"gained": "▲ gained", "lost": "▼ lost", "kept": "solved in both",
             "unsolved": "solved in neither"}
    picker = page.locator("[data-testid=stMain]").get_by_role("combobox", name="Task")
    goto(page, url, "compare", "Compare", store, run, a=f"{run}:20", b=f"{run}:30")
    first = paired[paired["change"] == "gained"]["task_id"].iloc[0]
    assert picker.input_value() == f"▲ gained · {first}"
    for change in ("kept", "unsolved"):
        task = paired[paired["change"] == change]["task_id"].iloc[0]
        goto(page, url, "compare", "Compare", store, run, a=f"{run}:20", b=f"{run}:30", task=task)
        assert picker.input_value() == f"{marks[change]} · {task}"
    no_exception(page)


def test_the_bandits_failures_are_not_said_to_have_skipped_a_search(page, server):
    """The bandit has no search to skip: its missed pulls are wrong answers."""
    url = server[0]
    store, run = BANDIT
    goto(page, url, "failures", "Failures", store, run)
    per_class = chart(page, "fail_per_class")
    classes = {y for trace in per_class["data"] for y in trace["y"]}
    assert classes == {"wrong_answer", "format_error"}, classes
    assert "answered_without_search" not in page.locator(".st-key-fail_classes").inner_text()
    no_exception(page)
