"""Failures' selected-trajectory panel, Replay's tag box and the readable text of turns, through
Streamlit's AppTest on the demo store (tests/app_fixtures.py); ``readable`` on hand-written text.
"""
from __future__ import annotations

import pytest

from pages._common import readable
from storage import queries
from tests.app_fixtures import INVALID_FEEDBACK, SCRIPT_TEXT, SCRIPT_TRAJ
from tests.test_pages import app, demo, shown_table, texts  # noqa: F401  (fixtures)


# -- chat-template markers -------------------------------------------------------------------------
@pytest.mark.parametrize("raw,shown", [
    # ChatML, as the trainer records an environment's reply between two model turns
    ("<|im_end|>\n<|im_start|>user\nTurn 2: State:\n_ P\nYou have 8 actions left.<|im_end|>\n"
     "<|im_start|>assistant\n", "Turn 2: State:\n_ P\nYou have 8 actions left."),
    ("<answer>Up</answer><|im_end|>", "<answer>Up</answer>"),
    # Llama 3's headers and end of turn; any other <|name|> token
    ("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", "Hi"),
    ("done<|endoftext|>", "done"),
    # a marker followed by words on its line keeps the words
    ("<|im_start|>Hello there", "Hello there"),
    # text that only looks like it stays as written
    ("a <| b |> c, x<|y", "a <| b |> c, x<|y"),
    ("<search>capital of Ysmir</search>", "<search>capital of Ysmir</search>"),
    ("<|im_end|>\n", ""),
])
def test_readable_hides_chat_template_markers(raw, shown):
    assert readable(raw) == shown


@pytest.mark.parametrize("empty", [None, float("nan"), ""])
def test_readable_keeps_nothing_as_none(empty):
    assert readable(empty) is None


# -- failures --------------------------------------------------------------------------------------
def _select_row(at, row: int = 0):
    at.session_state["fail_results"] = {"selection": {"rows": [row], "columns": []}}
    return at.run()


def test_failures_panel_folds_the_turns_and_links_to_replay(app, demo):
    at = app("failures", store=demo[1], run=demo[2]["demo-search-starpo"])
    at.text_input(key="fail_search").input(INVALID_FEEDBACK[:30]).run()
    traj = shown_table(at, "failure_class", "traj_id")["traj_id"].iloc[0]
    _select_row(at)
    assert not at.exception
    assert [e.label for e in at.expander if e.label.startswith("All ")] == ["All 3 turns"]
    folded = next(e for e in at.expander if e.label == "All 3 turns")
    assert any(INVALID_FEEDBACK in c.value for c in folded.code)     # the turns, inside it
    outside = [c.value for c in at.code if c not in folded.code]
    assert not any(INVALID_FEEDBACK in v for v in outside)
    links = [e for e in at.get("page_link") if e.proto.label == f"Open {traj} in Replay"]
    assert links and f"traj={traj}" in links[0].proto.query_string


def test_failures_panel_shows_hostile_text_as_text(app, demo):
    at = app("failures", store=demo[1], run=demo[2]["demo-search-starpo"])
    at.multiselect(key="fail_classes").set_value([]).run()
    at.text_input(key="fail_search").input("<script>").run()
    _select_row(at)
    assert shown_table(at, "failure_class", "traj_id")["traj_id"].tolist() == [SCRIPT_TRAJ]
    assert any(SCRIPT_TEXT in c for c in texts(at, "code"))
    assert not any(SCRIPT_TEXT in m.value for m in [*at.markdown, *at.caption])


def test_failures_search_says_which_fields_and_how_it_combines(app, demo):
    at = app("failures", store=demo[1], run=demo[2]["demo-search-starpo"])
    said = [c for c in texts(at, "caption") if c.startswith("Searches the prompt")]
    # the fields it reads, the tags and notes among them, and that it narrows the filters
    assert said and "tags and notes" in said[0] and "every filter above" in said[0]


# -- replay's tag box ------------------------------------------------------------------------------
def test_replay_tag_box_saves_on_the_trajectory_shown(app, demo):
    run = demo[2]["demo-apps-rloo"]
    at = app("replay", store=demo[1], run=run, step=1, traj="a1-r2")
    at.text_input(key="replay_tag").input("read-first")
    at.text_area(key="replay_note").input("the phone lookup failed")
    at.button(key="replay_tag_save").click().run()
    assert not at.exception
    assert "Saved." in texts(at, "success")
    saved = queries.tags(demo[1], run)
    assert saved[["traj_id", "tag", "note"]].values.tolist() == [
        ["a1-r2", "read-first", "the phone lookup failed"]]
    assert any("read-first" in f.value["tag"].tolist() for f in at.dataframe
               if "tag" in f.value.columns)                             # shown after the save


def test_replay_tag_is_not_saved_on_a_trajectory_switched_to_after_drawing(app, demo):
    run = demo[2]["demo-apps-rloo"]
    at = app("replay", store=demo[1], run=run, step=1, traj="a1-r0")
    at.text_input(key="replay_tag").input("meant-for-r0")
    at.selectbox(key="traj").set_value("a1-r3")
    at.button(key="replay_tag_save").click().run()
    assert not at.exception
    assert any(e.value.startswith("Not saved") for e in at.error)
    assert "meant-for-r0" not in queries.tags(demo[1], run)["tag"].tolist()


def test_replay_turn_text_hides_markers_and_says_so(app, demo, tmp_path):
    from tests.test_browser_failures import MARKED_OBS, OBS_WORDS, _record_chat_run
    store = tmp_path / "chat" / "chat.duckdb"
    store.parent.mkdir()
    run = _record_chat_run(store)
    at = app("replay", store_dir=str(store.parent), store=str(store), run=run, step=0, traj="c0",
             turn=0)
    assert not at.exception
    codes = texts(at, "code")
    assert OBS_WORDS + " The game is over." in codes
    assert MARKED_OBS not in codes and not any("<|im_" in c for c in codes)
    assert any(c.startswith("Chat-template markers") for c in texts(at, "caption"))
