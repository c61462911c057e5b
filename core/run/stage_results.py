"""What the stages after the rollout computed, by trajectory id, for the record: credit's
per-turn advantages and per-turn signals (information gain, ...), the update's per-token values
(advantage, new / reference / trainer logprob, value) and each trajectory's gradient norm.

None of it is kept on the Trajectory: the stages return it, core/run/steps.py gathers it in a
``StageResults`` and core/run/step_rows.py turns it into the store's columns beside the
trajectories.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from core.rollout.trajectory import Trajectory
from storage.trajectory import checked

TOKEN_VALUE_COLUMNS = checked("tokens", "advantage", "new_logprob", "ref_logprob", "value",
                              "train_logprob", "rejected")
"""The per-token values a ``StageResults`` holds: columns of the store's ``tokens`` table (the
trajectory model's, storage/trajectory.py).
``rejected``: True on a generated token rollout correction's rejection band left out of the loss
(``--rollout-correction mis|rs``), False on one it kept, None elsewhere and without rejection."""


@dataclass
class StageResults:
    """The credit and update stages' results for the record, by trajectory id."""
    turn_advantages: dict[str, list[float]] = field(default_factory=dict)
    """Per-turn advantages (GiGPO); a trajectory without has its advantage on every turn."""
    token_values: dict[str, dict[str, list]] = field(default_factory=dict)
    """``TOKEN_VALUE_COLUMNS`` per token, None where the token is untrained."""
    grad_norms: dict[str, float] = field(default_factory=dict)
    turn_signals: list[dict] = field(default_factory=list)
    """``turn_signals`` rows (traj_id, turn, name, value, source), e.g. core/credit/info_gain.py's."""

    def add_credit(self, trajs: Sequence[Trajectory], turn_advantages: Sequence) -> None:
        """Credit's per-turn advantages of ``trajs`` (``Credit.turn_advantages``, in order)."""
        self.turn_advantages.update({t.traj_id: list(a) for t, a in zip(trajs, turn_advantages)
                                     if a is not None})

    def add_update(self, samples: Sequence, grad_norms: Mapping[str, float]) -> None:
        """The updated samples' per-token values (core/learn/update.py ``Sample``) and the update's
        per-trajectory gradient norms (``UpdateResult.grad_norms``)."""
        for s in samples:
            mask = s.mask[0].tolist()
            rejected = s.rejected[0].tolist() if s.rejected is not None else None
            # the trainer scored the rejected tokens too: their logprob is the mismatch's
            scored = mask if rejected is None else [m or r for m, r in zip(mask, rejected)]

            def col(x, where=mask):
                return None if x is None else [float(v) if m else None
                                               for v, m in zip(x[0].tolist(), where)]
            self.token_values[s.traj.traj_id] = {
                "advantage": col(s.advantages), "new_logprob": col(s.new_logprobs),
                "ref_logprob": col(s.ref_logprobs), "value": col(s.values),
                "train_logprob": col(s.train_logprobs, scored),
                "rejected": None if rejected is None else
                [bool(r) if sc else None for r, sc in zip(rejected, scored)]}
        self.grad_norms.update(grad_norms)

    def merge(self, other: "StageResults") -> "StageResults":
        return StageResults({**self.turn_advantages, **other.turn_advantages},
                            {**self.token_values, **other.token_values},
                            {**self.grad_norms, **other.grad_norms},
                            self.turn_signals + other.turn_signals)
