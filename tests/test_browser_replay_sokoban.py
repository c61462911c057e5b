"""Replay draws a Sokoban trajectory in a real headless Chromium: a store recorded at test time
from the scripted expert solving a level (no sample store holds Sokoban) shows, at every turn, the
level before and after the move as images that load; on the last turn every box stands on a
target, drawn as such, the turn headings name the environment's own turns, and a filmstrip
shows every state in one row.

Run alone: ``.venv/bin/python -m pytest -q tests/test_browser_replay_sokoban.py``.
"""
from __future__ import annotations

import base64
import re
import urllib.parse

import pytest

from core.envs.games.sokoban import Sokoban
from pages import _boards
from storage.recorder import Recorder
from tests.browser_harness import ROOT, browser_fixtures, scratch_dir, served_app
from tests.test_browser import no_exception, settle

pytestmark = pytest.mark.browser


def _record_expert(path) -> tuple[str, int, int]:
    """(run id, boxes, turns) of one level the expert solves, recorded as the trainer records turns."""
    env = Sokoban()
    task = env.tasks("train", 1, 0)[0]
    ep = env.episode(task, seed=0)
    prompt, turns = ep.reset(), []
    while not ep.done and len(turns) < 20:
        action = ep.expert_action()
        result = ep.step(action)
        turns.append({"traj_id": "expert", "turn": len(turns), "action": action,
                      "observation": result.observation, "action_valid": result.valid,
                      "action_type": result.action_type, "info": result.info,
                      "step_reward": result.reward})
    assert ep.solved and len(turns) >= 2
    rec = Recorder(path)
    run_id = rec.start_run({"env": "sokoban", "model": "expert", "algo": "grpo"},
                           name="sokoban expert")
    rec.record_step(0, trajectories=[{
        "traj_id": "expert", "group_id": "g", "task_id": task.task_id, "reward": 1.0,
        "success": True, "num_turns": len(turns), "split": "train", "prompt": prompt,
        "finish_reason": "answered"}], turns=turns)
    rec.finish()
    return run_id, len(ep.boxes), len(turns)


@pytest.fixture(scope="module")
def server():
    base = scratch_dir("browser-replay-sokoban")
    (ROOT / base / "stores").mkdir(parents=True)
    store = base / "stores" / "sokoban.duckdb"
    recorded = _record_expert(ROOT / store)
    with served_app(base, [base / "stores"], base / "runs") as url:
        yield url, str(store), recorded


browser, page = browser_fixtures(1280, 1000)


def _boards_shown(page) -> list[tuple[str, str]]:
    """(alt, SVG text) of each board image, once every one has loaded."""
    boards = page.locator("img.board")
    boards.first.wait_for(timeout=30_000)
    page.wait_for_function("() => [...document.querySelectorAll('img.board')]"
                           ".every(i => i.complete && i.naturalWidth > 0)", timeout=30_000)
    out = []
    for i in range(boards.count()):
        src = boards.nth(i).get_attribute("src")
        assert src.startswith("data:image/svg+xml;base64,")
        out.append((boards.nth(i).get_attribute("alt"),
                    base64.b64decode(src.split(",", 1)[1]).decode("utf-8")))
    return out


def test_a_solved_sokoban_level_is_drawn_turn_by_turn(page, server):
    url, store, (run_id, n_boxes, n) = server
    last = n - 1
    query = urllib.parse.urlencode({"store": store, "run": run_id, "step": 0, "traj": "expert",
                                    "turn": last})
    page.goto(f"{url}/replay?{query}")
    page.get_by_role("heading", name="Replay", exact=True).first.wait_for(timeout=60_000)
    settle(page)
    page.get_by_text(re.compile(rf"^Turn {last} of {n}")).first.wait_for(timeout=30_000)
    shown = _boards_shown(page)
    assert [alt for alt, _ in shown] == [
        f"Before the action: the environment's turn {last + 1} state",
        f"After the action: the environment's turn {last + 2} state"]
    before, after = shown[0][1], shown[1][1]
    # solved by this move: every box on a target after it, one fewer before
    assert after.count(f'fill="{_boards.BOX_ON}"') == n_boxes
    assert before.count(f'fill="{_boards.BOX_ON}"') == n_boxes - 1
    main = page.locator("[data-testid=stMain]").inner_text()
    assert "a box (green on a target)" in main                 # the Sokoban legend
    # the filmstrip: every state in one row, the last move's result outlined
    frames = page.locator("img.frame")
    assert [frames.nth(i).get_attribute("alt") for i in range(frames.count())] == \
        ["start"] + [f"after {k}" for k in range(n)]
    assert "solid" in frames.nth(n).get_attribute("style")
    page.wait_for_function("() => [...document.querySelectorAll('img.frame')]"
                           ".every(i => i.complete && i.naturalWidth > 0)", timeout=30_000)
    # the first turn draws the start, and Prev walks back to it
    page.get_by_role("slider", name="Turn").focus()
    page.keyboard.press("Home")
    page.get_by_text(re.compile(rf"^Turn 0 of {n}")).first.wait_for(timeout=30_000)
    settle(page)
    assert _boards_shown(page)[0][0] == "Before the action: the environment's turn 1 state"
    no_exception(page)
