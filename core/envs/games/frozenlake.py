"""FrozenLake (RAGEN): walk a 4x4 slippery lake to the goal without falling into a hole.

Dynamics (RAGEN's slippery FrozenLake): the intended move happens with probability 0.8, otherwise
one of the two perpendicular moves, 0.1 each; a move into the edge stays put. Entering a hole ends
the episode with nothing; reaching the goal ends it with step reward +1 (no other rewards, no step
cost). Slips come from a RNG seeded by (task id, episode seed), so a trajectory replays exactly.

Levels: random lakes (each cell a hole with probability 0.2, start and goal at random cells at
least 2 apart) kept only when BFS finds a hole-free path. A lake belongs to train or heldout by
the digest of its layout, so the two splits never share one.

Expert: finite-horizon value iteration gives V(cell, actions left), the probability of reaching
the goal in time under optimal play. Each turn the expert answers the sequence of moves (up to
``actions_per_turn``) committed blindly that keeps the success probability within 0.03 of the best
single move, the longest such; it replans every turn from the real cell, so it works after slips.
No policy wins every slippery episode; the expert's measured rate is in tests/test_grid_envs.py.
"""
from __future__ import annotations

import itertools
from collections import deque

from core.envs.base import Outcome, StepResult, Task, register
from core.envs.games.grid import (INVALID_PENALTY, MOVES, PERPENDICULAR, check_count,
                            check_split, digest, format_help, parse_answer, render, seeded_rng,
                            split_of, state_block, step_to)
from core.envs.options import Option, take_options

ACTIONS = tuple(MOVES)
FROZEN, HOLE, GOAL = "F", "H", "G"
SYMBOLS = {FROZEN: "_", HOLE: "O", GOAL: "G"}
GOAL_REWARD = 1.0
HOLE_PROB = 0.2
MACRO_TOLERANCE = 0.03


def _neighbours(lake: tuple[str, ...], pos: tuple[int, int], move: str) -> tuple[int, int]:
    """Where ``move`` leads from ``pos``; the edge of the lake stops the player."""
    r, c = step_to(pos, move)
    return (r, c) if 0 <= r < len(lake) and 0 <= c < len(lake[0]) else pos


def shortest_path(lake: tuple[str, ...], start: tuple[int, int]) -> int | None:
    """Fewest moves from start to the goal avoiding holes (BFS, no slips); None if unreachable."""
    seen, queue = {start: 0}, deque([start])
    while queue:
        pos = queue.popleft()
        if lake[pos[0]][pos[1]] == GOAL:
            return seen[pos]
        for move in ACTIONS:
            nxt = _neighbours(lake, pos, move)
            if nxt not in seen and lake[nxt[0]][nxt[1]] != HOLE:
                seen[nxt] = seen[pos] + 1
                queue.append(nxt)
    return None


def random_lake(rng, size: int = 4) -> tuple[tuple[str, ...], tuple[int, int]]:
    """A random lake with a hole-free path from start to goal (rejection sampling)."""
    cells = [(r, c) for r in range(size) for c in range(size)]
    while True:
        start, goal = rng.sample(cells, 2)
        if abs(start[0] - goal[0]) + abs(start[1] - goal[1]) < 2:
            continue
        grid = [[HOLE if rng.random() < HOLE_PROB else FROZEN for _ in range(size)] for _ in range(size)]
        grid[start[0]][start[1]] = FROZEN
        grid[goal[0]][goal[1]] = GOAL
        lake = tuple("".join(row) for row in grid)
        if shortest_path(lake, start) is not None:
            return lake, start


class _Planner:
    """Finite-horizon value iteration on one lake with slip probability ``slip`` (memoised)."""

    def __init__(self, lake: tuple[str, ...], slip: float):
        self.lake, self.slip = lake, slip
        self._values: dict[tuple[tuple[int, int], int], float] = {}
        self._dists: dict[tuple[int, int], int] = {}

    def outcomes(self, pos, move):
        side = self.slip / 2
        return [(1 - self.slip, _neighbours(self.lake, pos, move))] + [
            (side, _neighbours(self.lake, pos, m)) for m in PERPENDICULAR[move]]

    def value(self, pos: tuple[int, int], left: int) -> float:
        """V(pos, left) = P(reach the goal within ``left`` actions) acting optimally from pos.

        V = 1 at the goal; 0 in a hole or with no actions left;
        else V(s, n) = max_a sum_s' P(s' | s, a) V(s', n - 1)."""
        key = (pos, left)
        if key not in self._values:
            cell = self.lake[pos[0]][pos[1]]
            if cell in (GOAL, HOLE) or left == 0:
                self._values[key] = 1.0 if cell == GOAL else 0.0
            else:
                self._values[key] = max(self.q(pos, move, left) for move in ACTIONS)
        return self._values[key]

    def q(self, pos, move, left) -> float:
        return sum(p * self.value(nxt, left - 1) for p, nxt in self.outcomes(pos, move))

    def sequence_value(self, pos, left: int, moves: tuple[str, ...]) -> float:
        """P(reach the goal) when ``moves`` are committed blindly (one turn), then optimal play:
        the slip outcomes are propagated exactly, and the game stops at the goal or a hole."""
        reached, spread = 0.0, {pos: 1.0}
        for move in moves:
            nxt_spread: dict[tuple[int, int], float] = {}
            for here, p_here in spread.items():
                for p, nxt in self.outcomes(here, move):
                    cell = self.lake[nxt[0]][nxt[1]]
                    if cell == GOAL:
                        reached += p_here * p
                    elif cell != HOLE:
                        nxt_spread[nxt] = nxt_spread.get(nxt, 0.0) + p_here * p
            spread = nxt_spread
        return reached + sum(p * self.value(here, left - len(moves)) for here, p in spread.items())

    def macro(self, pos, left: int, most: int, tolerance: float = MACRO_TOLERANCE) -> tuple[str, ...]:
        """The moves to answer in one turn. Committing several moves blind is never better than
        one (a slip can't be corrected mid-turn) but turns are scarce, so take the longest
        best sequence whose success probability is within ``tolerance`` of the best single move."""
        best: dict[int, tuple[float, tuple[str, ...]]] = {}
        for length in range(1, min(most, left) + 1):
            best[length] = max(((self.sequence_value(pos, left, seq), seq)
                                for seq in itertools.product(ACTIONS, repeat=length)),
                               key=lambda scored: (round(scored[0], 12), -self._seq_dist(pos, scored[1])))
        if not best:
            return ()
        floor = best[1][0] - tolerance
        moves = best[max(n for n, (p, _) in best.items() if p >= floor)][1]
        # Moves after the goal would be reached without slips are never executed: leave them out.
        for i, move in enumerate(moves):
            pos = _neighbours(self.lake, pos, move)
            if self.lake[pos[0]][pos[1]] == GOAL:
                return moves[:i + 1]
        return moves

    def _seq_dist(self, pos, seq) -> int:
        # Tie-break for hopeless or equal states: prefer moves that bring the goal nearer.
        for move in seq:
            pos = _neighbours(self.lake, pos, move)
        return self.dist(pos)

    def dist(self, pos) -> int:
        if pos not in self._dists:
            d = shortest_path(self.lake, pos) if self.lake[pos[0]][pos[1]] != HOLE else None
            self._dists[pos] = 99 if d is None else d
        return self._dists[pos]


@register("frozenlake")
class FrozenLake:
    """Environment factory; options: ``OPTIONS``. ``seed`` and ``topk`` are the arguments every
    environment is built with (core/config/env_options.py's env_kwargs); lakes take their own seed and
    nothing is retrieved, so neither changes anything."""

    name = "frozenlake"
    stop_tags = ("</answer>",)
    observation_role = "user"
    OPTIONS = {
        "size": Option(int, 2, 32, default=4, doc="the lake's side"),
        "slip": Option(float, 0, 0.95, default=0.2,
                       doc="chance a move goes sideways instead"),
        "max_actions": Option(int, 1, 10 ** 6, default=10, doc="moves per episode"),
        "actions_per_turn": Option(int, 1, 20, default=3, doc="moves one answer may give"),
    }
    """Bounds: a 32 x 32 lake is still drawn in a fraction of a second (8 tasks: 0.17 s) and
    shown in about 1 KB of text; at slip 0.95 a move is already almost all luck (1 would make
    the intended move impossible); 20 moves a turn is more than a default lake's whole path;
    max_actions only counts (the rollout's max_turns ends an episode anyway)."""

    def __init__(self, seed: int = 0, topk: int = 3, **options):
        opts = take_options(self.name, self.OPTIONS, options)
        size, slip = opts["size"], opts["slip"]
        max_actions, actions_per_turn = opts["max_actions"], opts["actions_per_turn"]
        self.seed, self.size, self.slip = seed, size, slip
        self.max_actions, self.actions_per_turn = max_actions, actions_per_turn
        self._planners: dict[tuple[str, ...], _Planner] = {}
        self.system_prompt = (
            "You are walking on a frozen lake shown as a grid. Symbols: P is you, _ is frozen ice, "
            "O is a hole, G is the goal. Reach G without stepping into a hole. The ice is "
            f"slippery: a move goes where you intend {round((1 - slip) * 100)}% of the time, "
            "otherwise sideways. Moves into the edge keep you in place. "
            "You may think first inside <think>...</think>. "
            + format_help(ACTIONS, actions_per_turn))

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        check_count(n)
        rng = seeded_rng("frozenlake-tasks", self.size, split, seed)
        tasks, seen = [], set()
        for _ in range(200 * n + 1000):
            if len(tasks) == n:
                break
            lake, start = random_lake(rng, self.size)
            key = f"{'/'.join(lake)}@{start[0]},{start[1]}"
            if key in seen or split_of(key) != split:
                continue
            seen.add(key)
            meta = {"lake": list(lake), "start": list(start), "shortest": shortest_path(lake, start)}
            task_id = f"frozenlake-{digest(key)[:12]}"
            prompt = self._first_message(lake, start)
            tasks.append(Task(task_id=task_id, prompt=prompt, split=split, meta=meta))
        if len(tasks) < n:
            raise ValueError(f"frozenlake: could only make {len(tasks)} distinct {split} lakes")
        return tasks

    def episode(self, task: Task, seed: int) -> "FrozenLakeEpisode":
        return FrozenLakeEpisode(self, task, seed)

    def planner(self, lake: tuple[str, ...]) -> _Planner:
        """One memoised planner per lake, shared by the episodes of a group."""
        if lake not in self._planners:
            if len(self._planners) >= 512:
                self._planners.clear()
            self._planners[lake] = _Planner(lake, self.slip)
        return self._planners[lake]

    def _first_message(self, lake, start) -> str:
        return ("Reach the goal G.\n"
                + state_block(1, _render(lake, start), self.max_actions))


def _render(lake: tuple[str, ...], pos: tuple[int, int]) -> str:
    rows = [[SYMBOLS[cell] for cell in row] for row in lake]
    rows[pos[0]][pos[1]] = "P"
    return render(rows)


class FrozenLakeEpisode:
    def __init__(self, env: FrozenLake, task: Task, seed: int):
        lake = tuple(task.meta.get("lake", ()))
        start = tuple(task.meta.get("start", ()))
        if (not lake or any(len(row) != len(lake[0]) or set(row) - set(SYMBOLS) for row in lake)
                or sum(row.count(GOAL) for row in lake) != 1 or len(start) != 2):
            raise ValueError(f"frozenlake task {task.task_id!r}: malformed lake in meta")
        self.env, self.task, self.lake = env, task, lake
        self.start = self.pos = (int(start[0]), int(start[1]))
        self.goal = next((r, row.index(GOAL)) for r, row in enumerate(lake) if GOAL in row)
        self.rng = seeded_rng("frozenlake-slips", task.task_id, seed)
        self.planner = env.planner(lake)
        self.turn, self.moves, self.total_reward = 1, 0, 0.0
        self.done = False

    # -- protocol -------------------------------------------------------------------------------
    def reset(self) -> str:
        return self.env._first_message(self.lake, self.start)

    def step(self, action_text: str) -> StepResult:
        if self.done:
            raise RuntimeError("frozenlake: step() after the episode ended")
        self.turn += 1
        parsed = parse_answer(action_text, ACTIONS, self.env.actions_per_turn)
        if parsed.error:
            self.total_reward += INVALID_PENALTY
            text = (f"Invalid action: {parsed.error}. {format_help(ACTIONS, self.env.actions_per_turn)}\n"
                    + state_block(self.turn, _render(self.lake, self.pos), self.actions_left))
            return StepResult(text, done=False, valid=False, action_type="invalid",
                              parsed={"actions": [], "raw": parsed.raw}, reward=INVALID_PENALTY,
                              error=parsed.error, state_key=self.state_key())
        reward, executed = 0.0, []
        for move in parsed.actions:
            actual = self._slip(move)
            self.pos = _neighbours(self.lake, self.pos, actual)
            self.moves += 1
            executed.append({"intended": move, "actual": actual})
            cell = self.lake[self.pos[0]][self.pos[1]]
            if cell == GOAL:
                reward += GOAL_REWARD
            if cell in (GOAL, HOLE) or self.actions_left == 0:
                self.done = True
                break
        self.total_reward += reward
        text = state_block(self.turn, _render(self.lake, self.pos), self.actions_left)
        if self.done:
            text += "\n" + self._ending()
        return StepResult(text, done=self.done, valid=True,
                          action_type="move",
                          parsed={"actions": parsed.actions, "dropped": parsed.dropped},
                          reward=reward, info={"executed": executed}, state_key=self.state_key())

    def outcome(self) -> Outcome:
        reached = self.pos == self.goal
        initial = _manhattan(self.start, self.goal)
        process = min(1.0, max(0.0, 1 - _manhattan(self.pos, self.goal) / initial))
        return Outcome(score=1.0 if reached else 0.0, success=reached, process=process,
                       info={"total_env_reward": round(self.total_reward, 6), "moves": self.moves,
                             "turns": self.turn - 1, "fell_in_hole": self._cell() == HOLE})

    def expert_action(self) -> str:
        """The planner's moves for this turn, replanned from the current (possibly slipped) cell."""
        moves = self.planner.macro(self.pos, self.actions_left, self.env.actions_per_turn)
        return f"<answer>{' || '.join(moves or ACTIONS[:1])}</answer>"

    # -- helpers --------------------------------------------------------------------------------
    @property
    def actions_left(self) -> int:
        return self.env.max_actions - self.moves

    def state_key(self) -> str:
        """The player's cell (``r,c``; the lake is the task's): GiGPO's anchor, equal whatever
        turn the cell was reached at."""
        return f"{self.pos[0]},{self.pos[1]}"

    def _cell(self) -> str:
        return self.lake[self.pos[0]][self.pos[1]]

    def _slip(self, move: str) -> str:
        u = self.rng.random()
        if u < 1 - self.env.slip:
            return move
        return PERPENDICULAR[move][0] if u < 1 - self.env.slip / 2 else PERPENDICULAR[move][1]

    def _ending(self) -> str:
        if self._cell() == GOAL:
            return "You reached the goal."
        if self._cell() == HOLE:
            return "You fell into a hole. The game is over."
        return "No actions left. The game is over."


def _manhattan(a, b) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])
