"""Rollouts: the batched multi-turn episode engine and what it produces.

    trajectory    the plain records every later stage reads (Trajectory, Turn)
    sampling      how a rollout samples: limits, temperature, the env's deadline, precision
    transcript    chat-templated prompts and how a turn's tokens are appended and masked
    engine        the episode engine: generate, step the envs, grade (training, evaluation,
                  collection)
    continuation  recorded trajectories continued from a turn on the same engine (branch jobs)
    sft           the scripted expert's demonstrations as trajectories with the rollout's masks
    diagnostics   the per-step signals besides the loss (rollout statistics, gradient norms)
"""
import importlib

# Each name loads its module on first use (PEP 562), so importing one light module of this
# package (a dataclass, a pure function) does not load torch with its heavier siblings.
_EXPORTS = {
    "Sampling": ("core.rollout.sampling", "Sampling"),
    "Start": ("core.rollout.continuation", "Start"),
    "Trajectory": ("core.rollout.trajectory", "Trajectory"),
    "Turn": ("core.rollout.trajectory", "Turn"),
    "append_tokens": ("core.rollout.transcript", "append_tokens"),
    "continue_all": ("core.rollout.continuation", "continue_all"),
    "demonstrations": ("core.rollout.sft", "demonstrations"),
    "grade": ("core.rollout.engine", "grade"),
    "initial_state_key": ("core.rollout.engine", "initial_state_key"),
    "prompt_ids": ("core.rollout.transcript", "prompt_ids"),
    "record_turn": ("core.rollout.transcript", "record_turn"),
    "recorded_turns": ("core.rollout.continuation", "recorded_turns"),
    "rollout": ("core.rollout.engine", "rollout"),
    "step_failed": ("core.rollout.engine", "step_failed"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    return getattr(importlib.import_module(module), attr)
