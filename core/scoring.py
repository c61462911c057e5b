"""The reward stage every kind of step runs (RL, SFT demonstrations, held-out evaluation) alike.
"""
from __future__ import annotations

from typing import Sequence

from core.failures import classify_trajectory
from core.rewards import score
from core.trajectory import Trajectory


def score_all(trajs: Sequence[Trajectory], cfg) -> None:
    """Set each trajectory's reward components, its weighted total (core/rewards.py ``score``)
    and its failure class (core/failures.py): the trajectory's own fields, which the record and
    credit read."""
    for t in trajs:
        t.rewards, t.reward = score(t, cfg)
        t.failure_class = classify_trajectory(t)
