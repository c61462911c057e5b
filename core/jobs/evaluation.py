"""Evaluate a checkpoint of one run on the held-out tasks and episode seeds of another
evaluation, so that Compare can pair the two task by task.

    python -m core.evaluation --db PATH --run RUN --step N --tasks-from RUN2:STEP2 [--seed S]
        [--device auto|cpu|cuda|cuda:N]

* The policy is RUN's: its model, LoRA settings and the adapter snapshot ``adapters/step-K.pt``
  with K the nearest kept step at or before N (printed when K != N), sampled the way RUN
  evaluates (``eval_temperature``, greedy by default; its turn and token limits).
* The tasks are RUN2's at STEP2, the ones actually used: each recorded eval trajectory's task id
  and episode seed (``info.episode_seed``), read through storage/evalsets.py, in the trainer's
  order; each task is drawn again from RUN2's configuration (env, its options, eval_env_options,
  seed, eval_tasks, as core/run/schedule.py draws held-out tasks) and its prompt must equal the
  recorded one. The episodes therefore run in RUN2's world with RUN2's seeds.
* All of them go through ONE batched rollout (the engine of core/rollout/engine.py through
  core/rollout/continuation.py: every row starts at turn 0 from its own seeded episode), scored like the
  trainer's held-out evaluation (core/credit/scoring.py), recorded in one transaction as a new run
  "RUN@K on RUN2@STEP2's tasks" whose single evaluation is at step K, its configuration RUN's
  with RUN2's task fields and ``cross_eval`` linking both (storage/evalsets.py).
* ``--seed`` seeds the sampling generator; by default the one RUN2's trainer evaluated with
  (its seed + 7), so RUN2's own checkpoint on its own tasks reproduces its evaluation. The same
  seed gives the same numbers; the same job again replaces its earlier result.

Exit 0 with the evaluation recorded; 2 with a message and nothing written for bad input (no
store, an unknown run or step, an imported run, no snapshot, another environment, tasks that
cannot be drawn again, a model that is not installed). Killed midway, it writes nothing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from core.config import ConfigError, Environments
from core.credit.scoring import score_all
from core.jobs.rebuild import config_of, require_trainer
from core.model import checkpoint
from core.model.device import resolve
from core.model.models import ModelNotAvailable
from core.model.policy import policy_from_config
from core.rollout.continuation import Start, continue_all
from core.rollout.diagnostics import rollout_metrics
from core.rollout.episode import initial_state_key
from core.rollout.sampling import Sampling
from core.rollout.trajectory import Trajectory
from core.rollout.transcript import append_tokens, prompt_ids
from core.run.step_rows import step_tables
from core.run.schedule import eval_sampling_seed, held_out_seed
from storage import evalsets
from storage.db import StoreError
from storage.evalsets import cross_run_id

TASK_FIELDS = ("env", "seed", "eval_seed", "topk", "outcome_metric", "env_options",
               "eval_env_options", "eval_tasks")
"""The configuration fields that decide the held-out tasks and their world (core/config/env_options.py,
core/run/schedule.py): the evaluated run takes these from the task run, everything else from its own."""


class EvaluationError(ValueError):
    """Bad input: the job cannot run (CLI exit 2, nothing written)."""


@dataclass
class Job:
    """A validated cross-evaluation: everything needed before the model loads."""
    db: str
    run: dict
    tasks_run: dict
    step: int
    tasks_step: int
    snapshot_step: int
    cfg: object
    """RUN's configuration with RUN2's TASK_FIELDS (the new run's)."""
    env: object
    tasks: list
    seeds: list[int]
    seed: int
    ckpt_dir: Path

    @property
    def run_id(self) -> str:
        return cross_run_id(self.run["run_id"], self.snapshot_step, self.tasks_run["run_id"],
                            self.tasks_step, self.seed)

    @property
    def name(self) -> str:
        return (f"{self.run['name']}@{self.snapshot_step} on {self.tasks_run['name']}@"
                f"{self.tasks_step}'s tasks")


def parse_tasks_from(spec: str) -> tuple[str, int]:
    run_id, sep, step = str(spec).rpartition(":")
    try:
        if not sep or not run_id:
            raise ValueError
        return run_id, int(step)
    except ValueError:
        raise EvaluationError(f"--tasks-from must be RUN:STEP, got {spec!r}") from None


def _run(db: str, run_id: str, role: str) -> dict:
    info = evalsets.run_info(db, run_id)
    if info is None:
        raise EvaluationError(f"no run {run_id!r} in {db}")
    require_trainer(info["source"], run_id, EvaluationError, role)
    return info


def heldout_tasks(cfg) -> tuple[object, list]:
    """(eval env, held-out tasks) drawn again from ``cfg`` exactly as core/run/schedule.py does."""
    env = Environments(cfg).eval
    return env, (env.tasks("heldout", cfg.eval_tasks, held_out_seed(cfg)) if cfg.eval_tasks
                 else [])


def prepare_job(db: str, run_id: str, step: int, tasks_from: str, seed: int | None = None) -> Job:
    """Check everything that can be checked before the model loads; EvaluationError if bad."""

    if not Path(db).is_file():
        raise EvaluationError(f"no store at {db}")
    tasks_run_id, tasks_step = parse_tasks_from(tasks_from)
    try:
        run = _run(db, run_id, "the checkpoint's run")
        other = _run(db, tasks_run_id, "the task set's run")
        recorded = evalsets.task_set(db, tasks_run_id, tasks_step)
    except StoreError as exc:
        raise EvaluationError(str(exc)) from exc
    if step < 0 or (run["last_step"] is not None and step > int(run["last_step"])):
        raise EvaluationError(f"run {run_id!r} has no step {step} (its last step is "
                              f"{run['last_step']})")
    if recorded.empty:
        raise EvaluationError(f"run {tasks_run_id!r} has no held-out evaluation at step "
                              f"{tasks_step}")
    if recorded["seed"].isna().any():
        raise EvaluationError(f"the evaluation {tasks_run_id}@{tasks_step} recorded no episode "
                              "seed for some tasks: its episodes cannot be run again")
    cfg_run = config_of(run["config"], EvaluationError, f"run {run_id!r}")
    cfg_tasks = config_of(other["config"], EvaluationError, f"run {tasks_run_id!r}")
    if cfg_run.env != cfg_tasks.env:
        raise EvaluationError(f"run {run_id!r} trained on {cfg_run.env!r}, the task set is of "
                              f"{cfg_tasks.env!r}: evaluate on a task set of its environment")
    cfg = cfg_run.replace(**{k: getattr(cfg_tasks, k) for k in TASK_FIELDS}, db=str(db))
    try:
        env, pool = heldout_tasks(cfg)
    except Exception as exc:
        raise EvaluationError(f"environment {cfg.env!r} of run {tasks_run_id!r} cannot be "
                              f"rebuilt: {type(exc).__name__}: {exc}") from exc
    by_id = {}
    for task in pool:
        by_id.setdefault(str(task.task_id), task)
    tasks = []
    for row in recorded.itertuples():
        task = by_id.get(str(row.task_id))
        if task is None:
            raise EvaluationError(f"task {row.task_id!r} of {tasks_run_id}@{tasks_step} is not "
                                  "among the held-out tasks drawn again from its configuration: "
                                  "the environment cannot be rebuilt as recorded")
        if pd.notna(row.prompt) and str(task.prompt) != str(row.prompt):
            raise EvaluationError(f"task {row.task_id!r} drawn again asks something else than "
                                  "the record: the environment cannot be rebuilt as recorded")
        tasks.append(task)
    ckpt_dir = evalsets.adapter_home(db, run_id, {"checkpoint_dir": cfg_run.checkpoint_dir})
    snap = checkpoint.nearest_adapter(ckpt_dir, step)
    if snap is None:
        raise EvaluationError(f"run {run_id!r} has no saved adapter at or before step {step} "
                              f"(looked in {ckpt_dir.parent.name}/{ckpt_dir.name}/"
                              f"{checkpoint.ADAPTERS}/); train with adapter_every > 0 to keep them")
    return Job(db=str(db), run=run, tasks_run=other, step=step, tasks_step=tasks_step,
               snapshot_step=snap, cfg=cfg, env=env, tasks=tasks,
               seeds=[int(s) for s in recorded["seed"]],
               seed=eval_sampling_seed(cfg_tasks) if seed is None else int(seed),
               ckpt_dir=ckpt_dir)


def starts(job: Job, tokenizer) -> list:
    """One row per recorded (task, seed) at turn 0: a fresh episode with that seed, its prompt."""
    prefix = f"e{job.snapshot_step}"
    out = []
    for g, (task, seed) in enumerate(zip(job.tasks, job.seeds)):
        episode = job.env.episode(task, seed=seed)
        traj = Trajectory(traj_id=f"{prefix}-g{g}-r0", group_id=f"{prefix}-g{g}", task=task,
                          split="eval", info={"episode_seed": seed})
        append_tokens(traj, prompt_ids(tokenizer, job.env.system_prompt, episode.reset()),
                      "prompt", turn=-1)
        out.append(Start(traj, episode, 0, initial_state_key(episode)))
    return out


def run_job(job: Job, progress=None, device: str = "auto") -> tuple[list, dict]:
    """Load RUN's policy with the snapshot, roll every task out in one batch, score; returns
    (trajectories, eval metrics as the trainer names them)."""
    # deferred: torch, only when a model runs (importing this module stays torch-free)
    import torch

    t0 = time.perf_counter()
    if job.cfg.threads:
        torch.set_num_threads(job.cfg.threads)
    try:
        policy = policy_from_config(job.cfg, device=resolve(device))
    except ModelNotAvailable as exc:
        raise EvaluationError(f"the model of run {job.run['run_id']!r} is not available: "
                              f"{exc}") from exc
    except ConfigError as exc:  # e.g. cuda asked for where torch sees none
        raise EvaluationError(str(exc)) from exc
    try:
        checkpoint.put_adapter(checkpoint.load_adapter(job.ckpt_dir, job.snapshot_step), policy)
    except RuntimeError as exc:
        raise EvaluationError(str(exc)) from exc
    sampling = Sampling.from_config(job.cfg, eval=True)
    trajs = continue_all(policy, job.env, starts(job, policy.tokenizer), sampling,
                         seed=job.seed, progress=progress)
    score_all(trajs, job.cfg)
    roll = rollout_metrics(trajs)
    metrics = {"eval/success": roll["success/rate"], "eval/reward_mean": roll["reward/mean"],
               "eval/turns_mean": roll["env/turns_mean"],
               "eval/valid_action_ratio": roll["env/valid_action_ratio"],
               "eval/tasks": float(len(trajs)), "time/eval_s": time.perf_counter() - t0}
    return trajs, metrics


def record(job: Job, trajs: list, metrics: dict) -> str:
    """The new run and its one evaluation, in one transaction; returns its run id."""
    config = {**job.run["config"], **{k: getattr(job.cfg, k) for k in TASK_FIELDS},
              "name": job.name, "db": job.db,
              evalsets.CONFIG_KEY: {
                  "checkpoint_run": job.run["run_id"], "checkpoint_step": job.step,
                  "snapshot_step": job.snapshot_step, "tasks_run": job.tasks_run["run_id"],
                  "tasks_step": job.tasks_step, "seed": job.seed}}
    evalsets.write(job.db, job.run_id, job.name, config, job.snapshot_step, metrics,
                   step_tables(trajs))
    return job.run_id
