"""A process reward model from Monte-Carlo labels (AgentPRM), trained on line.

Labels: Q(s, a), the mean outcome of the rollouts that took action a from state s. On line, the
rollouts of one task group are those continuations: every trajectory of the group that reached
anchor state s (core/credit/assign.py ``anchor_keys``, the env's state key) and took the same action
there (same text, whitespace-normalised) counts, at whatever turn it got there:

    Q(s_{i,t}, a_{i,t}) = mean { R_j : j in group(i), some turn u of j has (s_{j,u}, a_{j,u}) =
                                                                       (s_{i,t}, a_{i,t}) }

(R the outcome component). Branch-from-turn rollouts (``branches``, kind ``keep``) are the
offline version of the same label. The process reward model is a linear head on the policy's
hidden state at the end of the action (core/credit/progress.py ``features``), fitted every RL step by
one ridge step towards that step's labels (mean squared error; core/credit/progress.py ``ridge_step``); its scores, centred within the task group, times
``w_prm`` are added to each turn's action tokens' advantage (core/credit/assign.py ``add_turn_credit``).
Recorded per turn in ``turn_signals``: ``q`` (the label) and ``prm`` (the model's score).
The head is not saved in checkpoints.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import torch

from core.credit.progress import FitResult, ProgressModel, ridge_step  # noqa: F401 (FitResult re-exported)
from core.rollout.trajectory import Trajectory


def _action_key(text: str) -> str:
    return " ".join((text or "").split())


def mc_q_labels(anchors: Sequence[Sequence[str]], actions: Sequence[Sequence[str]],
                outcomes: Sequence[float], group_ids: Sequence[str]) -> list[list[float]]:
    """Q per (trajectory, turn): the mean outcome of the group's trajectories that took the same
    action from the same anchor state (each trajectory counted once per pair).

    >>> mc_q_labels([["s0", "s1"], ["s0"], ["s0"]], [["a", "b"], ["a"], ["c"]],
    ...             [1.0, 0.0, 0.0], ["g", "g", "g"])
    [[0.5, 1.0], [0.5], [0.0]]
    """
    if not len(anchors) == len(actions) == len(outcomes) == len(group_ids):
        raise ValueError("anchors, actions, outcomes and group_ids need one entry per trajectory")
    members: dict[tuple, set[int]] = defaultdict(set)
    for i, (states, acts) in enumerate(zip(anchors, actions)):
        if len(states) != len(acts):
            raise ValueError(f"trajectory {i}: {len(states)} anchor states but {len(acts)} actions")
        for s, a in zip(states, acts):
            members[(group_ids[i], s, _action_key(a))].add(i)
    return [[sum(float(outcomes[j]) for j in members[(group_ids[i], s, _action_key(a))])
             / len(members[(group_ids[i], s, _action_key(a))]) for s, a in zip(states, acts)]
            for i, (states, acts) in enumerate(zip(anchors, actions))]


def labels_for(trajs: Sequence[Trajectory]) -> list[list[float]]:
    """``mc_q_labels`` of trajectories as the trainer holds them (outcome component as R)."""
    from core.credit.assign import anchor_keys
    return mc_q_labels([anchor_keys(t) for t in trajs], [[u.action for u in t.turns] for t in trajs],
                       [t.rewards.get("outcome", 0.0) for t in trajs], [t.group_id for t in trajs])


class PrmModel:
    """The process reward head: prm(s_t, a_t) = w . [h_t, 1], one ridge step per RL step towards
    that step's labels (core/credit/progress.py ``ridge_step``) on mean((prm - Q)^2)."""

    def __init__(self, hidden_size: int, l2: float = 1.0):
        self.w = torch.zeros(hidden_size + 1, dtype=torch.float64)
        self.l2 = l2

    def predict(self, feats: Sequence[torch.Tensor | None]) -> list[list[float] | None]:
        return [(ProgressModel._design(f) @ self.w).tolist() if f is not None else None
                for f in feats]

    def fit(self, feats: Sequence[torch.Tensor | None], labels: Sequence[Sequence[float]]
            ) -> FitResult:
        pairs = [(f, q) for f, q in zip(feats, labels) if f is not None and len(q) == f.shape[0]]
        if not pairs:
            return FitResult(0.0, 0.0)
        x = torch.cat([ProgressModel._design(f) for f, _ in pairs])
        y = torch.tensor([float(v) for _, q in pairs for v in q], dtype=torch.float64)
        before = float(((x @ self.w - y) ** 2).mean())
        self.w = ridge_step(self.w, x, y, self.l2)
        return FitResult(before, float(((x @ self.w - y) ** 2).mean()))


def signal_rows(trajs: Sequence[Trajectory], labels: Sequence[Sequence[float]],
                scores: Sequence[list[float] | None]) -> list[dict]:
    """``turn_signals`` rows ``q`` (the Monte-Carlo label) and ``prm`` (the model's score)."""
    rows = []
    for t, qs, ps in zip(trajs, labels, scores):
        if ps is None:
            continue
        for k, (q, p) in enumerate(zip(qs, ps)):
            rows.append({"traj_id": t.traj_id, "turn": k, "name": "q", "value": float(q),
                         "source": "train"})
            rows.append({"traj_id": t.traj_id, "turn": k, "name": "prm", "value": float(p),
                         "source": "train"})
    return rows
