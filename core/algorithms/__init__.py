"""The algorithms, torch-free: one registry (``REGISTRY``) of every ``--algo`` name, outcome
estimator and credit step, and the credit math on plain numbers that the trainer and the pages
share. Below ``core.config`` in the layer contract, so the config validates against it and the
pages import it directly.

    registry     Algorithm, Registry, REGISTRY; register_estimator, register_credit_step
    estimators   GRPO, Dr.GRPO, RLOO (registered), StarPO-S's filter, GiGPO's episode and
                 step terms, IGPO's, SPA's and the information-gain turn credits
    catalog      the seven algorithms, declared once; ALGOS, GROUP_ALGOS, resolve
"""
from core.algorithms.catalog import ALGOS, GROUP_ALGOS, REGISTRY, resolve
from core.algorithms.registry import Algorithm, register_credit_step, register_estimator

__all__ = ["ALGOS", "Algorithm", "GROUP_ALGOS", "REGISTRY", "register_credit_step",
           "register_estimator", "resolve"]
