"""The reward stage every kind of step runs (RL, SFT demonstrations, held-out evaluation) alike:
reward components, their total, and the failure class (the taxonomy is storage/failures.py, which
also reads imported runs; here is how a trainer ``Trajectory`` is put to it).
"""
from __future__ import annotations

from typing import Any, Sequence

from core.credit.rewards import score
from core.rollout.trajectory import Trajectory
from storage.failures import classify


def score_all(trajs: Sequence[Trajectory], cfg) -> None:
    """Set each trajectory's reward components, its weighted total (core/credit/rewards.py ``score``)
    and its failure class (storage/failures.py): the trajectory's own fields, which the record and
    credit read."""
    for t in trajs:
        t.rewards, t.reward = score(t, cfg)
        t.failure_class = classify_trajectory(t)


def turn_dicts(traj: Trajectory) -> list[dict[str, Any]]:
    """The trajectory's turns in the plain form ``classify`` reads."""
    return [{"action": t.action, "observation": t.observation, "action_valid": t.valid,
             "action_type": t.action_type, "error": t.error, "state_diff": t.state_diff}
            for t in traj.turns]


def classify_trajectory(traj: Trajectory) -> str:
    """classify() for a trainer Trajectory; outcome info and tests feed the rules (a missing
    outcome, e.g. a crashed env, counts as not solved)."""
    out = traj.outcome
    info: dict[str, Any] = dict(traj.info)
    if out is not None:
        info.update(out.info)
        if out.tests:
            info.setdefault("tests", out.tests)
    return classify(turn_dicts(traj), success=bool(out and out.success),
                    finish_reason=traj.finish_reason, answer=out.answer if out else None,
                    info=info)
