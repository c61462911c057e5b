"""Server-side time of a warm page rerun, through Streamlit's AppTest (no browser): the page is
opened on a store of sample_runs/ by deep link, run twice to warm its caches, then timed over 3
reruns in a row and 3 reruns 6 s apart (a user reading before the next click: the app's 5 s
caches -- run list, run versions -- have expired by then). The machine's load is printed beside.

    nice -n 10 .venv/bin/python bench/page_reruns.py PAGE STORE RUN [PARAM=VALUE ...]
    PROFILE=1 [SORT=cumulative|tottime] [N=45] ... : cProfile of one more rerun's script thread

e.g. ``failures sample_runs/search_smollm2.duckdb 20261129-233052-4ded2d``, ``replay ... step=30
traj=s30-g2-r5``. Browser-side time (charts drawn) is bench/pages.py's.
"""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # not bench/, whose pages.py would shadow the app's pages package
os.chdir(ROOT)

import streamlit.testing.v1.app_test as app_test  # noqa: E402
from streamlit.runtime.scriptrunner import script_runner  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from tests.test_pages import APP, _NavigationPagesManager  # noqa: E402


def main(page: str, store: str, run: str, *params: str) -> None:
    app_test.PagesManager = _NavigationPagesManager   # as tests/test_pages.py runs pages
    os.environ.setdefault("AGENTRL_STORE_DIRS", "sample_runs")
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.query_params.update({"store": store, "run": run, **dict(p.split("=", 1) for p in params)})
    at = at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, at.exception
    for _ in range(2):
        at.run()
    together, apart = [], []
    for _ in range(3):
        t = time.perf_counter()
        at.run()
        together.append(time.perf_counter() - t)
    for _ in range(3):
        time.sleep(6)
        t = time.perf_counter()
        at.run()
        apart.append(time.perf_counter() - t)
    print(f"{page}: warm reruns {[round(x, 3) for x in together]} s, 6 s apart "
          f"{[round(x, 3) for x in apart]} s, load {os.getloadavg()[0]:.1f}")
    if os.environ.get("PROFILE"):
        profile = cProfile.Profile()
        run_script = script_runner.ScriptRunner._run_script

        def profiled(self, *args, **kwargs):   # the script runs in its own thread
            profile.enable()
            try:
                return run_script(self, *args, **kwargs)
            finally:
                profile.disable()
        script_runner.ScriptRunner._run_script = profiled
        at.run()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(os.environ.get("SORT", "cumulative")) \
            .print_stats(int(os.environ.get("N", "45")))
        print(out.getvalue())


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
