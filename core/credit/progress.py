"""Stepwise progress attribution (SPA-RL, Wang et al. 2025): split each trajectory's outcome
over its turns.

A progress estimator predicts a contribution c_t per turn from the history up to and including
turn t's action, trained so that a trajectory's contributions add up to its outcome reward R:

    L = (1/B) * sum_i ( sum_t c_{i,t} - R_i )^2

Here the estimator is a linear head on the policy's (detached) hidden state at each action's
last token, c_t = w . [h_t, 1]. Every RL step fits it on that step's trajectories (under
torchrun, on every rank's: core/credit/turn_credit.py), by default exactly: the weights closest
to the previous step's among those that minimise L (``ridge_step`` with ``spa_l2`` 0), so on the
batch it was fitted on a trajectory's contributions sum to its outcome whenever a linear head can
make them (B <= hidden size + 1 and no two identical trajectories with different outcomes; the
fit's loss is the ``spa/loss_after`` metric). ``spa_l2`` > 0 is a ridge step that keeps more of
the past and fits this step less. The head starts at zero and is saved in checkpoints.

SPA's reward for turn t is r_t = c_t (+ a grounding bonus for an executable action, left here to
the format reward). With ``w_spa`` > 0 the r_t, times ``w_spa``, enter the advantage as a
return-to-go (core/credit/assign.py): under PPO on each turn's last action token into GAE, as
SPA's PPO does; without a critic turn k gets sum_{j>=k} r_j less its task group's mean of the
same at turn k (core/algorithms/estimators.py ``spa_turn_advantages``). Every turn's c_t is recorded
as ``turn_signals`` name ``progress`` (source 'train').

Where SPA-RL's released code (WangHanLinHenry/SPA-RL-Agent) differs from its paper, and which
this follows (docs/learning.md says the same):

- estimator: the release puts its linear layer on the backbone's *logits* (vocabulary-sized) at
  each assistant turn's last token and fine-tunes the whole model offline (lr 3e-6, one epoch);
  here a linear head on the hidden state, fitted on line in closed form. Both regress
  sum_t c_t on R, the paper's loss.
- RL reward: the release's RL data (``prm/rl_data_org.py``) replaces every turn's contribution
  by the trajectory's outcome less the mean outcome of the task's other explored trajectories,
  plus a grounding term 0.5 (0 after "Nothing happens"); the paper's reward is the contribution
  plus grounding. This follows the paper: r_t = c_t.
- PPO: the release (``ppo/step_ppotrainer.py``) puts step k's reward on its last token
  multiplied by (T - k - 1), so the last step's counts 0, then runs TRL's GAE. This puts r_t on
  the turn's last token unweighted; GAE turns it into the return-to-go less the critic.
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
    loss is never above w_prev's. ``l2`` 0 is the limit: the least-squares weights closest to
    w_prev, w = w_prev + pinv(X) (y - X w_prev), which fit y exactly whenever some weights do.

    >>> ridge_step(torch.zeros(1, dtype=torch.float64), torch.tensor([[1.0], [2.0]],
    ...            dtype=torch.float64), torch.tensor([2.0, 4.0], dtype=torch.float64), 0.0)
    tensor([2.], dtype=torch.float64)
    """
    if l2 == 0:
        residual = (y - x @ w_prev)[:, None]
        return w_prev + torch.linalg.lstsq(x, residual, driver="gelsd").solution[:, 0]
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

    def __init__(self, hidden_size: int, l2: float = 0.0):
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
