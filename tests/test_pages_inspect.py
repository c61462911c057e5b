"""The pages on imported agent evaluations, through Streamlit's AppTest: the committed Inspect AI
store (sample_runs/inspect_agents.duckdb: two agents on the same six samples) in Replay (tool
calls as calls, the sample's scores, what ended it), Failures (each class explained) and Compare
(gained and lost); and a hostile chat trace whose calls carry markup, shown as text."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from pages import _calls
from storage import ingest
from tests.test_pages import app, demo, shown_table, texts  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parent.parent
STORE = "sample_runs/inspect_agents.duckdb"
CAREFUL = "inspect-agents-shop_desk-mockllm-careful-7ab7146f"
HASTY = "inspect-agents-shop_desk-mockllm-hasty-1c4018c9"


def _traj(run_id: str, sample: str) -> str:
    with duckdb.connect(str(ROOT / STORE), read_only=True) as con:
        return con.execute("SELECT traj_id FROM trajectories WHERE run_id = ? AND task_id = ?",
                           [run_id, sample]).fetchone()[0]


@pytest.fixture
def sample_app(app):
    if not (ROOT / STORE).exists():
        pytest.skip(f"{STORE} is not recorded: bash sample_runs/make.sh inspect")

    def open_page(page: str, **params):
        return app(page, store_dir=str(ROOT / "sample_runs"), store=str(ROOT / STORE), **params)
    return open_page


def test_replay_shows_each_tool_call_by_name_and_arguments(sample_app):
    at = sample_app("replay", run=HASTY, step=0, traj=_traj(HASTY, "kiwi"), turn=1)
    assert not at.exception
    assert "**Tool call** · catalogue" in [m.value for m in at.markdown]
    args = shown_table(at, "argument", "value")
    assert args.to_dict("records") == [{"argument": "item", "value": "kiwi fruit"}]
    assert "tool call for tool catalogue" in texts(at, "code")  # the model's words, apart
    assert not any("catalogue(item=" in t for t in texts(at, "code"))  # no second rendering
    scores = shown_table(at, "scorer", "answer", "explanation")
    assert scores["scorer"].tolist() == ["includes (primary)"] and scores["value"][0] == "C"


def test_replay_says_what_ended_a_sample(sample_app):
    at = sample_app("replay", run=CAREFUL, step=0, traj=_traj(CAREFUL, "stock"), turn=0)
    assert "A tool or the evaluation reported an error on this turn:" in texts(at, "error")
    assert "The sample errored:" in texts(at, "error")
    assert any("the inventory service is down" in t for t in texts(at, "code"))
    at = sample_app("replay", run=CAREFUL, step=0, traj=_traj(CAREFUL, "discount"), turn=0)
    assert "A limit of the evaluation cut the sample:" in texts(at, "warning")
    assert "Message limit exceeded. count: 9; limit: 8" in texts(at, "code")


def test_failures_explains_the_evaluation_classes(sample_app):
    at = sample_app("failures", run=CAREFUL)
    assert not at.exception
    (meanings,) = [m.value for m in at.markdown if m.value.startswith("- **")]
    for cls in ("refused", "limit\\_exceeded", "sample\\_error", "tool\\_error\\_unrecovered"):
        assert f"- **{cls}** · 1 (17%): " in meanings
    assert "declined the task" in meanings and "- **success** · 2 (33%)" in meanings
    assert at.expander[0].proto.expanded  # an evaluation: open by itself


def test_compare_pairs_the_two_agents_sample_by_sample(sample_app):
    at = sample_app("compare", run=CAREFUL, a=f"{CAREFUL}:0", b=f"{HASTY}:0", task="kiwi")
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert (metrics["solved in A"], metrics["solved in B"]) == ("2 / 6", "3 / 6")
    assert (at.selectbox(key="cmp_a").label, at.selectbox(key="cmp_b").label) == ("A", "B")
    assert any(cap.value.startswith("Two runs side by side") for cap in at.caption)
    assert (metrics["gained"], metrics["lost"]) == ("2", "1")
    tasks = shown_table(at, "change", "task_id", "class_a", "class_b")
    assert sorted(zip(tasks["change"], tasks["task_id"], tasks["class_a"], tasks["class_b"])) == [
        ("gained", "kiwi", "tool_error_unrecovered", "success"),
        ("gained", "pastime", "refused", "success"),
        ("lost", "total", "success", "answered_without_tool_call")]


HOSTILE_CALL = {"id": "c1", "type": "function", "function": {
    "name": "<img src=x onerror=alert(1)>", "arguments": json.dumps(
        {"code": "print('<script>alert(2)</script>')\nprint(2)", "note": "**bold** [x](http://y)"})}}


def test_hostile_calls_are_shown_as_text(app, tmp_path):
    src = tmp_path / "trace.jsonl"
    src.write_text(json.dumps({"messages": [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": None, "tool_calls": [HOSTILE_CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "<b>done</b>"}],
        "reward": 0.0, "task_id": "t"}) + "\n")
    store = tmp_path / "s.duckdb"
    report = ingest.import_file(src, store, "messages", run_id="hostile")
    at = app("replay", store_dir=str(tmp_path), store=str(store), run="hostile", step=0,
             traj="trace:0", turn=0)
    assert not at.exception
    shown = [m.value for m in at.markdown]
    assert not any("<img" in m or "<script" in m or "](http" in m for m in shown)
    assert "print('<script>alert(2)</script>')\nprint(2)" in texts(at, "code")  # as code text
    args = shown_table(at, "argument", "value")
    assert args["value"].tolist() == ["**bold** [x](http://y)"]  # a table cell: text
    assert report.imported == 1


def test_words_of_an_action_come_back_only_when_the_calls_end_it():
    calls = [{"function": "add", "arguments": {"x": 2}}]
    assert _calls.words_of("let me add\nadd(x=2)", calls) == "let me add"
    assert _calls.words_of("add(x=2)", calls) == ""
    assert _calls.words_of("something else", calls) is None  # shown whole
    assert _calls.calls_of('{"tool_calls": "no"}') == [] and _calls.calls_of("not json") == []
