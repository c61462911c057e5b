"""Rollouts: the batched multi-turn episode engine and what it produces.

    trajectory    the plain records every later stage reads (Trajectory, Turn)
    sampling      how a rollout samples: limits, temperature, the env's deadline, precision
    transcript    chat-templated prompts and how a turn's tokens are appended and masked
    engine        the episode engine: generate, step the envs, grade (training, evaluation,
                  collection)
    draw          each row's next token: one uniform number a row, an inverse CDF
    continuation  recorded trajectories continued from a turn on the same engine (branch jobs)
    sft           the scripted expert's demonstrations as trajectories with the rollout's masks
    diagnostics   the per-step signals besides the loss (rollout statistics, gradient norms)
"""
from core.faces import lazy_face

__getattr__, __all__ = lazy_face(__name__, {
    "Sampling": "core.rollout.sampling",
    "Start": "core.rollout.continuation",
    "Trajectory": "core.rollout.trajectory",
    "Turn": "core.rollout.trajectory",
    "append_tokens": "core.rollout.transcript",
    "continue_all": "core.rollout.continuation",
    "demonstrations": "core.rollout.sft",
    "grade": "core.rollout.engine",
    "initial_state_key": "core.rollout.engine",
    "prompt_ids": "core.rollout.transcript",
    "record_turn": "core.rollout.transcript",
    "recorded_turns": "core.rollout.continuation",
    "rollout": "core.rollout.engine",
    "step_failed": "core.rollout.engine",
})
