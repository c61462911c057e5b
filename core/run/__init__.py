"""A run: the loop that takes every stage in turn, and what it does around its steps.

    trainer     the training run: SFT warm start, then RL steps, each stage recorded
    collection  a run whose policy is an endpoint: episodes collected and recorded, no update
    schedule    which tasks each step draws, its seed, when held-out evaluation runs
    records     trajectories to the store's table rows
    lifecycle   Ctrl-C after the current step; how a run's end becomes an exit status
"""
import importlib

# Each name loads its module on first use (PEP 562), so importing one light module of this
# package (a dataclass, a pure function) does not load torch with its heavier siblings.
_EXPORTS = {
    "Schedule": ("core.run.schedule", "Schedule"),
    "record_and_exit": ("core.run.lifecycle", "record_and_exit"),
    "step_tables": ("core.run.records", "step_tables"),
    "train": ("core.run.trainer", "train"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    return getattr(importlib.import_module(module), attr)
