"""Stepwise progress attribution (SPA-RL): split each trajectory's outcome over its turns.

A progress estimator — here a linear head on the policy's (detached) hidden state at the last
token of each turn's action, i.e. on the history up to and including that action — predicts a
contribution c_t per turn. It is trained every RL step on that step's trajectories so that a
trajectory's contributions add up to its outcome reward R:

    L = (1/B) * sum_i ( sum_t c_{i,t} - R_i )^2

and its per-turn estimates become turn-level rewards (SPA's r_t = c_t; the grounding bonus for
an executable action is left to the format reward). With ``w_spa`` > 0 each turn's c_t, minus
the mean contribution of its task group's turns (core/config/algorithms.py
``info_gain_turn_advantages`` with ``scale=False``: centred, not divided by the std, so a head
that learned little adds little), times ``w_spa`` is added to that turn's action tokens' advantage
(core/credit/assign.py ``add_turn_credit``). Every turn's c_t is recorded as ``turn_signals`` name
``progress`` (source 'train').

The head is linear, c_t = w . [h_t, 1], and the trainer's: it starts at zero (every contribution
0) and each RL step takes one closed-form ridge step towards that step's data from the weights
it had (``ridge_step``; ``spa_l2``), so it keeps what earlier steps taught it and can never fit
worse than it did. (Adam on this head moved every weight by its lr whatever the gradient and
fitted an all-zero batch worse than it started.) It is not saved in checkpoints (a resumed run
starts it again). Under torchrun each rank fits it
on its own trajectories.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from core.rollout.trajectory import Trajectory

BATCH = 8
"""Trajectories per feature forward pass."""


def progress_loss(contributions: Sequence[torch.Tensor], rewards: torch.Tensor) -> torch.Tensor:
    """L = (1/B) sum_i (sum_t c_{i,t} - R_i)^2 over B trajectories (``contributions[i]``: the
    (T_i,) per-turn contributions of trajectory i; ``rewards``: (B,) outcomes).

    >>> float(progress_loss([torch.tensor([0.5, 0.25]), torch.tensor([1.0])],
    ...                     torch.tensor([1.0, 0.0])))
    0.53125
    """
    if len(contributions) != rewards.shape[0]:
        raise ValueError(f"{len(contributions)} trajectories but {rewards.shape[0]} rewards")
    if not contributions:
        return rewards.new_zeros(())
    sums = torch.stack([c.sum() for c in contributions])
    return ((sums - rewards) ** 2).mean()


def action_ends(traj: Trajectory) -> list[int]:
    """Position of the last action token of each turn, in turn order."""
    ends: dict[int, int] = {}
    for pos, (role, turn) in enumerate(zip(traj.roles, traj.token_turn)):
        if role == "action" and turn >= 0:
            ends[turn] = pos
    return [ends[k] for k in sorted(ends)]


def features(policy, trajs: Sequence[Trajectory], batch: int = BATCH) -> list[torch.Tensor | None]:
    """The policy's final hidden state at each turn's last action token, (T_i, H) float32 on the
    CPU, without gradients; None for a trajectory with a turn that has no action token."""
    out: list[torch.Tensor | None] = [None] * len(trajs)
    todo = [(i, t, action_ends(t)) for i, t in enumerate(trajs)]
    todo = [(i, t, ends) for i, t, ends in todo if ends and len(ends) == t.num_turns]
    device = next(policy.base.parameters()).device
    with torch.no_grad():
        for k in range(0, len(todo), batch):
            part = todo[k:k + batch]
            width = max(max(ends) + 1 for _, _, ends in part)
            ids = torch.full((len(part), width), policy.pad_id, dtype=torch.long)
            attn = torch.zeros((len(part), width), dtype=torch.long)
            for r, (_, t, ends) in enumerate(part):
                n = max(ends) + 1
                ids[r, :n] = torch.tensor(t.token_ids[:n])
                attn[r, :n] = 1
            ids, attn = ids.to(device), attn.to(device)
            hidden = policy.backbone(input_ids=ids, attention_mask=attn,
                                     position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
                                     use_cache=False).last_hidden_state
            for r, (i, _, ends) in enumerate(part):
                out[i] = hidden[r, ends].float().cpu()
    return out


def ridge_step(w_prev: torch.Tensor, x: torch.Tensor, y: torch.Tensor, l2: float) -> torch.Tensor:
    """The linear weights minimising  (1/n) ||X w - y||^2 + l2 * s * ||w - w_prev||^2,

        w = (X^T X / n + l2 * s * I)^-1 (X^T y / n + l2 * s * w_prev),

    X (n, d) float64, s = trace(X^T X / n) / d (so l2 does not depend on the features' scale).
    Each RL step's fit moves from the last step's weights only as far as that step's data pull:
    the head keeps what earlier steps taught it. Since w_prev is one candidate, the fitted data
    loss is never above w_prev's.

    >>> ridge_step(torch.zeros(1, dtype=torch.float64), torch.tensor([[1.0], [2.0]],
    ...            dtype=torch.float64), torch.tensor([2.0, 4.0], dtype=torch.float64), 0.0)
    tensor([2.], dtype=torch.float64)
    """
    n, d = x.shape
    gram = x.T @ x / n
    s = float(torch.trace(gram)) / d or 1.0
    eye = torch.eye(d, dtype=x.dtype)
    return torch.linalg.solve(gram + l2 * s * eye, x.T @ y / n + l2 * s * w_prev)


@dataclass
class FitResult:
    loss_before: float
    loss_after: float


class ProgressModel:
    """The progress head: c_t = w . [h_t, 1], fitted by ``ridge_step`` on the turns' summed
    features (sum_t c_{i,t} = w . [sum_t h_{i,t}, T_i], linear in w, so the fit is exact)."""

    def __init__(self, hidden_size: int, l2: float = 1.0):
        self.w = torch.zeros(hidden_size + 1, dtype=torch.float64)  # no turn contributes yet
        self.l2 = l2

    @staticmethod
    def _design(f: torch.Tensor) -> torch.Tensor:
        return torch.cat([f.double(), torch.ones(f.shape[0], 1, dtype=torch.float64)], dim=1)

    def predict(self, feats: Sequence[torch.Tensor | None]) -> list[list[float] | None]:
        return [(self._design(f) @ self.w).tolist() if f is not None else None for f in feats]

    def fit(self, feats: Sequence[torch.Tensor | None], rewards: Sequence[float]) -> FitResult:
        """One ridge step on ``progress_loss`` over the trajectories with features."""
        pairs = [(f, r) for f, r in zip(feats, rewards) if f is not None]
        if not pairs:
            return FitResult(0.0, 0.0)
        x = torch.stack([self._design(f).sum(0) for f, _ in pairs])
        y = torch.tensor([float(r) for _, r in pairs], dtype=torch.float64)
        before = float(((x @ self.w - y) ** 2).mean())
        self.w = ridge_step(self.w, x, y, self.l2)
        return FitResult(before, float(((x @ self.w - y) ** 2).mean()))


def signal_rows(trajs: Sequence[Trajectory], contributions: Sequence[list[float] | None]
                ) -> list[dict]:
    """``turn_signals`` rows: each turn's contribution, name ``progress``."""
    return [{"traj_id": t.traj_id, "turn": k, "name": "progress", "value": float(c),
             "source": "train"}
            for t, cs in zip(trajs, contributions) if cs is not None for k, c in enumerate(cs)]
