"""A process reward model from Monte-Carlo labels (AgentPRM, Choudhury 2025), trained on line.

Labels, as AgentPRM's released code computes them (sanjibanc/agent_prm,
``scripts/dataproc/compute_prm_target.py``): every step of every rollout is keyed on its state
*with its history* and its *parsed* action; the rollouts sharing a key are pooled, and the label
is the mean of their discounted outcomes mapped from [-1, 1] back to [0, 1]:

    Q(s_t, a_t) = 1/2 * ( mean { gamma^t * (2 R_j - 1) : rollouts j through (s_t, a_t) } + 1 )

(R in [0, 1] the outcome component, t the turn index, gamma ``prm_gamma``, 0.95 as there). On
line the rollouts pooled are the task group's (core/credit/turn_credit.py); the state with its
history is the turn's anchor state (core/credit/assign.py ``anchor_keys``: the env's state key)
after the anchors and parsed actions of the turns before it, and the parsed action is the env's
reading of it (``Turn.action_type`` and ``Turn.parsed``; an unparsable action is keyed on its
error), not the sampled text with its ``<think>`` (keyed on that text, 53% of the labels of the
stored search PRM run came from a single rollout). ``pooling`` reports how many rollouts each
label pools (``prm/rollouts_per_label``, ``prm/single_rollout_frac``; Dynamics draws them).
Branch-from-turn rollouts (``branches``, kind ``keep``) are the offline version of the same label.

The process reward model is a linear head on the policy's hidden state at the end of the action
(core/credit/progress.py ``features``), fitted every RL step towards the labels of every rank's
trajectories (mean squared error; core/credit/progress.py ``ridge_step``, ``spa_l2``) and saved
in checkpoints; its scores, centred within the task group, times ``w_prm`` are added to each
turn's action tokens' advantage (core/credit/assign.py ``add_turn_credit``). Recorded per turn in
``turn_signals``: ``q`` (the label) and ``prm`` (the model's score).
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Hashable, NamedTuple, Sequence

import torch

from core.credit.assign import anchor_keys
from core.credit.progress import FitResult, ProgressModel, ridge_step  # noqa: F401 (FitResult re-exported)
from core.rollout.trajectory import Trajectory, Turn

GAMMA = 0.95
"""AgentPRM's discount (``configs/compute_prm_target.yaml``)."""
THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


class Labels(NamedTuple):
    """Per trajectory and turn: the label and how many rollouts it pools."""
    values: list[list[float]]
    counts: list[list[int]]


def action_key(turn: Turn) -> str:
    """The parsed action: the env's action type and parsed arguments; an action the env could
    not parse by its error; an env that records no parse by the text without its ``<think>``."""
    if not turn.valid:
        return f"invalid:{turn.error or ''}"
    if turn.parsed is not None:
        return f"{turn.action_type}:{json.dumps(turn.parsed, sort_keys=True, default=str)}"
    return "text:" + " ".join(THINK.sub("", turn.action or "").split())


def step_keys(anchors: Sequence[str], actions: Sequence[str]) -> list[tuple]:
    """Each turn's (state with its history, action) key: the anchors and actions of the turns
    before it, its own anchor and its action.

    >>> step_keys(["s0", "s1"], ["a", "b"])[1]
    ((('s0', 'a'),), 's1', 'b')
    """
    if len(anchors) != len(actions):
        raise ValueError(f"{len(anchors)} anchor states but {len(actions)} actions")
    history = tuple(zip(anchors, actions))
    return [(history[:t], s, a) for t, (s, a) in enumerate(history)]


def mc_q_labels(keys: Sequence[Sequence[Hashable]], outcomes: Sequence[float],
                group_ids: Sequence[Hashable], gamma: float = GAMMA) -> Labels:
    """AgentPRM's Q labels per (trajectory, turn) from each turn's key (``step_keys``), pooled
    over the group's trajectories with the same key (each counted once per key):

        Q = (mean_j gamma^t (2 R_j - 1) + 1) / 2      t: the turn index of the pooled step

    >>> mc_q_labels([["k0", "k1"], ["k0"]], [1.0, 0.0], ["g", "g"], gamma=0.5)
    Labels(values=[[0.5, 0.75], [0.5]], counts=[[2, 1], [2]])
    """
    if not len(keys) == len(outcomes) == len(group_ids):
        raise ValueError("keys, outcomes and group_ids need one entry per trajectory")
    if not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    members: dict[tuple, dict[int, float]] = defaultdict(dict)
    for i, turn_keys in enumerate(keys):
        for t, key in enumerate(turn_keys):
            members[(group_ids[i], key)][i] = gamma ** t * (2 * float(outcomes[i]) - 1)
    pooled = [[members[(group_ids[i], key)] for key in turn_keys] for i, turn_keys in enumerate(keys)]
    return Labels([[(sum(m.values()) / len(m) + 1) / 2 for m in row] for row in pooled],
                  [[len(m) for m in row] for row in pooled])


def labels_for(trajs: Sequence[Trajectory], gamma: float = GAMMA) -> Labels:
    """``mc_q_labels`` of trajectories as the trainer holds them (outcome component as R)."""
    keys = [step_keys(anchor_keys(t), [action_key(u) for u in t.turns]) for t in trajs]
    return mc_q_labels(keys, [t.rewards.get("outcome", 0.0) for t in trajs],
                       [t.group_id for t in trajs], gamma)


def pooling(counts: Sequence[Sequence[int]]) -> dict[str, float]:
    """How many rollouts the labels pool, over every labelled turn: the mean
    (``prm/rollouts_per_label``) and the share from a single rollout
    (``prm/single_rollout_frac``); {} without labels.

    >>> pooling([[2, 1], [2]])
    {'prm/rollouts_per_label': 1.6666666666666667, 'prm/single_rollout_frac': 0.3333333333333333}
    """
    flat = [c for row in counts for c in row]
    if not flat:
        return {}
    return {"prm/rollouts_per_label": sum(flat) / len(flat),
            "prm/single_rollout_frac": sum(c == 1 for c in flat) / len(flat)}


class PrmModel:
    """The process reward head: prm(s_t, a_t) = w . [h_t, 1], one ridge step per RL step towards
    that step's labels (core/credit/progress.py ``ridge_step``) on mean((prm - Q)^2)."""

    def __init__(self, hidden_size: int, l2: float = 0.0):
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
