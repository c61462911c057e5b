"""Sokoban (RAGEN): push the box onto the target in a small walled room.

Rewards per action (RAGEN, after gym-sokoban): -0.1 for every move, +1 when a push puts a box on a
target, -1 when a push takes one off, +10 more when every box is on a target (the episode ends).
Moving into a wall or an immovable box wastes the move. Invalid output costs -0.1 and no action.

Levels: a 6x6 room (walls around a 4x4 floor, a few inner walls), one box and one target placed at
random, kept only when a breadth-first search over (player, boxes) states solves it in 2 to 9
moves. A level belongs to train or heldout by the digest of its layout, so the splits never share
one. The same search is the expert: from the current state it answers the next moves of a
shortest solution, so it solves every level (tests/test_grid_envs.py checks all generated ones).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from core.envs.base import Outcome, StepResult, Task, register
from core.envs.games.grid import (INVALID_PENALTY, MOVES, check_count, check_split, digest,
                            format_help, parse_answer, render, seeded_rng, split_of, state_block,
                            step_to)
from core.envs.options import Option, take_options

ACTIONS = tuple(MOVES)
STEP_PENALTY = -0.1
BOX_ON_TARGET = 1.0
BOX_OFF_TARGET = -1.0
SOLVED_BONUS = 10.0
WALL, FLOOR, TARGET, BOX, BOX_ON, PLAYER, PLAYER_ON = "#", "_", "O", "X", "*", "P", "S"

Pos = tuple[int, int]


@dataclass(frozen=True)
class Level:
    walls: frozenset[Pos]
    targets: frozenset[Pos]
    boxes: frozenset[Pos]
    player: Pos
    size: tuple[int, int]

    @classmethod
    def parse(cls, rows: list[str]) -> "Level":
        """Read a level from its symbol rows (no spaces); raises ValueError when malformed."""
        if not rows or any(len(row) != len(rows[0]) for row in rows):
            raise ValueError("sokoban level rows must be a non-empty rectangle")
        cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
        if set(cells.values()) - {WALL, FLOOR, TARGET, BOX, BOX_ON, PLAYER, PLAYER_ON}:
            raise ValueError(f"sokoban level has unknown symbols: {''.join(rows)!r}")
        at = lambda *symbols: frozenset(p for p, ch in cells.items() if ch in symbols)  # noqa: E731
        players, boxes, targets = at(PLAYER, PLAYER_ON), at(BOX, BOX_ON), at(TARGET, BOX_ON, PLAYER_ON)
        if len(players) != 1 or not boxes or len(boxes) != len(targets):
            raise ValueError("sokoban level needs one player and as many boxes as targets")
        edge = {p for p in cells if p[0] in (0, len(rows) - 1) or p[1] in (0, len(rows[0]) - 1)}
        if any(cells[p] != WALL for p in edge):
            raise ValueError("sokoban level must be enclosed by walls")
        return cls(at(WALL), targets, boxes, next(iter(players)), (len(rows), len(rows[0])))

    def rows(self, player: Pos | None = None, boxes: frozenset[Pos] | None = None) -> list[list[str]]:
        player = self.player if player is None else player
        boxes = self.boxes if boxes is None else boxes
        grid = [[WALL if (r, c) in self.walls else TARGET if (r, c) in self.targets else FLOOR
                 for c in range(self.size[1])] for r in range(self.size[0])]
        for r, c in boxes:
            grid[r][c] = BOX_ON if (r, c) in self.targets else BOX
        grid[player[0]][player[1]] = PLAYER_ON if player in self.targets else PLAYER
        return grid


def move(level: Level, player: Pos, boxes: frozenset[Pos], action: str) -> tuple[Pos, frozenset[Pos], bool]:
    """One action: (new player, new boxes, pushed). Walls and boxes that can't move stop it."""
    nxt = step_to(player, action)
    if nxt in level.walls:
        return player, boxes, False
    if nxt in boxes:
        beyond = step_to(nxt, action)
        if beyond in level.walls or beyond in boxes:
            return player, boxes, False
        return nxt, (boxes - {nxt}) | {beyond}, True
    return nxt, boxes, False


def solve(level: Level, player: Pos, boxes: frozenset[Pos], limit: int = 200_000) -> list[str] | None:
    """Fewest-moves solution by breadth-first search over (player, boxes); None if unsolvable."""
    start = (player, boxes)
    parent: dict = {start: None}
    queue = deque([start])
    while queue and len(parent) < limit:
        state = queue.popleft()
        if state[1] <= level.targets:
            plan = []
            while parent[state] is not None:
                state, action = parent[state]
                plan.append(action)
            return plan[::-1]
        for action in ACTIONS:
            p, b, _ = move(level, *state, action)
            if (p, b) not in parent:
                parent[(p, b)] = (state, action)
                queue.append((p, b))
    return None


def random_level(rng, size: int = 6, boxes: int = 1, inner_walls: int = 2,
                 moves: tuple[int, int] = (2, 9)) -> tuple[Level, int]:
    """A random enclosed room solvable in ``moves`` (inclusive) moves, with its solution length."""
    floor = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
    border = frozenset((r, c) for r in range(size) for c in range(size)) - set(floor)
    while True:
        picks = rng.sample(floor, 1 + 2 * boxes + rng.randint(0, inner_walls))
        player, targets = picks[0], frozenset(picks[1:1 + boxes])
        box_cells = frozenset(picks[1 + boxes:1 + 2 * boxes])
        level = Level(border | frozenset(picks[1 + 2 * boxes:]), targets, box_cells, player, (size, size))
        plan = solve(level, player, box_cells)
        if plan is not None and moves[0] <= len(plan) <= moves[1]:
            return level, len(plan)


@register("sokoban")
class Sokoban:
    """Environment factory; options: ``OPTIONS``. ``seed`` and ``topk`` are the arguments every
    environment is built with (core/config/env_options.py's env_kwargs); levels take their own seed and
    nothing is retrieved, so neither changes anything."""

    name = "sokoban"
    stop_tags = ("</answer>",)
    observation_role = "user"
    OPTIONS = {
        "size": Option(int, 5, 12, default=6, doc="the room's side, walls included"),
        "max_actions": Option(int, 1, 10 ** 6, default=15, doc="moves per episode"),
        "actions_per_turn": Option(int, 1, 20, default=3, doc="moves one answer may give"),
    }
    """Bounds: a room needs 5 x 5 for its 3 x 3 floor to hold the player, a box, a target and
    the inner walls random_level places (at 4, drawing a level raised ValueError); generation
    solves each candidate level by breadth-first search, which grows fast with the room (8
    tasks: 0.18 s at 10, 0.77 s at 12, 7.7 s at 16), so 12 is the cap; 20 moves a turn is more
    than a level's whole solution (2-9 moves); max_actions only counts (max_turns ends an
    episode anyway)."""

    def __init__(self, seed: int = 0, topk: int = 3, **options):
        opts = take_options(self.name, self.OPTIONS, options)
        size, max_actions, actions_per_turn = (opts["size"], opts["max_actions"],
                                               opts["actions_per_turn"])
        self.seed, self.size = seed, size
        self.max_actions, self.actions_per_turn = max_actions, actions_per_turn
        self._plans: dict[tuple, list[str] | None] = {}
        self.system_prompt = (
            "You are solving Sokoban shown as a grid. Symbols: # is a wall, _ is floor, O is a "
            "target, X is a box, * is a box on a target, P is you, S is you standing on a target. "
            "Push every box onto a target: walking into a box pushes it one cell, if the cell "
            "behind it is free. Boxes cannot be pulled, so never push one into a corner. "
            "You may think first inside <think>...</think>. " + format_help(ACTIONS, actions_per_turn))

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        check_count(n)
        rng = seeded_rng("sokoban-tasks", self.size, split, seed)
        tasks, seen = [], set()
        for _ in range(200 * n + 1000):
            if len(tasks) == n:
                break
            level, optimal = random_level(rng, self.size)
            rows = ["".join(row) for row in level.rows()]
            key = "/".join(rows)
            if key in seen or split_of(key) != split:
                continue
            seen.add(key)
            tasks.append(Task(task_id=f"sokoban-{digest(key)[:12]}", prompt=self._first_message(level),
                              split=split, meta={"rows": rows, "optimal_moves": optimal}))
        if len(tasks) < n:
            raise ValueError(f"sokoban: could only make {len(tasks)} distinct {split} levels")
        return tasks

    def episode(self, task: Task, seed: int) -> "SokobanEpisode":
        return SokobanEpisode(self, task, seed)

    def plan(self, level: Level, player: Pos, boxes: frozenset[Pos]) -> list[str] | None:
        """Memoised shortest solution from a state (episodes of one group revisit states)."""
        key = (level, player, boxes)
        if key not in self._plans:
            if len(self._plans) >= 4096:
                self._plans.clear()
            self._plans[key] = solve(level, player, boxes)
        return self._plans[key]

    def _first_message(self, level: Level) -> str:
        return "Push the box onto the target.\n" + state_block(1, render(level.rows()), self.max_actions)


class SokobanEpisode:
    def __init__(self, env: Sokoban, task: Task, seed: int):
        try:
            self.level = Level.parse(list(task.meta["rows"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"sokoban task {task.task_id!r}: malformed level in meta ({exc})") from exc
        self.env, self.task, self.seed = env, task, seed  # sokoban is deterministic: seed unused
        self.player, self.boxes = self.level.player, self.level.boxes
        self.turn, self.moves, self.pushes, self.total_reward = 1, 0, 0, 0.0
        self.done = False

    # -- protocol -------------------------------------------------------------------------------
    def reset(self) -> str:
        return self.env._first_message(self.level)

    def step(self, action_text: str) -> StepResult:
        if self.done:
            raise RuntimeError("sokoban: step() after the episode ended")
        self.turn += 1
        parsed = parse_answer(action_text, ACTIONS, self.env.actions_per_turn)
        if parsed.error:
            self.total_reward += INVALID_PENALTY
            text = (f"Invalid action: {parsed.error}. {format_help(ACTIONS, self.env.actions_per_turn)}\n"
                    + state_block(self.turn, self.state_key(), self.actions_left))
            return StepResult(text, done=False, valid=False, action_type="invalid",
                              parsed={"actions": [], "raw": parsed.raw}, reward=INVALID_PENALTY,
                              error=parsed.error, state_key=self.state_key())
        reward, executed = 0.0, []
        for action in parsed.actions:
            delta = self._apply(action)
            reward += delta
            executed.append({"action": action, "reward": round(delta, 6)})
            if self.solved or self.actions_left == 0:
                self.done = True
                break
        self.total_reward += reward
        text = state_block(self.turn, self.state_key(), self.actions_left)
        if self.done:
            text += "\n" + ("All boxes are on targets. Solved!" if self.solved
                            else "No actions left. The game is over.")
        return StepResult(text, done=self.done, valid=True,
                          action_type="move",
                          parsed={"actions": parsed.actions, "dropped": parsed.dropped},
                          reward=round(reward, 6), info={"executed": executed},
                          state_key=self.state_key())

    def outcome(self) -> Outcome:
        on_target = len(self.boxes & self.level.targets) / len(self.boxes)
        return Outcome(score=1.0 if self.solved else 0.0, success=self.solved, process=on_target,
                       info={"total_env_reward": round(self.total_reward, 6), "moves": self.moves,
                             "pushes": self.pushes, "turns": self.turn - 1,
                             "optimal_moves": self.task.meta.get("optimal_moves")})

    def expert_action(self) -> str:
        """The next moves of a shortest solution from the current state."""
        plan = self.env.plan(self.level, self.player, self.boxes)
        moves = (plan or [])[: min(self.env.actions_per_turn, self.actions_left)]
        return f"<answer>{' || '.join(moves or self._any_move())}</answer>"

    # -- helpers --------------------------------------------------------------------------------
    @property
    def solved(self) -> bool:
        return self.boxes <= self.level.targets

    @property
    def actions_left(self) -> int:
        return self.env.max_actions - self.moves

    def state_key(self) -> str:
        """The bare state (grid text), for grouping identical states across rollouts (GiGPO)."""
        return render(self.level.rows(self.player, self.boxes))

    def _apply(self, action: str) -> float:
        """r = -0.1 per move, +1 box onto target, -1 box off target, +10 when all are on targets."""
        before = len(self.boxes & self.level.targets)
        self.player, self.boxes, pushed = move(self.level, self.player, self.boxes, action)
        self.moves += 1
        self.pushes += pushed
        after = len(self.boxes & self.level.targets)
        reward = STEP_PENALTY
        reward += BOX_ON_TARGET * max(0, after - before) + BOX_OFF_TARGET * max(0, before - after)
        return reward + (SOLVED_BONUS if self.solved else 0.0)

    def _any_move(self) -> list[str]:
        # A dead end (box in a corner): no plan exists; answer a move that at least changes the state.
        for action in ACTIONS:
            if move(self.level, self.player, self.boxes, action)[:2] != (self.player, self.boxes):
                return [action]
        return [ACTIONS[0]]
