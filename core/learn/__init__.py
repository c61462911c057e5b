"""Learning: losses, the policy update, ranks, and the training-inference mismatch.

    losses       policy and value losses, aggregations, KL (pure functions with formulas)
    update       one optimiser step over a batch of trajectories (RL and SFT)
    mismatch     sampler-versus-trainer logprob statistics and rollout correction (TIS, MIS, RS)
    distributed  several ranks: splitting batches into whole groups, gathering the step
"""
from core.faces import lazy_face

__getattr__, __all__ = lazy_face(__name__, {
    "Ranks": "core.learn.distributed",
    "distribution": "core.learn.mismatch",
    "make_samples": "core.learn.update",
    "policy_update": "core.learn.update",
    "sft_update": "core.learn.update",
})
