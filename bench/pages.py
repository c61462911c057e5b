"""The dashboard in a browser on the large synthetic store: page load times and server memory.

    nice -n 15 .venv/bin/python bench/pages.py [--store FILE] [--steps 3125] [--repeats 5]
        [--pages runs,dynamics] [--watcher auto]

The store is bench/queries.py's (built by its builder when ``--store`` does not exist yet, so
both scripts can share one file). The app is served with ``streamlit run app.py`` exactly as
tests/test_browser.py serves it, showing that store alone (a private store directory holding a
link to it) and an empty runs directory (so the Train page shows no live job). A headless
Chromium (Debian's package, through playwright) then opens every page of app.py's navigation
by deep link (``?store=..&run=..&step=..``; Replay also names one trajectory) in rounds: round 1
is each page's first load on the fresh server (cold: imports, first queries, empty caches),
then ``--repeats`` warm rounds, the page order rotated each round so that load from other
processes hits every page alike.

One load is timed from ``page.goto`` until the page's title heading is drawn, the app reports
its script finished (the ``data-test-script-state`` of Streamlit's root element is
``notRunning``) and no element placeholder (``stSkeleton``) is left. Memory is the server
process's peak resident set (``VmHWM``) after all loads. Target: app memory <= 1 GB.

After the deep-link rounds, ``--repeats`` rounds of in-app page changes (a click on each page's
sidebar link, the browser keeping its loaded scripts, as a user moving between pages does) are
timed the same way.

Then, on Replay, ``--repeats`` changes of the token view's 'Colour by' and clicks on its
'Next'/'Prev' turn buttons are timed until the new legend / turn caption is drawn and the script
ended (target <= 0.5 s), and the server's CPU seconds over the whole benchmark are printed.
``--watcher`` overrides ``server.fileWatcherType`` (.streamlit/config.toml sets "none"), to
measure what watching the checkout costs.

``--walkthrough`` times instead every link of README's workshop walkthrough on the committed
sample stores (the app serving sample_runs/, as ``make run`` does): one cold round, then
``--repeats`` warm rounds, order rotated. There a load also waits until every plotly chart on the
page has drawn its SVG, since that is what a reader waits for. ``--load N`` runs N busy-looping
processes beside the app and the browser for the whole measurement (load N on top of what the
machine already runs), so that "<= 1 s warm at load 4" can be checked on any machine.
``--team`` serves the same links a second time from team-store copies of the sample stores
(storage/team_store.py, a SQLite catalog each, made under tmp/ on the first run and checked row
for row against their files), each round loading every link from both apps in turn. ``--floor``
adds bench/floor_app.py, a page that draws only its title: what any Streamlit page load costs
on the machine before a page draws anything of its own.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import queries as big_store  # noqa: E402  (the builder of bench/queries.py)
from storage import queries  # noqa: E402
from tests.browser_harness import CHROMIUM, CHROMIUM_ARGS, start_app, stop_app  # noqa: E402

LOADED_JS = """title => {
    const app = document.querySelector('[data-testid="stApp"]');
    const heading = [...document.querySelectorAll('h1')].some(h => h.innerText.trim() === title);
    return heading && app && app.dataset.testScriptState === 'notRunning'
        && !document.querySelector('[data-testid="stSkeleton"]');
}"""


CHARTS_DRAWN_JS = """title => {
    const app = document.querySelector('[data-testid="stApp"]');
    const heading = [...document.querySelectorAll('h1')].some(h => h.innerText.trim() === title);
    const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')];
    return heading && app && app.dataset.testScriptState === 'notRunning'
        && !document.querySelector('[data-testid="stSkeleton"]')
        && charts.every(c => c.querySelector('svg.main-svg'));
}"""
"""LOADED_JS, and every plotly chart drawn (the walkthrough mode's end of a load)."""


def app_pages() -> list[tuple[str, str]]:
    """(url path, title) of every page in app.py's navigation, in its order."""
    found = re.findall(r'st\.Page\("[^"]+", title="([^"]+)", url_path="([^"]+)"(, default=True)?',
                       (ROOT / "app.py").read_text())
    if not found:
        raise SystemExit("no st.Page(..., title=..., url_path=...) found in app.py")
    # Streamlit serves the default page at the root; its url_path answers 'Page not found'.
    return [("" if default else path, title) for title, path, default in found]


def kib(pid: int, field: str) -> int:
    """A ``VmRSS``/``VmHWM`` line of /proc/PID/status, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def browser_cpu() -> dict[int, float]:
    """CPU seconds so far of each Chromium process this script started (pid -> seconds)."""
    import psutil
    out = {}
    for child in psutil.Process().children(recursive=True):
        try:
            if "chrom" in child.name():
                t = child.cpu_times()
                out[child.pid] = t.user + t.system
        except psutil.Error:
            continue
    return out


def load(page, url: str, title: str, timeout_s: float, done_js: str = LOADED_JS) -> float:
    """Open ``url``; seconds until the page titled ``title`` has rendered and its script ended
    (``done_js`` true)."""
    t0 = time.perf_counter()
    page.goto(url, wait_until="commit", timeout=timeout_s * 1e3)
    page.wait_for_function(done_js, arg=title, polling=20, timeout=timeout_s * 1e3)
    elapsed = time.perf_counter() - t0
    errors = page.locator('[data-testid="stException"]')
    if errors.count():
        raise RuntimeError(f"{title}: the page raised: {errors.first.inner_text()[:500]}")
    return elapsed


STEP_DONE_JS = """([kind, text]) => {
    const app = document.querySelector('[data-testid="stApp"]');
    const shown = [...document.querySelectorAll('[data-testid="stCaptionContainer"]')]
        .some(e => kind === 'prefix' ? e.innerText.startsWith(text) : e.innerText.includes(text));
    return shown && app && app.dataset.testScriptState === 'notRunning';
}"""


def interactions(page, repeats: int, timeout_s: float) -> dict[str, list[float]]:
    """On a loaded Replay page: seconds from choosing another 'Colour by' mode until its legend
    is drawn and the script ended, and from a click on 'Next'/'Prev' until the next turn's
    caption is drawn (a fragment rerun), ``repeats`` times each."""
    # By file: this script's own name shadows the app's pages/ package.
    import importlib.util
    spec = importlib.util.spec_from_file_location("app_tokens", ROOT / "pages" / "_tokens.py")
    _tokens = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(_tokens)
    out: dict[str, list[float]] = {"colour-by": [], "next/prev turn": []}
    modes = list(_tokens.MODES)
    for i in range(repeats):
        mode = modes[(i + 1) % len(modes)]
        page.get_by_role("combobox", name="Colour by").click()
        option = page.get_by_role("option", name=mode, exact=True)
        t0 = time.perf_counter()
        option.click()
        page.wait_for_function(STEP_DONE_JS, arg=["includes", _tokens.LEGEND[mode]], polling=20,
                               timeout=timeout_s * 1e3)
        out["colour-by"].append(time.perf_counter() - t0)
    position, forward = 0, True  # the link opened the first turn; walk to the end and back
    for _ in range(repeats):
        caption = page.get_by_text(re.compile(r"^Turn \d+ of \d+")).first.inner_text()
        shown, n = map(int, re.match(r"Turn (\d+) of (\d+)", caption).groups())
        forward = position + 1 < n if forward else position == 0
        button = page.get_by_role("button", name="Next ▶" if forward else "◀ Prev")
        t0 = time.perf_counter()
        button.click()
        page.wait_for_function(STEP_DONE_JS, arg=["prefix", f"Turn {shown + (1 if forward else -1)} of"],
                               polling=20, timeout=timeout_s * 1e3)
        out["next/prev turn"].append(time.perf_counter() - t0)
        position += 1 if forward else -1
    return out


def switch(page, title: str, timeout_s: float) -> float:
    """Click the sidebar's link to the page ``title``; seconds until it has rendered and its
    script ended. This is the in-app page change (no reload: the browser keeps its JS loaded),
    as opposed to ``load``'s full page load by deep link."""
    link = page.locator('[data-testid="stSidebarNavLink"]', has_text=title).first
    t0 = time.perf_counter()
    link.click()
    page.wait_for_function(LOADED_JS, arg=title, polling=20, timeout=timeout_s * 1e3)
    elapsed = time.perf_counter() - t0
    errors = page.locator('[data-testid="stException"]')
    if errors.count():
        raise RuntimeError(f"{title}: the page raised: {errors.first.inner_text()[:500]}")
    return elapsed


def check_shown(page, title: str, traj: str | None) -> None:
    """The deep link was honoured: the big run is picked (and Replay shows the trajectory), so
    the time was that of the page on the large run, not of an empty state."""
    picked = page.locator('[data-testid="stSidebar"]').get_by_role("combobox", name="Run")
    if not picked.input_value().startswith(big_store.RUN + " "):
        raise RuntimeError(f"{title}: run picker shows {picked.input_value()!r}")
    if traj and page.get_by_role("combobox", name="Trajectory").input_value() != traj:
        raise RuntimeError(f"{title}: trajectory {traj} not shown")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", default=None,
                        help="store file, built if missing (default: bench/queries.py's, "
                             f"{big_store.DEFAULT_STORE.name} in the temp dir)")
    parser.add_argument("--steps", type=int, default=3125,
                        help="steps of 32 trajectories when building the store")
    parser.add_argument("--repeats", type=int, default=5, help="warm loads per page")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per page load")
    parser.add_argument("--pages", default=None,
                        help="comma-separated pages to time, by lower-case title (default: all)")
    parser.add_argument("--watcher", default=None, choices=("auto", "watchdog", "poll", "none"),
                        help="server.fileWatcherType for the served app (default: the config's)")
    parser.add_argument("--shots", default=None,
                        help="directory for a screenshot of each page's first (cold) load")
    parser.add_argument("--walkthrough", action="store_true",
                        help="time README's walkthrough links on sample_runs/ instead")
    parser.add_argument("--links", default=None,
                        help="with --walkthrough: only links whose label ('5 dynamics') "
                             "contains one of these comma-separated words")
    parser.add_argument("--team", action="store_true",
                        help="with --walkthrough: the same links on team-store copies of the "
                             "sample stores too (made under tmp/ on the first run)")
    parser.add_argument("--floor", action="store_true",
                        help="with --walkthrough: also a Streamlit page drawing only a title, "
                             "what any page load costs (bench/floor_app.py)")
    parser.add_argument("--load", type=int, default=0,
                        help="busy-looping processes to run beside the app while timing")
    args = parser.parse_args()
    if args.walkthrough:
        with busy(args.load):
            walkthrough(args)
        return
    if args.load:
        raise SystemExit("--load goes with --walkthrough")
    store = Path(args.store or big_store.DEFAULT_STORE).resolve()
    big_store.ensure(store, args.steps)
    pages = app_pages()
    if args.pages:
        wanted = args.pages.split(",")
        pages = [p for p in pages if p[1].lower() in wanted]
        if len(pages) != len(wanted):
            raise SystemExit(f"--pages: unknown page in {wanted}; known: {app_pages()}")
    runs_table = queries.runs(str(store)).set_index("run_id")
    step = (int(runs_table.loc[big_store.RUN, "last_step"]) + 1) // 2
    # A trajectory of that step with the most turns, so that Replay's turn buttons can be timed.
    trajs = queries.trajectories(str(store), big_store.RUN, step=step)
    traj = trajs.sort_values(["num_turns", "traj_id"], ascending=[False, True])["traj_id"].iloc[0]
    deep = {"replay": {"traj": traj, "turn": 0}}

    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-pages-") as tmp:
        # The app lists every store directly under its store directories: a directory of its
        # own with a link to the store shows that store alone, wherever the file lives.
        stores, runs = Path(tmp) / "stores", Path(tmp) / "runs"
        stores.mkdir()
        runs.mkdir()
        (stores / store.name).symlink_to(store)
        env = dict(os.environ, AGENTRL_STORE_DIRS=str(stores), AGENTRL_RUNS_DIR=str(runs),
                   STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
        if args.watcher:
            env["STREAMLIT_SERVER_FILE_WATCHER_TYPE"] = args.watcher
        with open(Path(tmp) / "server.log", "wb") as log:
            proc, url = start_app(env, log)
            try:
                rss_idle, cpu_idle, started = kib(proc.pid, "VmRSS"), cpu_s(proc.pid), time.time()
                times: dict[str, list[float]] = {title: [] for _, title in pages}
                # CPU seconds per load, browser (all its processes) and server: less sensitive
                # than wall time to what else the machine runs.
                cpus: dict[str, list[tuple[float, float]]] = {title: [] for _, title in pages}
                with sync_playwright() as p:
                    browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                    ctx = browser.new_context(viewport={"width": 1400, "height": 2400})
                    page = ctx.new_page()
                    for rnd in range(1 + args.repeats):
                        k = rnd % len(pages)
                        for path, title in pages[k:] + pages[:k]:
                            query = {"store": str(stores / store.name), "run": big_store.RUN,
                                     "step": step, **deep.get(path, {})}
                            b0, s0 = browser_cpu(), cpu_s(proc.pid)
                            times[title].append(load(
                                page, f"{url}/{path}?{urllib.parse.urlencode(query)}", title,
                                args.timeout))
                            b1 = browser_cpu()
                            cpus[title].append((sum(v - b0.get(k, 0.0) for k, v in b1.items()),
                                                cpu_s(proc.pid) - s0))
                            check_shown(page, title, deep.get(path, {}).get("traj"))
                            if args.shots and rnd == 0:
                                Path(args.shots).mkdir(parents=True, exist_ok=True)
                                page.screenshot(path=str(Path(args.shots) / f"{title.lower()}.png"))
                        print(f"round {rnd + 1} of {1 + args.repeats} done", file=sys.stderr,
                              flush=True)
                    # In-app page changes: the run picked by the last deep link stays picked.
                    switched: dict[str, list[float]] = {title: [] for _, title in pages}
                    for rnd in range(args.repeats if len(pages) > 1 else 0):
                        k = rnd % len(pages)
                        for path, title in pages[k:] + pages[:k]:
                            if page.locator("h1").first.inner_text().strip() == title:
                                continue
                            switched[title].append(switch(page, title, args.timeout))
                            check_shown(page, title, None)
                    acted = {}
                    if "replay" in dict(pages):
                        query = {"store": str(stores / store.name), "run": big_store.RUN,
                                 "step": step, **deep["replay"]}
                        load(page, f"{url}/replay?{urllib.parse.urlencode(query)}", "Replay",
                             args.timeout)
                        acted = interactions(page, max(args.repeats, 1), args.timeout)
                    browser.close()
                rss_now, rss_peak = kib(proc.pid, "VmRSS"), kib(proc.pid, "VmHWM")
                cpu_used, wall = cpu_s(proc.pid) - cpu_idle, time.time() - started
            finally:
                stop_app(proc)

    print(f"store {store.name}: {store.stat().st_size / 2**20:.0f} MiB, run {big_store.RUN} "
          f"at step {step}; {args.repeats} warm loads per page, order rotated each round")
    print(f"{'page':10s} {'cold ms':>9s} {'warm ms (median)':>17s} {'warm min':>9s} "
          f"{'warm max':>9s} {'warm CPU ms: browser':>21s} {'server':>7s} "
          f"{'in-app change ms (median, max)':>31s}")
    for _, title in pages:
        cold, warm = times[title][0], times[title][1:]
        med = statistics.median(warm) if warm else float("nan")
        lo, hi = (min(warm), max(warm)) if warm else (float("nan"),) * 2
        warm_cpu = cpus[title][1:] or [(float("nan"),) * 2]
        b_med = statistics.median(b for b, _ in warm_cpu)
        s_med = statistics.median(s for _, s in warm_cpu)
        sw = switched[title]
        sw_text = (f"{1e3 * statistics.median(sw):.0f}, {1e3 * max(sw):.0f}" if sw else "-")
        print(f"{title:10s} {1e3 * cold:9.0f} {1e3 * med:17.0f} {1e3 * lo:9.0f} {1e3 * hi:9.0f} "
              f"{1e3 * b_med:21.0f} {1e3 * s_med:7.0f} {sw_text:>31s}")
    for name, taken in acted.items():
        print(f"Replay {name}: median {1e3 * statistics.median(taken):.0f} ms, min "
              f"{1e3 * min(taken):.0f}, max {1e3 * max(taken):.0f} ({len(taken)} times; "
              "target <= 500 ms)")
    print(f"streamlit server RSS: {rss_idle / 1024:.0f} MB after start, {rss_now / 1024:.0f} MB "
          f"after the loads, peak {rss_peak / 1024:.0f} MB (target <= 1024 MB)")
    print(f"streamlit server CPU: {cpu_used:.1f} s in {wall:.0f} s of loads")


@contextlib.contextmanager
def busy(n: int):
    """``n`` processes spinning on one core each while the block runs (load n)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


WALKTHROUGH_LINK = re.compile(r"[(<]http://127\.0\.0\.1:8501/([a-z]*)(?:\?([^)>\s]+))?[)>]")


def walkthrough_links() -> list[tuple[str, str, str]]:
    """(label, path, query) of every deep link in README's walkthrough, in its order; the label
    is the step's number and the link's page."""
    text = (ROOT / "README.md").read_text()
    out = []
    for match in WALKTHROUGH_LINK.finditer(text):
        before = text[:match.start()]
        step = re.findall(r"^(\d+)\. ", before, flags=re.M)
        label = f"{step[-1] if step else '?'} {match.group(1) or 'runs'}"
        same = sum(1 for other, _, _ in out if other.split("#")[0] == label)
        out.append((label + (f"#{same + 1}" if same else ""), match.group(1),
                    match.group(2) or ""))
    return out


TEAM_DIR = ROOT / "tmp" / "bench-team-walk" / "sample_runs"
FLOOR_APP = ROOT / "bench" / "floor_app.py"


def team_copies() -> Path:
    """Each committed sample store copied into a team store of its own (a SQLite catalog) of the
    same name under TEAM_DIR, so the walkthrough's links open the same runs on a team store;
    made once, and again when a sample store changes (its size and mtime are the stamp)."""
    from storage import store_copy, team_store
    for src in sorted((ROOT / "sample_runs").glob("*.duckdb")):
        dst, stamp = TEAM_DIR / src.name, TEAM_DIR / (src.name + ".source")
        mark = f"{src.stat().st_size} {src.stat().st_mtime_ns}"
        if dst.is_dir() and stamp.is_file() and stamp.read_text() == mark:
            continue
        if dst.exists():
            shutil.rmtree(dst)
        team_store.init(dst, "sqlite")
        store_copy.copy(src, dst)
        differ = store_copy.same_rows(src, dst)
        if differ:
            raise SystemExit(f"{src.name}: the team store's copy differs in {differ}")
        stamp.write_text(mark)
    return TEAM_DIR


@contextlib.contextmanager
def served(script: Path, env: dict, log) -> Iterator[tuple[subprocess.Popen, str]]:
    """``streamlit run script`` as the browser tests serve app.py: (process, URL)."""
    proc, url = start_app(env, log, script)
    try:
        yield proc, url
    finally:
        stop_app(proc)


def walkthrough(args) -> None:
    """Time each walkthrough link, cold then warm, on the app serving sample_runs/; with
    ``--team``, the same links on a second app serving team-store copies of the sample stores,
    and with ``--floor``, a Streamlit page that draws only a title (what any page load costs),
    each load of a round on every server in turn (the order rotated), so that load from other
    processes hits them alike."""
    links = walkthrough_links()
    if args.links:
        links = [link for link in links if any(w in link[0] for w in args.links.split(","))]
    titles = dict(app_pages())
    kinds = ["file"] + (["team"] if args.team else [])
    team = team_copies() if args.team else None
    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-walk-") as tmp, \
            contextlib.ExitStack() as servers:
        base = dict(os.environ, AGENTRL_RUNS_DIR=tmp, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
        log = servers.enter_context(open(Path(tmp) / "server.log", "wb"))
        apps = {"file": servers.enter_context(served(
            ROOT / "app.py", dict(base, AGENTRL_STORE_DIRS="sample_runs"), log))}
        if team is not None:
            apps["team"] = servers.enter_context(served(
                ROOT / "app.py", dict(base, AGENTRL_STORE_DIRS=str(team.relative_to(ROOT))), log))
        floor = servers.enter_context(served(FLOOR_APP, base, log)) if args.floor else None

        def address(kind: str, path: str, query: str) -> str:
            if kind == "team":
                query = query.replace("store=sample_runs%2F", "store=" + urllib.parse.quote(
                    str(team.relative_to(ROOT)), safe="") + "%2F")
            return f"{apps[kind][1]}/{path}?{query}"

        rows = [(label, kind) for label, _, _ in links for kind in kinds]
        times = {row: [] for row in rows + [("floor", "-")]}
        cpus = {row: [] for row in times}   # (browser, server) CPU seconds of each load
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            page = context.new_page()
            for rnd in range(1 + args.repeats):
                k = rnd % len(links)
                for label, path, query in links[k:] + links[:k]:
                    order = kinds[rnd % len(kinds):] + kinds[:rnd % len(kinds)]
                    visits = [((label, kind), apps[kind][0], address(kind, path, query),
                               titles[path]) for kind in order]
                    if floor is not None and label == links[0][0]:
                        visits.append((("floor", "-"), floor[0], floor[1] + "/", "Floor"))
                    for row, proc, url, title in visits:
                        b0, s0 = browser_cpu(), cpu_s(proc.pid)
                        times[row].append(load(page, url, title, args.timeout, CHARTS_DRAWN_JS))
                        b1 = browser_cpu()
                        cpus[row].append((sum(v - b0.get(k, 0.0) for k, v in b1.items()),
                                          cpu_s(proc.pid) - s0))
                print(f"round {rnd + 1} of {1 + args.repeats} done", file=sys.stderr, flush=True)
            browser.close()
    print(f"README walkthrough links on sample_runs/ ({' and '.join(kinds)} stores), load "
          f"{args.load} added ({os.cpu_count()} CPUs), {args.repeats} warm loads each, charts "
          "drawn")
    print(f"{'step page':14s} {'store':5s} {'cold ms':>8s} {'warm min':>9s} {'warm median':>12s} "
          f"{'warm max':>9s} {'warm CPU ms: browser':>21s} {'server':>7s}")
    for row in rows + ([("floor", "-")] if floor is not None else []):
        cold, warm = times[row][0], times[row][1:] or [float("nan")]
        used = cpus[row][1:] or [(float("nan"),) * 2]
        print(f"{row[0]:14s} {row[1]:5s} {1e3 * cold:8.0f} {1e3 * min(warm):9.0f} "
              f"{1e3 * statistics.median(warm):12.0f} "
              f"{1e3 * max(warm):9.0f} {1e3 * statistics.median(b for b, _ in used):21.0f} "
              f"{1e3 * statistics.median(s for _, s in used):7.0f}")
    for kind in kinds:
        worst = max(statistics.median(times[r][1:] or times[r]) for r in rows if r[1] == kind)
        print(f"slowest warm median, {kind} stores: {1e3 * worst:.0f} ms (target <= 1000 ms at "
              "load 4)")
    print(f"load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1/5/15 min)")


if __name__ == "__main__":
    main()
