"""Jobs on a recorded run, launched from the app or the command line.

    branch            branch-from-turn continuations: V, Q and A per turn (branch_job,
                      branch_replay, branch_estimates, branch_export are its parts)
    evaluation        one checkpoint on another evaluation's held-out tasks and seeds
    clusters          failure clusters over trajectory embeddings (embedders)
    joblog            the progress and error lines the pages read
"""
from core.faces import lazy_face

__getattr__, __all__ = lazy_face(__name__, {
    "BranchError": "core.jobs.branch_replay",
    "EvaluationError": "core.jobs.evaluation",
    "prepare_branch": ("core.jobs.branch", "prepare_job"),
    "run_branch": ("core.jobs.branch", "run_job"),
})
