"""The one registry of the algorithms: every ``--algo`` name, every outcome estimator and every
credit step, each registered where it is defined (verl's ``@register_adv_est`` habit).
Torch-free and below the config in the layer contract, so the config validates names against it
and the pages read it directly.

    REGISTRY.estimators     name -> NumPy estimator (rewards (B,), group_ids) -> advantages (B,)
                            registered by ``@register_estimator`` in core/algorithms/estimators.py
    REGISTRY.credit_steps   name -> credit step (trajectories, cfg, algo, values) -> Credit
                            registered by ``@register_credit_step`` in core/credit/assign.py
    REGISTRY.algorithms     name -> ``Algorithm``: which estimator and which credit step, the
                            defaults it is defined with; declared in core/algorithms/catalog.py

A run resolves its ``cfg.algo`` once, when it is built (``resolve``), and hands the
``Algorithm`` to every stage; nothing else looks an algorithm up by name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np


@dataclass(frozen=True)
class Algorithm:
    name: str
    summary: str
    """One line for --help, the Train page and docs/architecture.md."""
    estimator: str | None
    """Registered outcome estimator (B,) -> (B,); None when advantages are per token (GAE)."""
    credit: str
    """Registered credit step: outcome | starpo_s | gigpo | gae."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """TrainConfig values the algorithm is defined with; the config applies them to fields the
    user did not set (an explicit value from Python, a preset, YAML or a flag always wins)."""
    needs_value_head: bool = False
    """Trains a value head beside the policy (a critic) and feeds its estimates to credit."""
    group_based: bool = True
    """Compares rollouts of one task with each other: needs group_size >= 2."""
    source: str = ""
    """Where the recipe comes from."""

    def estimate(self, rewards, group_ids) -> np.ndarray:
        """This algorithm's outcome advantages (NumPy float64, (B,)); ValueError without one."""
        if self.estimator is None:
            raise ValueError(f"{self.name} has no outcome estimator (its credit is {self.credit})")
        return REGISTRY.estimators[self.estimator](rewards, group_ids)

    @property
    def credit_step(self) -> Callable:
        """The registered credit step (core/credit/assign.py registers them on import)."""
        if self.credit not in REGISTRY.credit_steps:
            raise LookupError(f"credit step {self.credit!r} of {self.name} is not registered: "
                              "import core.credit.assign first")
        return REGISTRY.credit_steps[self.credit]


class Registry:
    """Names to estimators, credit steps and algorithms; a name registered twice is an error."""

    def __init__(self) -> None:
        self.estimators: dict[str, Callable[..., np.ndarray]] = {}
        self.credit_steps: dict[str, Callable] = {}
        self.algorithms: dict[str, Algorithm] = {}

    @staticmethod
    def _put(table: dict, name: str, value, what: str) -> None:
        if name in table and table[name] is not value:
            raise ValueError(f"{what} {name!r} is registered twice")
        table[name] = value

    def estimator(self, name: str) -> Callable[[Callable], Callable]:
        def register(fn: Callable) -> Callable:
            self._put(self.estimators, name, fn, "estimator")
            return fn
        return register

    def credit_step(self, name: str) -> Callable[[Callable], Callable]:
        def register(fn: Callable) -> Callable:
            self._put(self.credit_steps, name, fn, "credit step")
            return fn
        return register

    def algorithm(self, algo: Algorithm) -> Algorithm:
        if algo.estimator is not None and algo.estimator not in self.estimators:
            raise ValueError(f"algorithm {algo.name!r}: estimator {algo.estimator!r} is not "
                             "registered")
        self._put(self.algorithms, algo.name, algo, "algorithm")
        return algo

    def resolve(self, name: str) -> Algorithm:
        """The algorithm called ``name``; ValueError listing the known ones."""
        if name not in self.algorithms:
            raise ValueError(f"unknown algorithm {name!r}; one of {', '.join(self.algorithms)}")
        return self.algorithms[name]


REGISTRY = Registry()
register_estimator = REGISTRY.estimator
register_credit_step = REGISTRY.credit_step
