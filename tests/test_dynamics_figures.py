"""Dynamics builds its plotly figures once per (store, run, version, step): a warm rerun (a click,
a widget) draws the same charts without building a figure again, and another step or new data
builds them anew (pages/dynamics.py ``figure``, ``grad_figure``)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import plotly.graph_objects as go
import pytest
import streamlit as st

from tests.app_fixtures import SPIKE_STEP
from tests.test_pages import app, demo  # noqa: F401 (fixtures)

DYNAMICS = str(Path("pages") / "dynamics.py")


@pytest.fixture
def built(monkeypatch):
    """Names of the pages/dynamics.py functions that built a plotly figure, in order (the real
    constructor runs)."""
    seen: list[str] = []
    real = go.Figure.__init__

    def init(self, *args, **kwargs):
        caller = sys._getframe(1).f_code
        if caller.co_filename.endswith(DYNAMICS):
            seen.append(caller.co_name)
        real(self, *args, **kwargs)
    monkeypatch.setattr(go.Figure, "__init__", init)
    st.cache_resource.clear()
    yield seen
    st.cache_resource.clear()


def specs(at) -> list[dict]:
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def step_lines(at) -> set:
    """The x of every chart's dashed line at the sidebar's step."""
    return {shape["x0"] for spec in specs(at) for shape in spec["layout"].get("shapes", [])}


def test_a_warm_rerun_builds_no_figure_and_another_step_builds_them_anew(  # noqa: F811
        app, demo, built):
    run = demo[2]["demo-search-starpo"]
    at = app("dynamics", store=demo[1], run=run, step=SPIKE_STEP)
    assert not at.exception, at.exception
    first = specs(at)
    assert len(first) >= 3 and "figure" in built and "grad_figure" in built
    assert step_lines(at) == {SPIKE_STEP}
    built.clear()
    at.run()
    assert not at.exception, at.exception
    assert built == []                       # nothing rebuilt ...
    assert specs(at) == first                # ... and the same charts drawn
    other = app("dynamics", store=demo[1], run=run, step=SPIKE_STEP + 1)
    assert not other.exception, other.exception
    assert "figure" in built and "grad_figure" in built
    assert step_lines(other) == {SPIKE_STEP + 1}
