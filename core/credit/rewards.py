"""Reward components as plain functions, and their weighted total. Torch-free.

The seed names four kinds of reward; each is one function of a finished ``Trajectory`` and is
recorded as its own row in the ``rewards`` table:

    outcome  in [0, 1]  the environment's grade of the final answer/state (EM, F1, tests passed)
    format   in [0, 1]  every action parsed and the episode ended by answering (scheme below)
    cost     <= 0       -(per-turn + per-token + per-tool-call charges)
    process  in [0, 1]  the environment's process signal (search: gold seen in retrieved evidence)

    total = w_outcome * outcome + w_format * format + w_cost * cost + w_process * process

One dense signal is measured per turn rather than per trajectory: ``info_gain`` (core/credit/info_gain.py,
IGPO), the rise of the policy's teacher-forced probability of the gold answer over each turn. It
is recorded as its own component (the trajectory's sum of gains) but stays out of the total: with
``w_info_gain`` > 0 it is paid turn by turn as credit (core/credit/assign.py), not as reward.

Answer matching (Search-R1's ``qa_em``) is core/envs/answers.py, re-exported here.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from core.envs.answers import (exact_match, extract_answer, normalize_answer,  # noqa: F401
                               token_f1)  # (re-exported: core.rewards.exact_match is fixed)
from storage.protocol import PROPER_ENDINGS, TOOL_ACTIONS

if TYPE_CHECKING:  # imported for annotations only: rewards must stay importable without torch
    from core.config import TrainConfig
    from core.rollout.trajectory import Trajectory



# ---- components --------------------------------------------------------------------------------
def outcome_reward(traj: "Trajectory") -> float:
    """outcome = traj.outcome.score (the env's grade in [0, 1]); 0 when there is no outcome
    (the env crashed or the trajectory was cut before grading)."""
    return float(traj.outcome.score) if traj.outcome is not None else 0.0


def format_reward(traj: "Trajectory") -> float:
    """format = 0.5 * ended + 0.5 * valid_frac, where valid_frac = valid actions / actions and
    ended = 1 if the policy ended the episode itself (finish_reason answered | done), else 0.

    So 1.0 exactly when every action parsed and the episode was answered; an episode that never
    answered gets at most 0.5 (0.5 * fraction of valid actions); no actions at all gets 0.
    Like Search-R1's format-aware reward, structure is rewarded apart from correctness, but as a
    separate component so its weight is a config value rather than baked into the outcome.
    """
    if not traj.turns:
        return 0.0
    valid_frac = sum(1 for t in traj.turns if t.valid) / len(traj.turns)
    ended = 1.0 if traj.finish_reason in PROPER_ENDINGS else 0.0
    return 0.5 * ended + 0.5 * valid_frac


def _response_tokens(traj: "Trajectory") -> int:
    # Trainer trajectories carry the loss mask; imported ones may only carry per-turn counts.
    if traj.trained:
        return traj.response_tokens
    return sum(t.action_tokens for t in traj.turns)


def cost_reward(traj: "Trajectory", cfg: "TrainConfig") -> float:
    """cost = -(cost_per_turn * turns + cost_per_token * response tokens
              + cost_per_tool_call * tool calls)  (<= 0 for non-negative prices).

    Tool calls are turns whose action_type is in TOOL_ACTIONS (search, tool, code, docs, api),
    counted whether or not the call succeeded: a failed call still costs.
    """
    tool_calls = sum(1 for t in traj.turns if t.action_type in TOOL_ACTIONS)
    return -(cfg.cost_per_turn * traj.num_turns
             + cfg.cost_per_token * _response_tokens(traj)
             + cfg.cost_per_tool_call * tool_calls)


def process_reward(traj: "Trajectory") -> float:
    """process = traj.outcome.process (search: 1 if a gold answer appeared in retrieved evidence
    before the answer); 0 when there is no outcome."""
    return float(traj.outcome.process) if traj.outcome is not None else 0.0


# name -> (component function of (traj, cfg), TrainConfig field holding its weight)
COMPONENTS: dict[str, tuple[Callable[["Trajectory", "TrainConfig"], float], str]] = {
    "outcome": (lambda traj, cfg: outcome_reward(traj), "w_outcome"),
    "format": (lambda traj, cfg: format_reward(traj), "w_format"),
    "cost": (cost_reward, "w_cost"),
    "process": (lambda traj, cfg: process_reward(traj), "w_process"),
}


DENSE_COMPONENTS: dict[str, str] = {"info_gain": "w_info_gain"}
"""Per-turn signals recorded as a component, paid as turn-level credit, not in the total."""


def score(traj: "Trajectory", cfg: "TrainConfig") -> tuple[dict[str, float], float]:
    """(components, total) with total = sum_c w_c * component_c over COMPONENTS.

    Components are returned unweighted, so the rewards table shows what each signal said and the
    weights (stored with the run's config) show how much it counted.

    A component that is not a finite number raises ValueError naming the trajectory, its task
    and the component: one NaN would turn the whole step's advantages into NaN. (Our rollouts
    check the env's outcome before it gets here, core/envs/guard.py; this names what else does.)
    """
    parts = {}
    for name, (fn, _) in COMPONENTS.items():
        value = fn(traj, cfg)
        try:
            parts[name] = float(value)
        except (TypeError, ValueError, OverflowError):
            parts[name] = math.nan
        if not math.isfinite(parts[name]):
            raise ValueError(f"trajectory {traj.traj_id} (task {traj.task.task_id}): reward "
                             f"component {name} is {value!r:.80}, not a finite number")
    total = sum(getattr(cfg, weight) * parts[name] for name, (_, weight) in COMPONENTS.items())
    return parts, float(total)
