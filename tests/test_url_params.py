"""URL parameters (pages/_params.py): the parser by hand, and pages that refuse a name or value
they cannot show instead of widening the view (issue #51 item 1); tags searched, filtered and
exported through storage (item 8)."""
from __future__ import annotations

import json

from pages._params import PAGES, Param, escaped, parse, unknown
from storage import annotations, export, queries
from tests.test_pages import app, demo, texts  # noqa: F401  (fixtures)


def test_parse_by_hand():
    classes = ["success", "wrong_answer"]
    assert parse(Param("list"), ["wrong_answer"], classes) == (["wrong_answer"], None)
    assert parse(Param("list"), ["repeated_action"], classes) == \
        ([], "repeated_action is not one of them")
    assert parse(Param("list"), ["a", "wrong_answer", "b"], classes) == \
        (["wrong_answer"], "a, b are not one of them")
    assert parse(Param("list"), [""], classes) == ([], None)         # classes= : nothing picked
    assert parse(Param("int"), ["12"], range(20)) == (12, None)
    assert parse(Param("int"), ["12"], range(5)) == (None, "12 is not one of them")
    assert parse(Param("int"), ["1e3"]) == (None, "1e3 is not a whole number")
    assert parse(Param("range"), ["9-3"]) == ((3, 9), None)
    assert parse(Param("range"), ["3..9"]) == (None, "3..9 is not a step range A-B")
    assert parse(Param(), ["any", "solved"], ["any", "solved"]) == ("solved", None)  # last wins
    assert parse(Param(), ["sometimes"], ["any", "solved"]) == \
        (None, "sometimes is not one of them")
    asked = []
    assert parse(Param(), ["x"], lambda: asked.append(1) or ["x"]) == ("x", None)
    assert asked == [1]                                   # a function gives the allowed values


def test_unknown_names_and_escaping():
    assert unknown(["store", "run", "step", "class", "classes", "embed"], "failures") == ["class"]
    assert unknown(["traj", "turn"], "groups") == ["traj", "turn"]
    assert {"runs", "replay", "groups", "dynamics", "failures", "compare", "train"} <= set(PAGES)
    shown = escaped("[x](https://e.com) <b>*y*</b> :smile:")
    assert "](" not in shown and "<b>" not in shown and "*y*" not in shown and ":smile:" not in shown
    assert escaped("a" * 200).endswith("…") and len(escaped("a" * 200)) == 81


def _warnings(at) -> str:
    """The warnings' text as read (the page backslash-escapes typed punctuation)."""
    return " ".join(texts(at, "warning")).replace("\\", "")


def test_unknown_class_shows_nothing_and_keeps_the_address(app, demo):  # noqa: F811
    store, run = demo[1], demo[2]["demo-search-starpo"]
    at = app("failures", store=store, run=run, classes="repeated_action")
    assert not at.exception, at.exception
    assert "classes=repeated_action" in _warnings(at)
    assert any(c.startswith("0 trajectories match") for c in texts(at, "caption"))
    assert not at.dataframe or all(d.key != "fail_results" for d in at.dataframe)
    assert not [b for b in at.get("download_button")]                  # no export offered
    assert at.query_params["classes"] in ("repeated_action", ["repeated_action"])  # kept as typed
    # a known class beside it: still refused (the address asks for something not there)
    at = app("failures", store=store, run=run, classes="nope", outcome="failed")
    assert "nope" in _warnings(at)


def test_misspelt_name_malformed_step_unknown_run(app, demo):  # noqa: F811
    store, run = demo[1], demo[2]["demo-search-starpo"]
    at = app("failures", store=store, run=run, clases="wrong_answer")
    assert "clases=wrong_answer" in _warnings(at) and "Failures" not in texts(at, "title")
    at = app("replay", store=store, run=run, step="x3")
    assert "x3 is not a whole number" in _warnings(at)
    assert "Replay" not in texts(at, "title")
    at = app("dynamics", store=store, run="no-such-run")
    assert "run=no-such-run" in _warnings(at) and "Dynamics" not in texts(at, "title")
    assert at.query_params["run"] in ("no-such-run", ["no-such-run"])


def test_tags_searched_filtered_and_exported(demo, tmp_path):  # noqa: F811
    store, run = demo[1], demo[2]["demo-search-starpo"]
    some = queries.search_trajectories(store, run, limit=2)["traj_id"].tolist()
    annotations.add_tag(store, run, some[0], "loops-on-query", note="asks Zorblax twice")
    found = queries.search_trajectories(store, run, text="zorblax")       # a note's word
    assert found["traj_id"].tolist() == [some[0]]
    assert queries.search_trajectories(store, run, text="LOOPS-on")["traj_id"].tolist() == \
        [some[0]]
    assert queries.search_trajectories(store, run, tags=["loops-on-query"],
                                       limit=None)["traj_id"].tolist() == [some[0]]
    assert queries.count_trajectories(store, run, tags=["loops-on-query"]) == 1
    assert queries.count_trajectories(store, run, tags=["never-saved"]) == 0
    lines = queries.export_trajectories(store, run, some, "jsonl").decode().splitlines()
    records = {r["traj_id"]: r for r in map(json.loads, lines)}
    assert records[some[0]]["tags"] == [{"tag": "loops-on-query", "note": "asks Zorblax twice"}]
    assert records[some[1]]["tags"] == []
    out = tmp_path / "tagged.jsonl"            # agentrl export --tag: the command line's JSONL
    assert export.export_jsonl(store, run, out, export.Filters(tag="loops-on-query")) == 1
    line = json.loads(out.read_text().splitlines()[0])
    assert line["traj_id"] == some[0] and line["tags"] == records[some[0]]["tags"]


def test_every_parameter_a_page_writes_is_declared():
    """A page that reads or writes a URL parameter pages/_params.py does not declare would have
    its own links refused: every name in the pages' url_select / adopt_url / publish_url calls
    (and Failures' filters) is declared for some page."""
    import re
    from pathlib import Path

    from pages._failfilters import PARAMS as FILTERS
    from pages._params import COMMON
    root = Path(__file__).resolve().parent.parent
    code = "\n".join(p.read_text() for p in [root / "app.py", *sorted((root / "pages").glob("*.py"))])
    used = set(re.findall(r'(?:adopt_url|publish_url)\(\s*"(\w+)"', code))
    used |= set(re.findall(r'\bparam="(\w+)"', code))          # url_select's keyword
    used |= set(FILTERS.values())
    declared = set(COMMON).union(*PAGES.values())
    assert used and used <= declared, used - declared
    assert {"group", "traj", "spike", "mismatch_step", "classes", "tags"} <= used


def test_failures_tag_filter_from_the_address(app, demo):  # noqa: F811
    store, run = demo[1], demo[2]["demo-search-starpo"]
    some = queries.search_trajectories(store, run, success=False, limit=1)["traj_id"].tolist()
    annotations.add_tag(store, run, some[0], "page-filter-tag", note="seen on the page")
    at = app("failures", store=store, run=run, tags="page-filter-tag")
    assert not at.exception and not texts(at, "warning"), texts(at, "warning")
    assert any(c.startswith("1 trajectories match") for c in texts(at, "caption"))
    assert at.multiselect(key="fail_tags").value == ["page-filter-tag"]
    at = app("failures", store=store, run=run, q="SEEN ON THE")          # a note's words
    assert any(c.startswith("1 trajectories match") for c in texts(at, "caption"))
