"""Pages on a long run (bench/queries.py's synthetic store, 400 steps, random metrics that start
an alarm every few steps), through Streamlit's AppTest: what the browser is asked to draw stays
small however long the run (bench/pages.py times it in Chromium on 3,125 steps), and a rerun of a
page (a click, a widget) reads nothing from the store but what the page itself writes."""
from __future__ import annotations

import base64
import json
import sys

import numpy as np

import pytest
import streamlit as st
import streamlit.testing.v1.app_test as app_test
from streamlit.testing.v1 import AppTest

from bench import queries as big_store
from pages import _jobs
from storage import db, queries
from tests.test_pages import APP, ROOT, _NavigationPagesManager

STEPS = 400
MARKERS_UP_TO = 300     # pages draw a marker per point only up to this many points
ALARM_LINES = 60        # alarm lines at least 1/60 of the x-range apart
MAX_BARS = 100          # bars per trace of Failures' per-step chart


@pytest.fixture(scope="module")
def long_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("long")
    big_store.build(base / "long.duckdb", STEPS)
    return base, str(base / "long.duckdb")


@pytest.fixture
def page(monkeypatch, tmp_path, long_store):
    """Open a page of app.py on the long run; returns the AppTest."""
    monkeypatch.setattr(app_test, "PagesManager", _NavigationPagesManager)
    monkeypatch.setenv(queries.STORE_DIRS_ENV, str(long_store[0]))
    monkeypatch.setenv(_jobs.RUNS_DIR_ENV, str(tmp_path / "runs"))
    monkeypatch.chdir(ROOT)
    st.cache_data.clear()

    def open_page(name: str, **params) -> AppTest:
        at = AppTest.from_file(APP, default_timeout=120).run()
        at.query_params.update({"store": long_store[1], "run": big_store.RUN,
                                "step": str(STEPS // 2), **params})
        at = at.switch_page(f"pages/{name}.py").run()
        assert not at.exception, at.exception
        return at
    return open_page


@pytest.fixture
def reads(monkeypatch):
    """Names of the storage.queries functions that opened the store, in order."""
    seen: list[str] = []
    real = db.reading

    def reading(path, *args, **kwargs):
        frame = sys._getframe(1)
        while frame is not None and not (frame.f_code.co_filename.endswith("queries.py")
                                         and not frame.f_code.co_name.startswith("_")):
            frame = frame.f_back
        seen.append(frame.f_code.co_name if frame is not None else "?")
        return real(path, *args, **kwargs)
    monkeypatch.setattr(db, "reading", reading)
    return seen


def values(v) -> list:
    """A trace's x or y as a list: plotly sends numpy arrays as base64 typed arrays."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return list(v or [])


def all_traces(at: AppTest) -> list[dict]:
    """Every trace of every plotly chart of the page, x and y as lists."""
    return [{**t, "x": values(t.get("x")), "y": values(t.get("y"))}
            for c in at.get("plotly_chart") for t in json.loads(c.proto.spec)["data"]]


def test_dynamics_draws_long_series_as_lines_and_spaces_alarm_lines(page):
    at = page("dynamics")
    drawn = all_traces(at)
    assert len(drawn) > 10
    alarm_traces = [t for t in drawn if None in t["x"]]
    assert alarm_traces  # random metrics start alarms every few steps
    for trace in drawn:
        xs = trace["x"]
        if len(xs) > MARKERS_UP_TO:
            assert "markers" not in trace.get("mode", ""), trace.get("name")
        if None in xs:  # a trace of vertical alarm segments: x, x, None per line
            lines = xs[::3]
            assert len(lines) <= ALARM_LINES, trace.get("name")
            gaps = [b - a for a, b in zip(lines, lines[1:])]
            assert min(gaps) >= (STEPS - 1) / ALARM_LINES, trace.get("name")


def test_failures_draws_at_most_a_hundred_bars_per_class(page):
    at = page("failures")
    per_step = [t for t in all_traces(at) if t.get("type") == "bar" and t.get("orientation") != "h"]
    assert per_step
    steps = {x for t in per_step for x in t["x"]}
    assert 50 <= len(steps) <= MAX_BARS
    # Nothing is lost by binning: the bars add up to every trajectory of the run.
    total = sum(queries.failure_counts(at.query_params["store"], big_store.RUN)["n"])
    assert sum(y for t in per_step for y in t["y"]) == total


def test_runs_overlay_draws_a_long_run_as_a_line(page):
    from tests.test_pages import run_list_rows
    at = page("runs")
    rows = run_list_rows(at)                   # the run list's HTML tables (pages/_runlist.py)
    assert rows and max(len(r["spark"]) for r in rows.values()) <= 100  # ~100 points at most
    long = next(r for r in rows.values() if big_store.RUN in r["run"])
    assert len(long["spark"]) == 100                                   # 400 steps, 4 a point
    last = queries.metrics(at.query_params["store"], big_store.RUN, ["reward/mean"])["value"]
    assert float(long["reward/mean"].split()[0]) == pytest.approx(last.iloc[-1], rel=5e-3)
    box = at.multiselect(key="runs_compare")
    long_run = next(i for i, label in enumerate(box.options) if f"({big_store.RUN})" in label)
    box.set_value([long_run]).run()
    overlay = all_traces(at)
    assert any(len(t["x"]) == STEPS for t in overlay)
    assert all("markers" not in t.get("mode", "") for t in overlay
               if len(t["x"]) > MARKERS_UP_TO)


def test_a_rerun_of_dynamics_reads_nothing(page, reads):
    at = page("dynamics")
    assert "step_gradients" in reads or "top_gradient_trajectories" in reads
    reads.clear()
    at.run()
    assert not at.exception
    assert [r for r in reads if r != "runs"] == []  # the run list alone expires (5 s)


def test_a_rerun_of_failures_reads_the_tags_only_once_written(page, reads):
    """A rerun reads nothing while the store is unwritten; once written (this page saves tags),
    the tags are read again and a tag saved shows at once (pages/failures.py run_tags, keyed by
    the store's stamp since 3bdd9e3)."""
    from storage import annotations
    at = page("failures")
    assert "search_trajectories" in reads
    reads.clear()
    at.run()
    assert not at.exception
    assert [r for r in reads if r != "runs"] == []
    traj = queries.search_trajectories(at.query_params["store"], big_store.RUN).iloc[0]
    annotations.add_tag(at.query_params["store"], big_store.RUN, traj["traj_id"], "speed-test")
    reads.clear()
    at.run()
    assert not at.exception
    # the tags, then the list searched again with them (failures.search's tags_seen: the text
    # search reads tags and notes); nothing else
    assert [r for r in reads if r != "runs"] == ["tags", "search_trajectories",
                                                 "count_trajectories"]
    assert "speed-test" in at.multiselect(key="fail_tags").options


def test_colour_by_and_next_turn_read_nothing(page, reads):
    at = page("replay", traj=f"s{STEPS // 2}-g2-r5", turn="0")
    reads.clear()
    at.selectbox(key="replay_colour").set_value(at.selectbox(key="replay_colour").options[1]).run()
    at.button(key="replay_next").click().run()
    assert not at.exception
    assert [r for r in reads if r != "runs"] == []
