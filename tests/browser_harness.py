"""How the browser tests serve the app and drive it: ``streamlit run app.py`` on a free local port
(``start_app``/``stop_app``; bench/pages.py and docs/screenshots.py use them too), the same around
a test module's own stores (``scratch_dir`` + ``served_app``), and Debian's headless Chromium
through playwright's sync API (``launched_browser``, ``new_page``).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError("streamlit did not become healthy")


def start_app(env: dict, log, script: str | Path = "app.py") -> tuple[subprocess.Popen, str]:
    """``streamlit run app.py`` (or ``script``) on a free local port with ``env``, once healthy:
    (process, URL). (bench/pages.py serves its store the same way.)"""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(script), "--server.port", str(port),
         "--server.headless", "true", "--server.address", "127.0.0.1",
         "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
    except BaseException:
        stop_app(proc)
        raise
    return proc, url


def stop_app(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def scratch_dir(name: str) -> Path:
    """``tmp/<name>-<pid>``, emptied, for a module's stores; skips the module without chromium.

    Under the project's ignored tmp/, named relative to the root: paths the pages show (and the
    screenshots keep) are then the project's own, not this machine's."""
    if not Path(CHROMIUM).exists():
        pytest.skip("no chromium browser installed (Debian package 'chromium')")
    base = Path("tmp") / f"{name}-{os.getpid()}"
    shutil.rmtree(ROOT / base, ignore_errors=True)
    return base


@contextmanager
def served_app(base: Path, store_dirs: Iterable[str | Path], runs_dir: str | Path) -> Iterator[str]:
    """The app's base URL, served with AGENTRL_STORE_DIRS = ``store_dirs`` and AGENTRL_RUNS_DIR =
    ``runs_dir`` (both relative to the root), its log in ``base``/server.log; on exit the app is
    stopped and ``base`` (which must exist) removed."""
    env = dict(os.environ, AGENTRL_STORE_DIRS=os.pathsep.join(str(d) for d in store_dirs),
               AGENTRL_RUNS_DIR=str(runs_dir), STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    log = open(ROOT / base / "server.log", "wb")
    proc = None
    try:
        proc, url = start_app(env, log)
        yield url
    finally:
        if proc is not None:
            stop_app(proc)
        log.close()
        shutil.rmtree(ROOT / base, ignore_errors=True)


@contextmanager
def launched_browser():
    """Debian's chromium, headless, through playwright."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@contextmanager
def new_page(browser, width: int, height: int):
    """A page in a fresh context of ``browser`` with a ``width`` x ``height`` viewport."""
    ctx = browser.new_context(viewport={"width": width, "height": height})
    yield ctx.new_page()
    ctx.close()


def browser_fixtures(width: int, height: int):
    """A module's ``browser`` (one Chromium for the module, launched once its ``server`` fixture
    is up) and ``page`` (a fresh ``width`` x ``height`` page per test) fixtures:
    ``browser, page = browser_fixtures(1280, 900)``."""
    @pytest.fixture(scope="module")
    def browser(server):
        with launched_browser() as b:
            yield b

    @pytest.fixture
    def page(browser):
        with new_page(browser, width, height) as pg:
            yield pg

    return browser, page


def fill_until_held(box, value: str, tries: int = 5) -> None:
    """Fill a form field until it holds ``value``: a rerun of the page (the preset landing) can
    rewrite the field between Playwright's select-all and its typing, leaving the old text with
    ours appended ('tiny-smoke-...browser-job'), so the value is read back, not assumed."""
    from playwright.sync_api import expect
    for _ in range(tries):
        box.fill(value)
        try:
            expect(box).to_have_value(value, timeout=3_000)
            box.page.wait_for_timeout(500)           # a late rerun would rewrite it within this
            if box.input_value() == value:
                return
        except AssertionError:
            pass
    raise AssertionError(f"the field kept {box.input_value()!r}, not {value!r}")
