"""The corridor (core/envs/games/corridor.py): moves, walls, the move budget, the reward only at the
goal, disjoint splits, and experts that teach the format (uniform) or the way (best)."""
from __future__ import annotations

import random

import pytest

from core.envs.base import Task, make_env
from core.envs.games.corridor import layouts
from core.envs.games.grid import split_of


def corridor(cells: int, start: int, slack: int = 2, **options):
    env = make_env("corridor", slack=slack, **options)
    task = Task(task_id="hand", prompt="", meta={"cells": cells, "start": start,
                                                  "moves": cells - 1 - start + slack})
    return env, env.episode(task, seed=0)


def test_walk_right_reaches_the_goal_with_the_only_reward():
    env, ep = corridor(4, 0)
    assert "Turn 1: State:\nP _ _ G\nYou have 5 actions left." in ep.reset()
    rewards = [ep.step("<answer>Right</answer>").reward for _ in range(3)]
    assert rewards == [0.0, 0.0, 1.0] and ep.done
    out = ep.outcome()
    assert (out.score, out.success, out.process, out.info["moves"]) == (1.0, True, 1.0, 3)
    assert ep.state_key() == "3"


def test_the_wall_keeps_the_agent_and_moves_run_out():
    env, ep = corridor(5, 0, slack=1)           # 4 to go, 5 moves
    first = ep.step("<answer>Left</answer>")     # into the wall: stays at 0
    assert first.valid and not first.done and ep.state_key() == "0"
    assert "P _ _ _ G" in first.observation and "4 actions left" in first.observation
    for _ in range(3):
        ep.step("<answer>Right</answer>")
    last = ep.step("<answer>Right</answer>")   # the fifth move: at cell 4 = the goal
    assert last.done and last.reward == 1.0
    env, ep = corridor(5, 0, slack=1)
    results = [ep.step(f"<answer>{m}</answer>") for m in ("Right", "Left", "Right", "Right",
                                                          "Right")]
    assert results[-1].done and "No moves left" in results[-1].observation
    assert [r.reward for r in results] == [0.0] * 5 and not ep.outcome().success
    assert ep.outcome().process == pytest.approx(3 / 4)
    with pytest.raises(RuntimeError):
        ep.step("<answer>Right</answer>")


def test_an_invalid_answer_uses_no_move():
    env, ep = corridor(4, 1)
    bad = ep.step("<answer>Up</answer>")
    assert not bad.valid and bad.reward == -0.1 and not bad.done
    assert ep.moves_left == ep.moves and "unknown action 'Up'" in bad.observation


@pytest.mark.parametrize("meta", [{}, {"cells": 4, "start": 3, "moves": 2},
                                  {"cells": 4, "start": 0, "moves": 0},
                                  {"cells": "4", "start": 0, "moves": 3}])
def test_malformed_corridors_are_refused(meta):
    env = make_env("corridor")
    with pytest.raises(ValueError, match="malformed corridor"):
        env.episode(Task(task_id="bad", prompt="", meta=meta), seed=0)


def test_splits_hold_disjoint_layouts_and_every_task_starts_two_or_more_from_the_goal():
    env = make_env("corridor")
    seen = {}
    for split in ("train", "heldout"):
        tasks = env.tasks(split, 200, 3)
        seen[split] = {(t.meta["cells"], t.meta["start"]) for t in tasks}
        assert all(t.meta["cells"] - 1 - t.meta["start"] >= 2 for t in tasks)
        assert all(split_of(f"corridor:{lay}") == split for lay in seen[split])
    assert seen["train"] and seen["heldout"] and not seen["train"] & seen["heldout"]
    assert seen["train"] | seen["heldout"] == set(layouts(6))


def test_a_coin_flip_walker_succeeds_sometimes_and_the_experts_differ():
    """What the credit grid's start needs: pass@1 well below 1 and above 0 (sample_runs/credit.md
    section 14 measures the SFT start itself); the uniform expert's moves are half Right, the best
    expert's all Right (and it always arrives)."""
    env = make_env("corridor", slack=4, expert="uniform")
    rng, wins = random.Random(0), []
    for task in env.tasks("train", 400, 1):
        ep = env.episode(task, seed=0)
        while not ep.done:
            ep.step(f"<answer>{rng.choice(['Left', 'Right'])}</answer>")
        wins.append(ep.outcome().success)
    assert 0.2 < sum(wins) / len(wins) < 0.42   # 0.30 here (119 of 400)
    moves = [env.episode(t, seed=s).expert_action() for t in env.tasks("train", 50, 0)
             for s in range(4)]
    assert 0.35 < moves.count("<answer>Right</answer>") / len(moves) < 0.65
    best = make_env("corridor", slack=0)
    for task in best.tasks("heldout", 20, 0):
        ep = best.episode(task, seed=0)
        while not ep.done:
            ep.step(ep.expert_action())
        assert ep.outcome().success
