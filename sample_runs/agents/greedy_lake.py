"""A rule-based FrozenLake agent that writes its trajectories in the generic JSONL format.

It stands for "some other agent": no model, no trainer, just rules. Each turn it looks at the
grid text it is shown (the same observation a model would get), finds itself (P) and the goal
(G), and commits one to three moves that bring it nearer the goal, skipping a move that would
step straight into a visible hole. It ignores the ice: a slip can still carry it into a hole, and
it never plans around one, so some episodes fail — which is what the Failures page is for.

    python sample_runs/agents/greedy_lake.py --out FILE.jsonl [--tasks 12] [--rollouts 4]
        [--steps 3] [--seed 0]

Each "step" replays a fresh batch of train tasks, ``--rollouts`` episodes per task (the
environment's slip seed differs per episode, so a group's rewards can differ). The first line
carries the run's description (``run``), as the format allows.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the checkout

from core.envs.base import make_env  # noqa: E402  (environments are torch-free)

MOVES = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
GRID_ROW = re.compile(r"^[PO_G ]+$")


def read_grid(observation: str) -> list[list[str]]:
    """The last grid in an observation: rows of single-character cells (P, O, _, G)."""
    rows, block = [], []
    for line in observation.splitlines():
        if line.strip() and GRID_ROW.match(line.strip()):
            block.append(line.strip().replace(" ", ""))
        elif block:
            rows, block = block, []
    rows = block or rows
    if not rows:
        raise ValueError("no grid in the observation")
    return [list(r) for r in rows]


def find(grid: list[list[str]], symbol: str) -> tuple[int, int] | None:
    for r, row in enumerate(grid):
        if symbol in row:
            return r, row.index(symbol)
    return None


def choose_moves(grid: list[list[str]], rng: random.Random, most: int = 3) -> list[str]:
    """Moves toward G that do not enter a visible hole, as if the ice were not slippery."""
    pos, goal = find(grid, "P"), find(grid, "G")
    if pos is None or goal is None:
        return ["Up"]
    moves = []
    for _ in range(rng.randint(1, most)):
        wanted = [m for m, (dr, dc) in MOVES.items()
                  if (dr and (goal[0] - pos[0]) * dr > 0) or (dc and (goal[1] - pos[1]) * dc > 0)]
        rng.shuffle(wanted)
        safe = [m for m in wanted if _cell(grid, pos, m) not in ("O", None)]
        if not safe:
            break
        move = safe[0]
        pos = (pos[0] + MOVES[move][0], pos[1] + MOVES[move][1])
        moves.append(move)
        if pos == goal:
            break
    return moves or ["Up"]


def _cell(grid, pos, move):
    r, c = pos[0] + MOVES[move][0], pos[1] + MOVES[move][1]
    return grid[r][c] if 0 <= r < len(grid) and 0 <= c < len(grid[0]) else None


def play(env, task, seed: int, rng: random.Random, max_turns: int) -> dict:
    """One episode as a generic-JSONL record (without ids)."""
    episode = env.episode(task, seed)
    observation, turns, finish = episode.reset(), [], "max_turns"
    for _ in range(max_turns):
        action = f"<answer>{' || '.join(choose_moves(read_grid(observation), rng))}</answer>"
        result = episode.step(action)
        turns.append({"action": action, "observation": result.observation,
                      "action_valid": result.valid, "action_type": result.action_type,
                      "parsed": result.parsed, "step_reward": result.reward})
        observation = result.observation
        if result.done:
            finish = "done"
            break
    outcome = episode.outcome()
    return {"prompt": env.system_prompt + "\n\n" + task.prompt, "turns": turns,
            "reward": outcome.score,
            "rewards": {"outcome": outcome.score, "format": 0.0, "cost": 0.0,
                        "process": outcome.process},
            "success": outcome.success, "finish_reason": finish,
            "info": {"agent": "greedy_lake", **outcome.info}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSONL file to write")
    p.add_argument("--tasks", type=int, default=12, help="tasks per step")
    p.add_argument("--rollouts", type=int, default=4, help="episodes per task (one group)")
    p.add_argument("--steps", type=int, default=3, help="batches of fresh tasks")
    p.add_argument("--max-turns", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    env = make_env("frozenlake", seed=args.seed)
    pool = env.tasks("train", args.tasks * args.steps, args.seed)
    rng = random.Random(args.seed)
    run = {"env": "frozenlake", "model": "greedy-rule-agent", "algo": "none",
           "agent": "sample_runs/agents/greedy_lake.py", "seed": args.seed}
    with open(args.out, "w", encoding="utf-8") as out:
        for step in range(args.steps):
            for task in pool[step * args.tasks:(step + 1) * args.tasks]:
                for k in range(args.rollouts):
                    rec = play(env, task, seed=args.seed * 1000 + step * 100 + k, rng=rng,
                               max_turns=args.max_turns)
                    rec.update(traj_id=f"s{step}-{task.task_id}-r{k}", task_id=task.task_id,
                               group_id=f"s{step}-{task.task_id}", step=step)
                    if not out.tell():
                        rec["run"] = run
                    out.write(json.dumps(rec) + "\n")
    print(f"wrote {args.steps * args.tasks * args.rollouts} trajectories to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
