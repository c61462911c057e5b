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
from core.faces import lazy_face

__getattr__, __all__ = lazy_face(__name__, {
    "Credit": "core.credit.assign",
    "ESTIMATORS": "core.credit.advantages",
    "TurnCredit": "core.credit.turn_credit",
    "assign": "core.credit.assign",
    "score": "core.credit.rewards",
    "score_all": "core.credit.scoring",
})
