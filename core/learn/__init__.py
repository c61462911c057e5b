"""Learning: losses, the policy update, ranks, and the training-inference mismatch.

    losses       policy and value losses, aggregations, KL (pure functions with formulas)
    update       one optimiser step over a batch of trajectories (RL and SFT)
    mismatch     sampler-versus-trainer logprob statistics and rollout correction (TIS, MIS)
    distributed  several ranks: splitting batches into whole groups, gathering the step
"""
import importlib

# Each name loads its module on first use (PEP 562), so importing one light module of this
# package (a dataclass, a pure function) does not load torch with its heavier siblings.
_EXPORTS = {
    "Ranks": ("core.learn.distributed", "Ranks"),
    "distribution": ("core.learn.mismatch", "distribution"),
    "make_samples": ("core.learn.update", "make_samples"),
    "policy_update": ("core.learn.update", "policy_update"),
    "sft_update": ("core.learn.update", "sft_update"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    return getattr(importlib.import_module(module), attr)
