"""Jobs on a recorded run, launched from the app or the command line.

    branch            branch-from-turn continuations: V, Q and A per turn (branch_job,
                      branch_replay, branch_estimates, branch_export are its parts)
    evaluation        one checkpoint on another evaluation's held-out tasks and seeds
    clusters          failure clusters over trajectory embeddings (embedders)
    joblog            the progress and error lines the pages read
"""
import importlib

# Each name loads its module on first use (PEP 562), so importing one light module of this
# package (a dataclass, a pure function) does not load torch with its heavier siblings.
_EXPORTS = {
    "BranchError": ("core.jobs.branch_replay", "BranchError"),
    "EvaluationError": ("core.jobs.evaluation", "EvaluationError"),
    "prepare_branch": ("core.jobs.branch", "prepare_job"),
    "run_branch": ("core.jobs.branch", "run_job"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    return getattr(importlib.import_module(module), attr)
