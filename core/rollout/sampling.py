"""How a rollout samples: turn and token limits, temperature, the env's deadline, precision.
Torch-free; read by the episode engine (core/rollout/engine.py) and the transcript."""
from __future__ import annotations

from dataclasses import dataclass

from core.envs.base import Environment
from core.envs.guard import DEFAULT_TIMEOUT_S, Guard, obs_byte_cap


@dataclass
class Sampling:
    max_turns: int = 4
    max_new_tokens: int = 96
    max_obs_tokens: int = 256
    max_context: int = 1536
    temperature: float = 1.0
    top_p: float = 1.0
    final_answer_turn: bool = False
    """One extra answer-only generation for rows still going after max_turns (Search-R1)."""
    env_step_timeout: float = DEFAULT_TIMEOUT_S
    """Seconds one call into the env may take (core/envs/guard.py)."""
    precision: str = "auto"
    """The sampling pass's precision (``--rollout-dtype``; core/model/device.py ``rollout_autocast``)."""

    @classmethod
    def from_config(cls, cfg, eval: bool = False) -> "Sampling":
        return cls(max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens,
                   max_obs_tokens=cfg.max_obs_tokens, max_context=cfg.max_context,
                   temperature=cfg.eval_temperature if eval else cfg.temperature,
                   top_p=1.0 if eval else cfg.top_p,
                   final_answer_turn=bool(getattr(cfg, "final_answer_turn", False)),
                   env_step_timeout=float(getattr(cfg, "env_step_timeout", DEFAULT_TIMEOUT_S)),
                   precision=str(getattr(cfg, "rollout_dtype", "auto")))

    def guard(self, env: Environment) -> Guard:
        """The guard one rollout of ``env`` calls its episodes through."""
        return Guard(env, self.env_step_timeout, obs_byte_cap(self.max_obs_tokens),
                     max_prompt_bytes=obs_byte_cap(self.max_context))
