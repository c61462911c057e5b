"""Failures and Replay in a 1280 x 900 window of a real headless Chromium (Debian's package through
playwright): the table starts with the failure class and the Replay link; a selected row opens a
compact panel with the tag form and the export buttons just under the table (its turns folded);
chat-template markers are hidden in the readable views and kept in the token view; the search
says what it searches and how it combines with the filters; Replay has a tag box; Back leaves
Replay in one press, to the Failures view it left.

Run alone: ``.venv/bin/python -m pytest -q tests/test_browser_failures.py``.
"""
from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

import pytest

from storage import queries
from storage.recorder import Recorder
from tests.app_fixtures import INVALID_FEEDBACK, RUN_NAMES, SCRIPT_TRAJ, make_demo_store
from tests.browser_harness import ROOT, browser_fixtures, scratch_dir, served_app
from tests.test_browser import no_exception, settle

pytestmark = pytest.mark.browser
WIDTH, HEIGHT = 1280, 900
MARKED_OBS = ("<|im_end|>\n<|im_start|>user\nYou pulled Phoenix and received 0.1. "
              "The game is over.<|im_end|>\n<|im_start|>assistant\n")
OBS_WORDS = "You pulled Phoenix and received 0.1."


def _record_chat_run(path: Path) -> str:
    """A bandit run whose observation carries ChatML's turn markers, in its turns and tokens."""
    rec = Recorder(path)
    run_id = rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo", "max_turns": 2},
                           name="chat-markers")
    actions = ["<answer>Phoenix</answer>", "<answer>Dragon</answer>"]
    turns = [dict(traj_id="c0", turn=t, action=a, observation=MARKED_OBS if t == 0 else "",
                  action_valid=True, action_type="answer") for t, a in enumerate(actions)]
    pieces = [("Pick an arm.", "prompt", -1), (actions[0], "action", 0),
              ("<|im_end|>", "observation", 0), ("\n<|im_start|>user\n", "observation", 0),
              (OBS_WORDS, "observation", 0), (actions[1], "action", 1)]
    tokens = [dict(traj_id="c0", pos=i, token_id=i + 1, text=text, role=role,
                   trained=role == "action", turn=turn, logprob=-0.5 if role == "action" else None)
              for i, (text, role, turn) in enumerate(pieces)]
    rec.record_step(0, metrics={"reward/mean": 0.0}, turns=turns, tokens=tokens,
                    trajectories=[dict(traj_id="c0", group_id="g0", task_id="arms", reward=0.0,
                                       success=False, num_turns=2, finish_reason="answered",
                                       split="train", prompt="Pick an arm.", answer="Dragon",
                                       failure_class="wrong_answer")])
    rec.finish("finished")
    return run_id


@pytest.fixture(scope="module")
def server():
    """(base URL, store path, {run name: run_id}) of an app on the demo store plus a run whose
    observations carry chat-template markers."""
    base = scratch_dir("browser-failures")
    stores = base / "stores"
    (ROOT / stores).mkdir(parents=True)
    store = stores / "demo.duckdb"
    names = dict(zip(RUN_NAMES, make_demo_store(ROOT / store)))
    names["chat-markers"] = _record_chat_run(ROOT / store)
    with served_app(base, [stores], base / "runs") as url:
        yield url, str(store), names


browser, page = browser_fixtures(WIDTH, HEIGHT)


def goto(page, server, path: str, title: str, run: str = "demo-search-starpo", **params) -> None:
    url, store, names = server
    query = urllib.parse.urlencode({"store": store, "run": names[run], **params})
    page.goto(f"{url}/{path}?{query}")
    page.get_by_role("heading", name=title, exact=True).first.wait_for(timeout=60_000)
    settle(page)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stSkeleton\"]')", timeout=30_000)
    page.wait_for_timeout(1000)          # tables and charts draw after the script has run


def results(page):
    grid = page.locator(".st-key-fail_results [data-testid='stDataFrameResizable']")
    grid.wait_for(timeout=30_000)
    return grid


def select_first_row(page) -> str:
    """Tick the first row's selection box (the grid draws on a canvas); the trajectory's id."""
    results(page).click(position={"x": 18, "y": 35 + 17})     # header row 35 px, then row 1
    heading = page.locator("[data-testid=stMain]").get_by_role(
        "heading", name=re.compile(r"^Trajectory \S+$"))
    heading.wait_for(timeout=30_000)
    settle(page)
    return heading.inner_text().split()[-1]


def open_turns(page) -> None:
    """Unfold the selected trajectory's turns where they are folded."""
    folded = page.get_by_text(re.compile(r"^All \d+ turns$"))
    if folded.count():
        folded.click()
        settle(page)


def search(page, text: str) -> None:
    box = page.locator(".st-key-fail_search input")
    box.fill(text)
    box.press("Enter")
    settle(page)


def doc_y(locator) -> dict:
    """Top and bottom of an element in page coordinates (independent of the scroll)."""
    return locator.evaluate("e => { const r = e.getBoundingClientRect();"
                            " return {top: r.top + scrollY, bottom: r.bottom + scrollY}; }")


# -- the tests -------------------------------------------------------------------------------------
def test_table_starts_with_the_failure_class_and_the_replay_link(page, server):
    goto(page, server, "failures", "Failures")
    grid = results(page)
    grid.locator("[role=columnheader]").first.wait_for(state="attached", timeout=30_000)
    headers = [h.strip() for h in
               grid.evaluate("d => [...d.querySelectorAll('[role=columnheader]')]"
                             ".map(e => e.textContent)") if h.strip()]
    assert headers[:2] == ["failure class", "Replay"], headers
    no_exception(page)


def test_a_selected_row_keeps_the_tag_form_and_exports_under_the_table(page, server):
    goto(page, server, "failures", "Failures")
    search(page, INVALID_FEEDBACK[:30])          # format errors: three turns, long observations
    select_first_row(page)
    table = doc_y(results(page))
    export = doc_y(page.get_by_role("button", name="Export matches as JSONL"))
    save = doc_y(page.get_by_role("button", name="Save tag"))
    print(f"below the table: exports +{export['top'] - table['bottom']:.0f} px, "
          f"Save tag +{save['bottom'] - table['bottom']:.0f} px")
    assert export["top"] - table["bottom"] < 120, (table, export)
    assert save["bottom"] - table["bottom"] < 520, (table, save)   # form whole in one window
    panel = page.locator(".st-key-fail_panel")
    link = panel.get_by_role("link", name=re.compile(r"^Open s\d\d-g\d-r\d in Replay$"))
    assert "replay?" in link.get_attribute("href")
    observation = panel.get_by_text(INVALID_FEEDBACK[:40]).first
    assert not observation.is_visible()           # the turns are folded away ...
    panel.get_by_text(re.compile(r"^All 3 turns$")).click()
    observation.wait_for(timeout=10_000)          # ... one click from reading
    no_exception(page)


def test_chat_markers_are_hidden_in_readable_views_and_kept_in_the_token_view(page, server):
    goto(page, server, "failures", "Failures", run="chat-markers")
    select_first_row(page)
    open_turns(page)
    main = page.locator("[data-testid=stMain]")
    main.get_by_text(OBS_WORDS).first.wait_for(timeout=10_000)
    codes = main.locator("[data-testid=stCode]").all_inner_texts()
    assert any(c.strip().startswith(OBS_WORDS) for c in codes), codes    # the observation
    assert not any("<|im_" in c for c in codes), codes
    goto(page, server, "replay", "Replay", run="chat-markers", step=0,
         traj="c0", turn=0)
    main = page.locator("[data-testid=stMain]")
    codes = main.locator("[data-testid=stCode]").all_inner_texts()
    assert any(c.strip().startswith(OBS_WORDS) for c in codes), codes    # the observation
    assert not any("<|im_" in c for c in codes), codes
    tokens = main.locator(".token-view").inner_text()
    assert "<|im_end|>" in tokens and "<|im_start|>" in tokens             # kept, as recorded
    no_exception(page)


def test_search_says_what_it_searches_and_how_it_combines(page, server):
    goto(page, server, "failures", "Failures")
    box = page.locator(".st-key-fail_search input")
    note = page.get_by_text(re.compile(r"^Searches the prompt, every turn's action and "
                                       r"observation, and the tags and notes"))
    text = note.inner_text()
    assert "case-insensitive" in text and "every filter above" in text, text
    assert 0 < doc_y(note)["top"] - doc_y(box)["bottom"] < 60     # said where the box is
    no_exception(page)


def test_replay_tag_box_saves_on_the_trajectory_shown(page, server):
    _, store, names = server
    goto(page, server, "replay", "Replay", step=4, traj=SCRIPT_TRAJ, turn=0)
    page.get_by_role("heading", name="Tags").wait_for(timeout=30_000)
    page.get_by_role("textbox", name="Tag").fill("from-replay")
    page.get_by_role("textbox", name="Note").fill("tagged while replaying")
    page.get_by_role("button", name="Save tag").click()
    page.get_by_text("Saved.").wait_for(timeout=30_000)
    settle(page)
    saved = queries.tags(store, names["demo-search-starpo"])
    assert saved[["traj_id", "tag", "note"]].values.tolist() == [
        [SCRIPT_TRAJ, "from-replay", "tagged while replaying"]]
    page.locator("[data-testid=stMain] [role=gridcell]").filter(
        has_text="tagged while replaying").first.wait_for(state="attached", timeout=10_000)
    no_exception(page)


def test_back_leaves_replay_in_one_press_to_the_failures_view_it_left(page, server):
    goto(page, server, "failures", "Failures")
    page.locator("[data-testid=stRadio]").get_by_text("failed", exact=True).click()
    settle(page)
    search(page, "capital of")
    traj = select_first_row(page)
    failures_url = page.url
    page.locator("[data-testid=stMain]").get_by_role(
        "link", name=re.compile(rf"^(Open {traj} in Replay|Replay {traj})$")).click()
    page.get_by_role("heading", name="Replay", exact=True).wait_for(timeout=60_000)
    settle(page)
    assert f"traj={traj}" in page.url
    if page.get_by_role("button", name="Next ▶").count():           # a view change in Replay
        page.get_by_role("button", name="Next ▶").click()
        page.get_by_text(re.compile(r"^Turn 1 of \d")).wait_for(timeout=30_000)
        settle(page)

    page.go_back()
    page.get_by_role("heading", name="Failures", exact=True).wait_for(timeout=60_000)
    settle(page, 1500)
    assert urllib.parse.urlparse(page.url).path == "/failures", page.url
    assert page.url == failures_url
    assert page.locator(".st-key-fail_search input").input_value() == "capital of"
    assert page.get_by_role("radio", name="failed").is_checked()
    page.get_by_role("heading", name=f"Trajectory {traj}").wait_for(timeout=30_000)
    no_exception(page)
