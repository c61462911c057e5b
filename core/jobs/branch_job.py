"""A validated branch job (core/jobs/branch.py): everything needed before the model loads."""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Job:
    """A validated branch job: everything needed before the model loads."""
    db: str
    run_id: str
    traj_id: str
    step: int
    split: str
    cfg: object
    env: object
    task: object
    episode_seed: int
    turns: list[int]
    k: int
    seed: int
    recorded: list[dict]
    tokens: object
    """The parent's tokens (DataFrame ordered by pos)."""
    ckpt_dir: Path
    snapshot_step: int
    sampled_by: int
    """The snapshot step that sampled the trajectory (the one before its step; an evaluation's
    own step); ``snapshot_step`` is the nearest kept one at or before it."""
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    keep: str = "fresh"
    """How keep continuations execute the kept action (core/jobs/branch_replay.py ``KEEP_MODES``):
    "fresh" draws its transition anew (Q(s_t, a_t)); "recorded" replays the recorded one."""
