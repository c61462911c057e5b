"""Credit: rewards, and how they become per-token advantages.

    rewards      the four reward components and their weighted total (pure functions)
    scoring      the reward stage every step runs, failure class included
    advantages   outcome-level estimators (GRPO, Dr.GRPO, RLOO; ESTIMATORS), GAE, StarPO-S
    assign       the credit stage: each algorithm's step (STEPS) to per-token advantages
    info_gain    IGPO's per-turn information gain
    progress     SPA's progress model (per-turn contributions)
    prm          the process reward model fitted on branch labels
    turn_credit  the dense per-turn credits added to the outcome's
"""
import importlib

# Each name loads its module on first use (PEP 562), so importing one light module of this
# package (a dataclass, a pure function) does not load torch with its heavier siblings.
_EXPORTS = {
    "Credit": ("core.credit.assign", "Credit"),
    "ESTIMATORS": ("core.credit.advantages", "ESTIMATORS"),
    "TurnCredit": ("core.credit.turn_credit", "TurnCredit"),
    "assign": ("core.credit.assign", "assign"),
    "score": ("core.credit.rewards", "score"),
    "score_all": ("core.credit.scoring", "score_all"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    return getattr(importlib.import_module(module), attr)
