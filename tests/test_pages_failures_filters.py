"""Failures' filters never widen or narrow without a word, through Streamlit's AppTest on the
committed SmolLM2 search run (780 trajectories, 342 solved, steps 1-30): a step range outside the
run is a warning and an empty view (it was rewritten to 30-30), a range that overlaps it says
what it was cut to, an emptied class filter says the list (and the export) now holds every class,
solved ones included, and an outcome the class filter can never let through names that filter.
"""
from __future__ import annotations

from storage import queries
from tests.test_pages import ROOT, app, demo, shown_table, texts  # noqa: F401  (fixtures)

STORE = "sample_runs/search_smollm2.duckdb"
RUN = "20261129-233052-4ded2d"


def failures(app, **params):
    at = app("failures", store_dir=str(ROOT / "sample_runs"), store=str(ROOT / STORE), run=RUN,
             **params)
    assert not at.exception, at.exception
    return at


def warned(at) -> str:
    """The warnings' text, markdown escapes removed."""
    return " ".join(texts(at, "warning")).replace("\\", "")


def results(at):
    return [f.value for f in at.dataframe if "failure_class" in f.value.columns]


def test_a_step_range_outside_the_run_is_a_warning_and_an_empty_view(app):
    for asked in ("200-300", "900-1000"):
        at = failures(app, steps=asked)
        said = warned(at)
        assert f"steps={asked}" in said and "steps 1-30 only" in said, said
        assert results(at) == []                                 # no table, no export
        assert not [b for b in at.get("download_button")]
        assert at.query_params["steps"] == asked                 # the address kept as typed


def test_a_step_range_overlapping_the_run_says_what_it_was_cut_to(app):
    at = failures(app, steps="20-300")
    assert at.slider(key="fail_steps").value == (20, 30)
    said = warned(at)
    assert "asked for steps 20-300" in said and "steps 20-30" in said, said
    steps = set(results(at)[0]["step"])
    assert steps and min(steps) >= 20


def test_an_emptied_class_filter_says_the_list_holds_every_class(app):
    at = failures(app)
    assert not any("No failure class picked" in t for t in texts(at, "info"))
    at.multiselect(key="fail_classes").set_value([]).run()
    assert at.query_params["classes"] == ""
    said = [t for t in texts(at, "info") if t.startswith("No failure class picked")]
    assert said and "the 342 solved" in said[0] and "export" in said[0], texts(at, "info")
    assert any("780 trajectories match" in t for t in texts(at, "caption"))


def test_an_emptied_split_filter_says_branch_continuations_are_in(app):
    at = failures(app)
    at.multiselect(key="fail_splits").set_value([]).run()
    assert any(t.startswith("No split picked") for t in texts(at, "info"))


def test_an_outcome_the_class_filter_excludes_names_that_filter(app):
    at = failures(app, outcome="solved")
    assert any("0 trajectories match" in t for t in texts(at, "caption"))
    said = warned(at)
    assert "Outcome **solved**" in said and "**Failure class**" in said, said
    # with success among the classes it matches, and nothing is said
    at.multiselect(key="fail_classes").set_value(["success"]).run()
    assert any("342 trajectories match" in t for t in texts(at, "caption"))
    assert not any("nothing can match" in t for t in texts(at, "warning"))
    # the other way round: failed, with only success picked
    at.radio(key="fail_outcome").set_value("failed").run()
    said = warned(at)
    assert "Outcome **failed**" in said and "holds only success" in said, said


def test_a_rerun_draws_the_charts_without_building_them_again(app, monkeypatch):
    """plotly express built each of Failures' three bar charts on every rerun (~0.3 s each at
    load 10): their figures are cached by data and arguments."""
    import plotly.express as px
    at = failures(app)
    built = []
    real = px.bar
    monkeypatch.setattr(px, "bar", lambda *a, **k: built.append(k.get("title")) or real(*a, **k))
    read_tags = []
    real_tags = queries.tags
    monkeypatch.setattr(queries, "tags", lambda *a, **k: read_tags.append(a) or real_tags(*a, **k))
    at.run()
    assert not at.exception and built == []
    assert read_tags == []          # the store was not written: its tags are not read again
    assert len(at.get("plotly_chart")) >= 2                       # still drawn
