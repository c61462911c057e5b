"""A recorded run rebuilt for a job on it (branch continuations, cross-evaluation): the check
that this trainer recorded it, and its configuration. The environments are the run's own
(``core.config.Environments``) and its tasks are drawn again by core/run/schedule.py."""
from __future__ import annotations

from dataclasses import fields

from core.config import TrainConfig

NEEDED = ("env", "model", "algo")


def require_trainer(source: str, run_id: str, error: type[Exception], role: str = "") -> None:
    """``error`` unless the run was recorded by this trainer: an imported run has no environment
    or policy to rebuild (its trainer was another program)."""
    if source != "trainer":
        whose = f"run {run_id!r}" + (f" ({role})" if role else "")
        raise error(f"{whose} was imported ({source}): its environment and policy cannot be "
                    "rebuilt here; jobs need a run this trainer recorded")


def config_of(config: dict, error: type[Exception], whose: str = "the run") -> TrainConfig:
    """The run's TrainConfig from its stored config; ``error`` naming a missing key or a value the
    config refuses. Keys this version does not know (a newer run's) are left out."""
    for key in NEEDED:
        if key not in config:
            raise error(f"{whose}'s configuration has no {key!r}")
    known = {f.name for f in fields(TrainConfig)}
    try:
        return TrainConfig(**{k: v for k, v in config.items() if k in known})
    except Exception as exc:
        raise error(f"{whose}'s configuration cannot be rebuilt: {exc}") from exc
