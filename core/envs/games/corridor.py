"""Corridor: walk right to the goal in a few moves, one move a turn, rewarded only at the goal.

The smallest multi-turn task where per-turn credit has something to tell apart, made for the tiny
model on a CPU (sample_runs/credit.md, section 14). The agent stands in a row of cells
with the goal at the right end; each turn it answers Left or Right; a move into the left wall
stays put. It has the distance plus ``slack`` moves. Reaching the goal ends the episode with
reward 1; running out of moves ends it with 0. No other reward, no step cost.

Why this task: the tiny model (a random 2-layer network with a LoRA adapter) has not learned to
read a lake in hundreds of supervised steps (sample_runs/credit.md, 13b), but it learns one
preference within minutes (the bandit). Here one preference (Right) is the whole policy, and every
walk mixes good and bad moves: a successful walk may hold a Left, a failed one several Rights.
One advantage per walk (GRPO, RLOO, Dr.GRPO) pays every move of a walk alike; per-turn credit
(GiGPO's step groups by cell, PPO's value head, PRM labels) can pay a Right and charge a Left of
the same walk. How much that speeds learning is what the credit grid on this task measures.

Levels: corridors of ``size`` - 2 .. ``size`` + 2 cells (at least 3), the start at least 2 moves
from the goal; a layout belongs to train or heldout by its digest, so the splits never share one.

Expert (``expert`` option): ``best`` always answers Right; ``uniform`` answers Left or Right with
probability 1/2 (seeded by task, episode seed and turn): demonstrations that teach the answer
format only, so an SFT start leaves the choice to RL, as the bandit's workshop demo does.
"""
from __future__ import annotations

from core.envs.base import Outcome, StepResult, Task, register
from core.envs.games.grid import (INVALID_PENALTY, check_count, check_split, digest,
                                  format_help, parse_answer, render, seeded_rng, split_of,
                                  state_block)
from core.envs.options import Option, take_options

ACTIONS = ("Left", "Right")
GOAL_REWARD = 1.0
EXPERTS = ("best", "uniform")
MIN_CELLS, MIN_DISTANCE = 3, 2


def layouts(size: int) -> list[tuple[int, int]]:
    """Every (cells, start) a corridor of about ``size`` cells may have: cells in [size - 2,
    size + 2] (at least 3), the start at least 2 moves from the goal (the rightmost cell)."""
    return [(cells, start) for cells in range(max(MIN_CELLS, size - 2), size + 3)
            for start in range(cells - MIN_DISTANCE)]


@register("corridor")
class Corridor:
    """Environment factory; options: ``OPTIONS`` (see the module docstring). ``seed`` and
    ``topk`` are the arguments every environment is built with; nothing here uses them."""

    name = "corridor"
    stop_tags = ("</answer>",)
    observation_role = "user"
    OPTIONS = {
        "size": Option(int, 3, 30, default=6, doc="the corridors' typical length in cells"),
        "slack": Option(int, 0, 30, default=2, doc="moves beyond the distance to the goal"),
        "expert": Option(str, default="best", choices=EXPERTS,
                         doc="the SFT demonstrations' move: always Right, or either at random"),
    }

    def __init__(self, seed: int = 0, topk: int = 3, **options):
        opts = take_options(self.name, self.OPTIONS, options)
        self.seed, self.size, self.slack, self.expert = (seed, opts["size"], opts["slack"],
                                                         opts["expert"])
        self.system_prompt = (
            "You are in a corridor shown as a row of cells. Symbols: P is you, _ is floor, G is "
            "the goal. Reach G before your moves run out. A move into the wall keeps you in "
            "place. You may think first inside <think>...</think>. "
            + format_help(ACTIONS, 1))

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        check_count(n)
        pool = [lay for lay in layouts(self.size) if split_of(f"corridor:{lay}") == split]
        if n and not pool:
            raise ValueError(f"corridor: size {self.size} has no {split} layout; try another size")
        rng = seeded_rng("corridor-tasks", self.size, split, seed)
        tasks = []
        for i in range(n):   # layouts repeat when n exceeds them: ids stay distinct
            cells, start = pool[rng.randrange(len(pool))]
            meta = {"cells": cells, "start": start, "moves": cells - 1 - start + self.slack}
            tasks.append(Task(task_id=f"corridor-{digest(cells, start, split, seed, i)[:12]}",
                              prompt=self._message(1, cells, start, meta["moves"]),
                              split=split, meta=meta))
        return tasks

    def episode(self, task: Task, seed: int) -> "CorridorEpisode":
        return CorridorEpisode(self, task, seed)

    @staticmethod
    def _message(turn: int, cells: int, pos: int, moves_left: int) -> str:
        row = ["_"] * cells
        row[-1], row[pos] = "G", "P"
        text = state_block(turn, render([row]), moves_left)
        return ("Reach the goal G.\n" + text) if turn == 1 else text


class CorridorEpisode:
    def __init__(self, env: Corridor, task: Task, seed: int):
        meta = task.meta
        cells, start, moves = (meta.get(k) for k in ("cells", "start", "moves"))
        if not (isinstance(cells, int) and isinstance(start, int) and isinstance(moves, int)
                and cells >= 2 and 0 <= start < cells - 1 and moves >= 1):
            raise ValueError(f"corridor task {task.task_id!r}: malformed corridor in meta")
        self.env, self.task = env, task
        self.cells, self.start, self.moves = cells, start, moves
        self.pos, self.used, self.turn, self.done = start, 0, 1, False
        self.total_reward = 0.0
        self.rng = seeded_rng("corridor-expert", task.task_id, seed)

    def reset(self) -> str:
        return self.env._message(1, self.cells, self.pos, self.moves)

    def step(self, action_text: str) -> StepResult:
        if self.done:
            raise RuntimeError("corridor: step() after the episode ended")
        self.turn += 1
        parsed = parse_answer(action_text, ACTIONS, 1)
        if parsed.error:
            self.total_reward += INVALID_PENALTY
            text = (f"Invalid action: {parsed.error}. {format_help(ACTIONS, 1)}\n"
                    + self.env._message(self.turn, self.cells, self.pos, self.moves_left))
            return StepResult(text, done=False, valid=False, action_type="invalid",
                              parsed={"actions": [], "raw": parsed.raw}, reward=INVALID_PENALTY,
                              error=parsed.error, state_key=self.state_key())
        move = parsed.actions[0]
        self.pos = min(self.pos + 1, self.cells - 1) if move == "Right" else max(self.pos - 1, 0)
        self.used += 1
        reached = self.pos == self.cells - 1
        reward = GOAL_REWARD if reached else 0.0
        self.total_reward += reward
        self.done = reached or self.moves_left == 0
        text = self.env._message(self.turn, self.cells, self.pos, self.moves_left)
        if self.done:
            text += "\n" + ("You reached the goal." if reached
                            else "No moves left. The game is over.")
        return StepResult(text, done=self.done, valid=True, action_type="move",
                          parsed={"actions": parsed.actions, "dropped": parsed.dropped},
                          reward=reward, info={"position": self.pos}, state_key=self.state_key())

    def outcome(self) -> Outcome:
        reached = self.pos == self.cells - 1
        distance = self.cells - 1 - self.start
        process = min(1.0, max(0.0, (self.pos - self.start) / distance))
        return Outcome(score=GOAL_REWARD if reached else 0.0, success=reached, process=process,
                       info={"total_env_reward": round(self.total_reward, 6), "moves": self.used,
                             "turns": self.turn - 1})

    @property
    def moves_left(self) -> int:
        return self.moves - self.used

    def state_key(self) -> str:
        """The player's cell: GiGPO's anchor, equal whatever turn the cell was reached at."""
        return str(self.pos)

    def expert_action(self) -> str:
        """Right (``best``), or Left or Right at random (``uniform``: the format only)."""
        if self.env.expert == "uniform":
            return f"<answer>{ACTIONS[self.rng.random() < 0.5]}</answer>"
        return "<answer>Right</answer>"
