"""Grid worlds' states read back from their text and drawn as small SVG boards, for Replay.

FrozenLake and Sokoban (core/envs/games/) write every state as RAGEN's block

    Turn k: State:
    _ _ P
    _ _ _
    O O G
    You have N actions left.

so any store that kept a trajectory's prompt and observations (old ones, imported JSONL runs)
can be drawn without the environment: the prompt's block gives the fixed layout (holes and goal,
walls and targets), each observation's block where the player and the boxes are after a turn.
Pure functions, no Streamlit. The text is untrusted: a block is read only when it is a rectangle
of at most ``MAX_SIDE`` cells a side, each one a symbol of the game; anything else yields None
(no picture), and the SVG is built only from those symbols' fixed colours and integers.
"""
from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass

MAX_SIDE = 32
"""FrozenLake's largest lake (core/envs/games/frozenlake.py OPTIONS); Sokoban's is 12."""
MAX_TEXT = 20_000
"""Only a text's last characters are searched: the state block ends every prompt and
observation, and a block of 32 x 32 cells is about 2 KB."""
_STATE = re.compile(r"Turn (\d{1,6}): State:\n((?:[^\n]{1,80}\n){1,32})You have (\d{1,9}) actions? "
                    r"left")
FROZENLAKE = {"_": "ice", "O": "hole", "G": "goal", "P": "ice"}
SOKOBAN = {"#": "wall", "_": "floor", "O": "target", "X": "floor", "*": "target", "P": "floor",
           "S": "target"}
"""Each symbol -> the fixed cell under it (a player or a box stands on floor or a target)."""
COLOURS = {"ice": "#dcecf7", "hole": "#22405c", "goal": "#f2c14e", "wall": "#6d5d4b",
           "floor": "#f1ece3", "target": "#f1ece3"}
AGENT, PATH, BOX, BOX_ON, TARGET_RING = "#d9480f", "#d9480f", "#b07a3b", "#2f8f55", "#c2410c"
MOVES = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}

Cell = tuple[int, int]


@dataclass(frozen=True)
class Board:
    """A level's fixed layout, read from the state its episode started in."""
    game: str
    """frozenlake | sokoban"""
    cells: tuple[tuple[str, ...], ...]
    """Fixed kind of every cell (ice, hole, goal | wall, floor, target), by row."""


@dataclass(frozen=True)
class State:
    turn: int
    """The environment's turn number in the text (its first prompt is turn 1)."""
    agent: Cell
    boxes: frozenset[Cell]
    actions_left: int


def state_block(text) -> tuple[int, list[list[str]], int] | None:
    """The last ``Turn k: State`` block of ``text``: (k, rows of symbols, actions left), or None
    when there is none or it is not a rectangle of single symbols at most ``MAX_SIDE`` a side."""
    if not isinstance(text, str):
        return None
    matches = list(_STATE.finditer(text[-MAX_TEXT:]))
    if not matches:
        return None
    turn, body, left = matches[-1].groups()
    rows = [line.split(" ") for line in body.rstrip("\n").split("\n")]
    width = len(rows[0])
    if (width > MAX_SIDE or len(rows) > MAX_SIDE
            or any(len(r) != width or any(len(ch) != 1 for ch in r) for r in rows)):
        return None
    return int(turn), rows, int(left)


def start_of(prompt) -> tuple[Board, State] | None:
    """The board and starting state of a grid-world trajectory from its prompt, or None when the
    prompt holds no FrozenLake or Sokoban state."""
    block = state_block(prompt)
    if block is None:
        return None
    turn, rows, left = block
    symbols = {ch for row in rows for ch in row}
    flat = [ch for row in rows for ch in row]
    if "#" in symbols and symbols <= set(SOKOBAN):
        game, table = "sokoban", SOKOBAN
    elif symbols <= set(FROZENLAKE) and flat.count("G") == 1:
        game, table = "frozenlake", FROZENLAKE
    else:
        return None
    board = Board(game, tuple(tuple(table[ch] for ch in row) for row in rows))
    state = state_of(board, prompt)
    return None if state is None else (board, state)


def state_of(board: Board, text) -> State | None:
    """Where the player (and the boxes) are in the last state block of ``text``; None when the
    text has none that fits ``board`` (another shape, unknown symbols, not one player)."""
    block = state_block(text)
    if block is None:
        return None
    turn, rows, left = block
    table = SOKOBAN if board.game == "sokoban" else FROZENLAKE
    if len(rows) != len(board.cells) or len(rows[0]) != len(board.cells[0]):
        return None
    agents, boxes = [], set()
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            if ch not in table:
                return None
            if ch in "PS":
                agents.append((r, c))
            if ch in "X*":
                boxes.add((r, c))
    return State(turn, agents[0], frozenset(boxes), left) if len(agents) == 1 else None


def walk(board: Board, start: State, moves: list[str], end: State) -> list[Cell]:
    """The cells the player crossed on the way from ``start`` to ``end``: ``moves`` (the
    executed ones a turn's info recorded) replayed on the board, when they lead to ``end``;
    else just the two end cells (a store without the moves, or moves that do not fit)."""
    pos, boxes, path = start.agent, set(start.boxes), [start.agent]
    rows, cols = len(board.cells), len(board.cells[0])
    for move in moves:
        if move not in MOVES:
            return [start.agent, end.agent]
        dr, dc = MOVES[move]
        nxt = (pos[0] + dr, pos[1] + dc)
        if not (0 <= nxt[0] < rows and 0 <= nxt[1] < cols) or _cell(board, nxt) == "wall":
            continue
        if nxt in boxes:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if beyond in boxes or _cell(board, beyond) in (None, "wall"):
                continue
            boxes = (boxes - {nxt}) | {beyond}
        pos = nxt
        path.append(pos)
    return path if pos == end.agent else [start.agent, end.agent]


def _cell(board: Board, pos: Cell) -> str | None:
    r, c = pos
    if 0 <= r < len(board.cells) and 0 <= c < len(board.cells[0]):
        return board.cells[r][c]
    return None


def _executed(info) -> list[dict]:
    """A grid turn's ``executed`` entries from its step info (a dict or its stored JSON); []
    when not recorded (stores before schema 3)."""
    if isinstance(info, str) and len(info) < 100_000:
        try:
            info = json.loads(info)
        except ValueError:
            return []
    done = info.get("executed") if isinstance(info, dict) else None
    return [e for e in done[:64] if isinstance(e, dict)] if isinstance(done, list) else []


def executed_moves(info) -> list[str]:
    """The moves a grid turn really made: FrozenLake's ``actual`` (after slips), Sokoban's
    ``action``."""
    moves = [e.get("actual", e.get("action")) for e in _executed(info)]
    return [m for m in moves if isinstance(m, str)]


def slips(info) -> list[str]:
    """FrozenLake's slips in a turn, as 'Right went Up' (only known names: the text is shown)."""
    return [f"{e['intended']} went {e['actual']}" for e in _executed(info)
            if e.get("intended") in MOVES and e.get("actual") in MOVES
            and e["intended"] != e["actual"]]


def board_svg(board: Board, state: State, path: list[Cell], label: str) -> str:
    """``state`` on ``board`` as an SVG: cells coloured by kind, targets ringed, boxes as
    squares, the player as a dot, and ``path`` (cells visited so far, in order) as a line with
    a mark on each cell. ``label`` becomes the accessible title (escaped here)."""
    rows, cols = len(board.cells), len(board.cells[0])
    size = max(10, min(40, 240 // max(rows, cols)))
    w, h = cols * size, rows * size
    half = size / 2
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="board" width="{w}" height="{h}" '
             f'viewBox="0 0 {w} {h}" role="img" aria-label="{_esc(label)}">'
             f'<title>{_esc(label)}</title>']
    for r, row in enumerate(board.cells):
        for c, kind in enumerate(row):
            x, y = c * size, r * size
            parts.append(f'<rect x="{x}" y="{y}" width="{size}" height="{size}" '
                         f'fill="{COLOURS[kind]}" stroke="#ffffff" stroke-width="1"/>')
            if kind == "target":
                parts.append(f'<circle cx="{x + half}" cy="{y + half}" r="{size * 0.3:.1f}" '
                             f'fill="none" stroke="{TARGET_RING}" stroke-width="2"/>')
    for r, c in sorted(state.boxes):
        fill = BOX_ON if board.cells[r][c] == "target" else BOX
        parts.append(f'<rect x="{c * size + size * 0.15:.1f}" y="{r * size + size * 0.15:.1f}" '
                     f'width="{size * 0.7:.1f}" height="{size * 0.7:.1f}" rx="3" fill="{fill}"/>')
    if len(path) > 1:
        points = " ".join(f"{c * size + half:.1f},{r * size + half:.1f}" for r, c in path)
        parts.append(f'<polyline class="path" points="{points}" fill="none" stroke="{PATH}" '
                     f'stroke-opacity="0.55" stroke-width="{max(2, size // 8)}" '
                     'stroke-linejoin="round" stroke-linecap="round"/>')
    for r, c in dict.fromkeys(path[:-1]):
        parts.append(f'<circle cx="{c * size + half:.1f}" cy="{r * size + half:.1f}" '
                     f'r="{max(1.5, size * 0.09):.1f}" fill="{PATH}" fill-opacity="0.7"/>')
    ar, ac = state.agent
    parts.append(f'<circle class="agent" cx="{ac * size + half:.1f}" cy="{ar * size + half:.1f}" '
                 f'r="{size * 0.28:.1f}" fill="{AGENT}" stroke="#ffffff" stroke-width="2"/>')
    return "".join(parts) + "</svg>"


def _esc(text: str) -> str:
    return html.escape(str(text)[:200], quote=True)


def trajectory_boards(prompt, turns: list[dict]
                      ) -> tuple[Board, list[tuple[State, list[Cell]] | None]] | None:
    """A grid-world trajectory's board and, per state, the state and the path up to it: index 0
    the start (from ``prompt``), index t + 1 the state after stored turn t (None where that
    observation holds no state that fits, e.g. cut short). None when the prompt holds no grid
    world's state."""
    start = start_of(prompt)
    if start is None:
        return None
    board, first = start
    states: list = [(first, [first.agent])]
    last, path = first, [first.agent]
    for t in turns:
        state = state_of(board, t.get("observation"))
        if state is None:
            states.append(None)
            continue
        path = path + walk(board, last, executed_moves(t.get("info")), state)[1:]
        states.append((state, path))
        last = state
    return board, states
