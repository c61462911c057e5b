"""A run: the loop that takes every stage in turn, and what it does around its steps.

    trainer         the training run: SFT warm start, then RL steps, each step recorded
    steps           one step (RL, SFT, held-out evaluation) as a function of the run's Setup
    collection      a run whose policy is an endpoint: episodes collected and recorded, no update
    schedule        which tasks each step draws, its seed, when held-out evaluation runs
    stage_results   what the stages after the rollout computed, by trajectory (StageResults)
    step_rows       a step's trajectories and stage results to the store's table rows
    lifecycle       Ctrl-C after the current step; how a run's end becomes an exit status
"""
from core.faces import lazy_face

__getattr__, __all__ = lazy_face(__name__, {
    "Schedule": "core.run.schedule",
    "record_and_exit": "core.run.lifecycle",
    "step_tables": "core.run.step_rows",
    "train": "core.run.trainer",
})
