"""The app served by `streamlit run`, driven by a real headless Chromium (Debian's package through
playwright's sync API): every page loads, a replay steps through turns, a gradient spike opens
its trajectories, hostile text stays text, and a tiny training job launched from the Train page
shows its progress.

Screenshots of every page go to ``$AGENTRL_SCREENSHOTS`` (e.g. docs/screenshots) when it is set,
else to a temporary directory. Run alone: ``.venv/bin/python -m pytest -q -m browser``.
"""
from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from storage import queries
from tests.app_fixtures import SCRIPT_TEXT, SCRIPT_TRAJ, SPIKE_STEP, SPIKE_TRAJ, make_demo_store
from tests.browser_harness import ROOT, fill_until_held, launched_browser, new_page, scratch_dir
from tests.browser_harness import served_app
# Re-exported: bench/pages.py and docs/screenshots.py serve and drive the app with these.
from tests.browser_harness import CHROMIUM, CHROMIUM_ARGS, start_app, stop_app  # noqa: F401
from tests.browser_harness import _free_port, _wait_healthy  # noqa: F401

pytestmark = pytest.mark.browser
PAGES = {"": "Runs", "replay": "Replay", "groups": "Groups", "dynamics": "Dynamics",
         "failures": "Failures", "train": "Train"}


@pytest.fixture(scope="module")
def server():
    """(base URL, demo store path, {name: run_id}, runs dir) of a served app on the demo store."""
    base = scratch_dir("browser")
    stores, runs = base / "stores", base / "runs"
    (ROOT / stores).mkdir(parents=True)
    ids = make_demo_store(ROOT / stores / "demo.duckdb")
    names = dict(zip(["demo-search-starpo", "demo-apps-rloo", "imported-verl", "crashed-run"], ids))
    with served_app(base, [stores, runs], runs) as url:
        try:
            yield url, str(stores / "demo.duckdb"), names, ROOT / runs
        finally:
            _stop_job(ROOT / runs)


def _stop_job(runs: Path) -> None:
    """Never leave a launched trainer behind."""
    try:
        pid = json.loads((runs / "job.json").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return
    for sig in (signal.SIGINT, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not _gone(pid):
            time.sleep(0.1)
        if _gone(pid):
            return


def _gone(pid: int) -> bool:
    """The process has exited (an exited child its parent has not reaped yet counts)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    return state in ("Z", "X")


@pytest.fixture(scope="module")
def browser(server):
    with launched_browser() as b:
        yield b


@pytest.fixture
def page(browser):
    with new_page(browser, 1400, 2400) as pg:
        pg.dialogs = []
        pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
        yield pg


KEEP_SHOTS = bool(os.environ.get("AGENTRL_SCREENSHOTS"))
"""Screenshots kept (docs/screenshots) wait for lazy tables and charts to draw; throwaway ones
are still taken (the page must render to an image) without that wait."""


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    target = os.environ.get("AGENTRL_SCREENSHOTS")
    path = Path(target) if target else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def open_page(page, server, path: str, title: str, **params) -> None:
    url, store, names, _ = server
    query = {"store": store, "run": names["demo-search-starpo"], **params}
    page.goto(f"{url}/{path}?{urllib.parse.urlencode(query)}")
    page.get_by_role("heading", name=title, exact=True).first.wait_for(timeout=60_000)
    settle(page)


def settle(page, quiet_ms: int = 800) -> None:
    """Wait until the app has stopped running its script.

    Streamlit's status widget only appears once a run has lasted 500 ms, so its absence alone
    does not say a run is over; the app's root element carries the run state itself. Neither
    can tell that a run requested by the last click has not started yet: the quiet time covers
    that, and waits that matter are on what the page shows."""
    page.wait_for_timeout(quiet_ms)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]') && document"
        ".querySelector('[data-testid=\"stApp\"]')?.dataset.testScriptState === 'notRunning'",
        timeout=60_000)


def snap(page, path: Path, draw_ms: int = 2000) -> None:
    """A screenshot once the browser has drawn everything (tables and charts render lazily:
    ``draw_ms`` more after the last skeleton is gone)."""
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stSkeleton\"]')", timeout=30_000)
    page.wait_for_timeout(draw_ms)
    page.screenshot(path=str(path))


def shot(page, path: Path) -> None:
    """``snap`` for a test: the drawing wait only where the screenshot is kept (KEEP_SHOTS)."""
    snap(page, path, draw_ms=2000 if KEEP_SHOTS else 0)


def no_exception(page) -> None:
    errors = page.locator('[data-testid="stException"]')
    assert errors.count() == 0, errors.first.inner_text()


# -- the tests (in this order: the first one is the server's first request) ------------------------
def test_first_request_deep_link_and_hostile_text(page, server, shots):
    open_page(page, server, "replay", "Replay", step=4, traj=SCRIPT_TRAJ, turn=0)
    page.get_by_text(SCRIPT_TEXT, exact=False).first.wait_for(timeout=30_000)   # shown as text
    page.locator(".token-view").wait_for(timeout=30_000)
    no_exception(page)
    picker = page.locator('[data-testid="stSidebar"]').get_by_role("combobox", name="Run")
    label = r"demo-search-starpo · \d{4}-\d\d-\d\d \d\d:\d\d · [0-9a-f]{6} · finished"
    assert re.fullmatch(label, picker.input_value())                           # app.py's picker
    assert page.locator(".token-view script, .token-view img, .token-view b").count() == 0
    assert page.locator("script:text('alert(1)')").count() == 0
    page.wait_for_timeout(500)
    assert page.dialogs == []                                                   # nothing ran
    shot(page, shots / "replay-hostile-text.png")


@pytest.mark.parametrize("path,title", list(PAGES.items()))
def test_every_page_loads(page, server, shots, path, title):
    started = time.monotonic()
    open_page(page, server, path, title, step=4)
    no_exception(page)
    print(f"{title}: loaded in {time.monotonic() - started:.1f} s")
    shot(page, shots / f"{path or 'runs'}.png")


def test_replay_steps_through_turns(page, server):
    open_page(page, server, "replay", "Replay", step=4, traj=SCRIPT_TRAJ, turn=0)
    page.get_by_text("Turn 0 of 2").wait_for()       # numbered from 0, as the slider and links
    page.get_by_role("button", name="Next ▶").click()
    page.get_by_text("Turn 1 of 2").wait_for(timeout=20_000)
    settle(page)
    assert "turn=1" in page.url                      # the view is in the address bar
    page.get_by_role("button", name="◀ Prev").click()
    page.get_by_text("Turn 0 of 2").wait_for(timeout=20_000)
    page.get_by_text("Play (advance one turn per second)").click()   # play mode: no more clicks
    page.get_by_text("Turn 1 of 2").wait_for(timeout=20_000)
    no_exception(page)


def test_spike_opens_its_trajectories(page, server, shots):
    open_page(page, server, "dynamics", "Dynamics")
    link = page.get_by_role("link", name=f"Replay {SPIKE_TRAJ} (grad norm 4)")
    link.wait_for(timeout=30_000)
    page.get_by_role("heading", name="Gradient norm and spikes").evaluate(
        "e => e.scrollIntoView({block: 'start'})")
    shot(page, shots / "dynamics-spike.png")
    link.click()
    page.get_by_role("heading", name="Replay", exact=True).wait_for(timeout=30_000)
    settle(page)
    assert f"traj={SPIKE_TRAJ}" in page.url and f"step={SPIKE_STEP}" in page.url
    assert page.get_by_role("combobox", name="Trajectory").input_value() == SPIKE_TRAJ
    no_exception(page)


@functools.cache
def _trainer_available() -> bool:
    """Whether ``python -m core.train --help`` works (asked once per process)."""
    try:
        done = subprocess.run([sys.executable, "-m", "core.train", "--help"], cwd=ROOT,
                              capture_output=True, timeout=180)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def test_launch_a_tiny_job_and_watch_its_progress(page, server, shots):
    """Every wait here is on a state that stays once reached (a recorded step, an ended job):
    a tiny step can take under the panel's 2 s refresh on an idle machine, and far longer on a
    loaded one, so a text shown only while one step runs may never be seen."""
    if not _trainer_available():
        pytest.skip("`python -m core.train --help` does not work here: no trainer to launch")
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect
    url, _, _, runs = server
    open_page(page, server, "train", "Train")
    page.get_by_role("combobox", name="Preset").click()
    page.get_by_role("option", name="tiny-smoke").click()
    # the preset reaches the form in a rerun: launching before it lands would submit the
    # previous preset's values (a 40-step bandit job)
    for label, value in (("Group size G", "2"), ("Tasks per step", "2"), ("Max turns", "2")):
        expect(page.get_by_role("spinbutton", name=label)).to_have_value(value, timeout=60_000)
    expect(page.get_by_role("combobox", name="Environment")).to_have_value("search")
    # three RL steps: a Stop pressed while step 1 is shown lands in the trainer's loop,
    # whatever the machine's speed
    fill_until_held(page.get_by_role("spinbutton", name="RL steps"), "3")
    fill_until_held(page.get_by_role("textbox", name="Run name"), "browser-job")
    page.get_by_role("button", name="Launch training").click()
    page.get_by_text("Started job").wait_for(timeout=120_000)
    expect(page.get_by_text(re.compile(r"^step \d+ of \d+"))).to_have_text(
        re.compile(r"^step \d+ of 3\b"), timeout=60_000)     # the form's values were launched
    # the fragment refreshes by itself: the progress text moves without any click
    progress = page.get_by_text(re.compile(r"^step [123] of 3 · run "))
    progress.wait_for(timeout=300_000)
    job_line = page.get_by_text(re.compile(r"pid \d+ · (running|ended)"))
    stopped = False
    if re.match(r"step 1 of 3 · run running", progress.inner_text()) and \
            "running" in job_line.inner_text():
        page.get_by_role("button", name="Stop after the current step").click(timeout=60_000)
        stopped = True                               # SIGINT: the trainer ends after its step
    shot(page, shots / "train-job.png")
    try:
        page.get_by_text(re.compile(r"pid \d+ · ended")).wait_for(timeout=300_000)
    except PlaywrightTimeout:
        raise AssertionError("the job did not end; its log:\n"
                             + page.locator("code").last.inner_text()) from None
    run = queries.runs(str(runs / "store.duckdb"))
    assert run["name"].tolist() == ["browser-job"]
    config = json.loads(run["config"].iloc[0])
    assert (config["env"], config["model"], config["steps"]) == ("search", "tiny", 3)
    status, last = run["status"].iloc[0], run["last_step"].iloc[0]
    if stopped:
        # Step 1 is shown once its rows are recorded, while the trainer may still be saving its
        # checkpoint: a Stop then ends the run after step 1; pressed later, after step 2 or 3.
        # Either way every recorded step is whole (its trajectories and metrics), none cut.
        # A tiny step can take under a second: the three steps may all be done before the
        # SIGINT lands, and the run then ends finished at step 3, which is as right.
        assert (status == "stopped" and last in (1, 2, 3)) or (status, last) == ("finished", 3), \
            (status, last)
        recorded = queries.steps(str(runs / "store.duckdb"), run["run_id"].iloc[0])
        by_step = dict(zip(recorded["step"].astype(int), recorded["trajectories"]))
        assert all(by_step.get(s, 0) >= 4 for s in range(1, last + 1)), by_step  # G=2 x 2 tasks
        assert max(by_step) <= last, by_step
    else:
        assert status == "finished" and last == 3, (status, last)
    # the sidebar follows the new run (issue 51.9): every page now opens on it
    expect(page.get_by_role("combobox", name="Run")).to_have_value(
        re.compile(r"^browser-job · "), timeout=60_000)
    assert f"run={run['run_id'].iloc[0]}" in page.url
    assert "tie_word_embeddings" not in page.locator("code").last.inner_text()  # no peft warning
    no_exception(page)
