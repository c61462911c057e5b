"""Plain records a rollout produces and every later stage reads. Torch-free.

``Trajectory`` holds the exact token sequence the model saw (prompt, its own action tokens,
observation tokens) with the loss mask, plus the turn-level view (action text, observation,
validity). Rewards, failure classes and the recorder all read these; nothing re-tokenises.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.envs.base import Outcome, Task

FINISH_REASONS = ("answered", "done", "max_turns", "invalid", "context_full", "env_error",
                  "final_answer")
"""``final_answer``: the episode hit max_turns and answered in the one extra generation that
``final_answer_turn`` grants (Search-R1); one that did not answer even then is ``max_turns``."""


@dataclass
class Turn:
    turn: int
    action: str
    """The model's action text exactly as sampled (cut right after the stop tag)."""
    observation: str
    """The env's reply as appended to the context (after truncation)."""
    valid: bool
    action_type: str = "invalid"
    parsed: dict[str, Any] | None = None
    error: str | None = None
    state_diff: list[dict[str, Any]] | None = None
    obs_truncated: bool = False
    action_truncated: bool = False
    """Generation hit max_new_tokens before a stop tag."""
    latency_s: float = 0.0
    """Wall time of env.step for this action."""
    step_reward: float = 0.0
    env_failed: bool = False
    """The env's step raised, ran past its deadline or returned something unusable (``error``
    says which; core/envs/guard.py): it gave no reward, so ``step_reward`` is recorded as NULL
    (and counts 0 in credit)."""
    action_tokens: int = 0
    state_key: str | None = None
    """Key of the environment state this turn acted from (GiGPO's anchor): the episode's
    ``state_key()`` at the start, then the previous step's ``StepResult.state_key``."""
    info: dict[str, Any] = field(default_factory=dict)
    """``StepResult.info`` of this turn (slips, sandbox layers, counters)."""


@dataclass
class Trajectory:
    traj_id: str
    group_id: str
    task: Task
    split: str = "train"
    turns: list[Turn] = field(default_factory=list)
    finish_reason: str = "max_turns"
    outcome: Outcome | None = None
    # Token-level view, parallel lists over the whole context, in order.
    token_ids: list[int] = field(default_factory=list)
    token_text: list[str] = field(default_factory=list)
    """Per-token text; ''.join(token_text) is exactly the decoded context."""
    roles: list[str] = field(default_factory=list)
    """prompt | action | observation"""
    trained: list[bool] = field(default_factory=list)
    """The loss mask: True exactly on the model's own action tokens."""
    logprobs: list[float | None] = field(default_factory=list)
    """Sampling policy's logprob of each action token; None elsewhere."""
    token_turn: list[int] = field(default_factory=list)
    """Turn index each token belongs to (-1 for the prompt)."""
    # Filled by the reward and credit stages (the trajectory's own outcome, not per-token data).
    rewards: dict[str, float] = field(default_factory=dict)
    """Reward components: outcome, format, cost, process."""
    reward: float = 0.0
    """Weighted total used for training."""
    advantage: float = 0.0
    filtered: bool = False
    failure_class: str | None = None
    renders: list[dict[str, Any]] = field(default_factory=list)
    """The episode's own pictures of its state (``Episode.render()``, core/envs/render.py):
    ``{"turn", "kind", "body"}``, turn -1 the state after reset, turn t the state after turn t's
    action. Empty for an env without ``render``."""
    info: dict[str, Any] = field(default_factory=dict)
    """The rollout's own extras (episode seed; ``token_entropy``, which has its own column),
    recorded as ``trajectories.info``. The stages after rewards do not write here: they return
    their results (``Credit``, ``UpdateResult``) and the record takes them (``StageResults``)."""

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def response_tokens(self) -> int:
        return sum(self.trained)

    @property
    def answer(self) -> str | None:
        return self.outcome.answer if self.outcome else None
