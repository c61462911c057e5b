"""Replay's pictures of a turn's state (pages/_boards.py, pages/_states.py): grid worlds read
back from their text and drawn as SVG, an environment's own picture shown only as an <img>, the
apps world's state diff as a table; hostile text comes out escaped or not drawn at all."""
from __future__ import annotations

import base64
import json
import re

from core.envs.games.frozenlake import FrozenLake
from core.envs.games.sokoban import Sokoban
from pages import _boards, _states

LAKE_PROMPT = ("Reach the goal G.\nTurn 1: State:\n_ _ P\n_ _ _\nO O G\nYou have 6 actions left.")


def test_a_frozenlake_prompt_gives_the_layout_and_the_start():
    board, start = _boards.start_of(LAKE_PROMPT)
    assert board.game == "frozenlake"
    assert board.cells == (("ice",) * 3, ("ice",) * 3, ("hole", "hole", "goal"))
    assert (start.turn, start.agent, start.actions_left) == (1, (0, 2), 6)


def test_states_follow_a_real_frozenlake_episode_with_its_slips_and_path():
    env = FrozenLake(slip=0.5, size=4)
    task = env.tasks("train", 1, 3)[0]
    ep = env.episode(task, seed=7)
    turns, positions = [], [ep.pos]
    for _ in range(6):
        result = ep.step(ep.expert_action())
        turns.append({"observation": result.observation, "info": json.dumps(result.info)})
        positions.append(ep.pos)
        if result.done:
            break
    board, states = _boards.trajectory_boards(ep.reset(), turns)
    assert [s.agent for s, _ in states] == positions
    # the env numbers states from 1 in its prompt: stored turn t leaves state t + 2
    assert [s.turn for s, _ in states] == list(range(1, len(states) + 1))
    # with the executed moves, the path goes cell by cell (no diagonal jumps)
    _, path = states[-1]
    assert path[0] == positions[0] and path[-1] == positions[-1]
    assert all(abs(a[0] - b[0]) + abs(a[1] - b[1]) <= 1 for a, b in zip(path, path[1:]))


def test_sokoban_boxes_and_targets_are_read_and_drawn():
    env = Sokoban()
    task = env.tasks("train", 1, 0)[0]
    ep = env.episode(task, seed=0)
    turns = []
    while not ep.done and len(turns) < 10:
        result = ep.step(ep.expert_action())
        turns.append({"observation": result.observation, "info": result.info})
    board, states = _boards.trajectory_boards(ep.reset(), turns)
    assert board.game == "sokoban" and ep.solved
    last, path = states[-1]
    assert last.agent == ep.player and last.boxes == ep.boxes
    targets = {(r, c) for r, row in enumerate(board.cells) for c, k in enumerate(row)
               if k == "target"}
    assert last.boxes <= targets                       # solved: every box on a target
    svg = _boards.board_svg(board, last, path, "solved")
    assert svg.count(f'fill="{_boards.BOX_ON}"') == len(last.boxes)


def test_without_recorded_moves_the_path_joins_the_turns_ends():
    board, start = _boards.start_of(LAKE_PROMPT)
    end = _boards.state_of(board, "Turn 2: State:\n_ _ _\n_ _ _\nO P G\nYou have 5 actions left.")
    assert _boards.walk(board, start, [], end) == [(0, 2), (2, 1)]
    # recorded moves that do not lead there are not trusted either
    assert _boards.walk(board, start, ["Left"], end) == [(0, 2), (2, 1)]
    assert _boards.walk(board, start, ["Down", "Down", "Left"], end) == [(0, 2), (1, 2), (2, 2),
                                                                         (2, 1)]


def test_odd_symbols_huge_grids_and_broken_blocks_draw_nothing():
    odd = LAKE_PROMPT.replace("_ _ P", "_ ! P")
    assert _boards.start_of(odd) is None
    side = _boards.MAX_SIDE + 1
    huge = "Turn 1: State:\n" + "\n".join([" ".join("_" * side)] * side) + "\nYou have 1 actions left."
    assert _boards.start_of(huge) is None
    ragged = "Turn 1: State:\n_ _ P\n_ _\nO O G\nYou have 6 actions left."
    assert _boards.start_of(ragged) is None
    wide_cells = "Turn 1: State:\n_ __ P\n_ _ _\nO O G\nYou have 6 actions left."
    assert _boards.start_of(wide_cells) is None
    assert _boards.start_of(None) is None and _boards.start_of("no state here") is None
    board, _ = _boards.start_of(LAKE_PROMPT)
    two_players = "Turn 2: State:\nP _ P\n_ _ _\nO O G\nYou have 5 actions left."
    assert _boards.state_of(board, two_players) is None
    other_shape = "Turn 2: State:\n_ P\n_ _\nYou have 5 actions left."
    assert _boards.state_of(board, other_shape) is None
    # a megabyte of text is searched at its end only, and quickly
    assert _boards.start_of("x" * 1_000_000 + LAKE_PROMPT)[1].agent == (0, 2)


def test_html_in_the_text_never_reaches_the_svg():
    hostile = LAKE_PROMPT.replace("_ _ P", "<script>alert(1)</script> _ P")
    assert _boards.start_of(hostile) is None
    board, start = _boards.start_of(LAKE_PROMPT)
    svg = _boards.board_svg(board, start, [start.agent], 'x"><script>alert(1)</script>')
    assert "<script" not in svg and "&lt;script&gt;" in svg and 'x&quot;&gt;' in svg
    # only our own tags, numbers and fixed colours
    assert set(re.findall(r"<(\w+)", svg)) <= {"svg", "title", "rect", "circle", "polyline"}


def test_an_environment_svg_is_only_an_image_and_a_table_is_escaped():
    evil = '<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'
    shown = _states.env_picture_html("svg", evil, 'a "label" <b>')
    assert shown.startswith('<img class="env-picture"') and "<script" not in shown
    assert "&quot;label&quot; &lt;b&gt;" in shown
    src = re.search(r'src="data:image/svg\+xml;base64,([^"]+)"', shown).group(1)
    assert base64.b64decode(src).decode() == evil                    # kept whole, inert
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 8).decode()
    assert 'src="data:image/png;base64,' in _states.env_picture_html("png", png, "p")
    assert _states.env_picture_html("png", base64.b64encode(b"GIF89a").decode(), "p") is None
    assert _states.env_picture_html("png", "not base64!", "p") is None
    assert _states.env_picture_html("html", "<b>x</b>", "p") is None
    table = _states.env_picture_html("table", json.dumps([{"<th>": "<img src=x onerror=1>"}]),
                                     "t")
    assert "<img" not in table and "&lt;img src=x onerror=1&gt;" in table
    assert "<th>&lt;th&gt;</th>" in table
    assert _states.env_picture_html("table", "{not json", "t") is None


def test_the_apps_state_diff_reads_as_one_row_per_changed_field():
    diff = [{"table": "wallet", "op": "update", "key": 1,
             "before": {"id": 1, "balance_cents": 500, "owner": "a"},
             "after": {"id": 1, "balance_cents": 400, "owner": "a"}},
            {"table": "notes", "op": "insert", "key": 7, "before": None,
             "after": {"id": 7, "text": "<script>x</script>"}},
            {"table": "todos", "op": "delete", "key": 2, "before": {"id": 2}, "after": None},
            "odd entry"]
    rows = _states.diff_rows(diff)
    assert rows[0] == {"table": "wallet", "row": 1, "change": "update",
                       "field": "balance_cents", "before": 500, "after": 400}
    assert [(r.get("table"), r.get("field")) for r in rows[1:]] == [
        ("notes", "id"), ("notes", "text"), ("todos", "id"), (None, None)]
    assert rows[4] == {"change": "(not a row change)", "after": "odd entry"}
    table = _states.html_table(rows, _states.DIFF_COLUMNS)
    assert "<script>" not in table and "&lt;script&gt;x&lt;/script&gt;" in table
    long = _states.html_table([{"after": "y" * 10_000}], ["after"])
    assert "y" * _states.MAX_CELL + "…" in long and "y" * (_states.MAX_CELL + 1) not in long


def test_the_environment_turn_is_read_from_the_observation():
    assert _states.env_turn("Turn 3: State:\n_ P\nG _\nYou have 2 actions left.") == 3
    assert _states.env_turn("no numbering") is None and _states.env_turn(None) is None


def test_notes_on_pictures_not_kept_are_read_for_the_turns_two_states():
    info = json.dumps({"render_notes": [{"turn": -1, "note": "raised"},
                                        {"turn": 3, "note": "too big"}, "odd"]})
    assert _states.render_notes(info, 0) == ["raised"]          # turn 0 acted from the reset
    assert _states.render_notes(info, 4) == ["too big"] and _states.render_notes(info, 1) == []
    assert _states.render_notes("{not json", 0) == [] and _states.render_notes(None, 0) == []
    assert _states.render_notes("[1, 2]", 0) == []


def test_frozenlake_slips_are_named_from_the_step_info():
    info = json.dumps({"executed": [{"intended": "Right", "actual": "Up"},
                                    {"intended": "Down", "actual": "Down"},
                                    {"intended": "<b>", "actual": "Up"}]})
    assert _boards.slips(info) == ["Right went Up"]
    assert _boards.executed_moves(info) == ["Up", "Down", "Up"]
    assert _boards.slips(None) == [] and _boards.slips("{broken") == []


def _lake_boards(steps: int = 6):
    env = FrozenLake(slip=0.5, size=4)
    ep = env.episode(env.tasks("train", 1, 3)[0], seed=7)
    turns = []
    for _ in range(steps):
        result = ep.step(ep.expert_action())
        turns.append({"observation": result.observation, "info": json.dumps(result.info)})
        if result.done:
            break
    return _boards.trajectory_boards(ep.reset(), turns), len(turns)


def test_the_filmstrip_shows_every_state_and_outlines_the_current_turn():
    import pandas as pd
    boards, n = _lake_boards()
    strip = _states.filmstrip_html(boards, pd.DataFrame(), n, current=1)
    alts = re.findall(r'alt="([^"]+)"', strip)
    assert alts == ["start"] + [f"after {k}" for k in range(n)]         # n turns: n + 1 states
    frames = re.findall(r'<img class="frame" alt="([^"]+)"[^>]*border:([^"]+)"', strip)
    rings = dict(frames)
    assert rings["after 1"].startswith("2px solid") and rings["after 0"].startswith("2px dashed")
    assert all(r.startswith("1px") for a, r in frames if a not in ("after 0", "after 1"))


def test_the_filmstrip_prefers_the_environment_pictures_and_drops_bad_ones():
    import pandas as pd
    svg = '<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"></svg>'
    renders = pd.DataFrame({"turn": [-1, 0, 1, 2], "kind": ["svg", "png", "svg", "table"],
                            "body": [svg, base64.b64encode(b"not a png").decode(), svg, "[]"]})
    strip = _states.filmstrip_html(None, renders, 3, current=0)
    assert re.findall(r'alt="([^"]+)"', strip) == ["start", "after 1"]  # the bad PNG and the table left out
    assert "<svg" not in strip                                          # only as data URIs
    assert _states.filmstrip_html(None, renders.iloc[:1], 3, current=0) is None  # one picture: no strip


def test_a_long_trajectory_s_filmstrip_is_a_window_around_the_turn():
    import pandas as pd
    svg = '<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"></svg>'
    n = 100
    renders = pd.DataFrame({"turn": range(-1, n), "kind": "svg", "body": svg})
    alts = re.findall(r'alt="([^"]+)"', _states.filmstrip_html(None, renders, n, current=60))
    assert len(alts) == _states.FILMSTRIP_MAX and "after 60" in alts and "after 59" in alts
    alts = re.findall(r'alt="([^"]+)"', _states.filmstrip_html(None, renders, n, current=99))
    assert alts[-1] == "after 99" and len(alts) == _states.FILMSTRIP_MAX
