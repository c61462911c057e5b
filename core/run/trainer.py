"""train(cfg, recorder): the training loop, sole owner of the optimizer.

A run is a sequence of steps numbered once: SFT warm-start steps 1..M (when ``sft_steps`` > 0),
then RL steps M+1..M+N. Held-out evaluation runs before training when there is no SFT (step 0),
right after SFT (carrying step M), every ``eval_every`` RL steps and at the end. One RL step
(core/run/steps.py ``rl_step``):

    rollout -> rewards -> advantages -> loss + optimizer step -> record

Each step function returns a ``StepRecord``; the recorder writes it in one transaction. Which
tasks a step draws is core/run/schedule.py's. Ctrl-C stops after the current step (status
'stopped'); a crash marks the run 'failed' with the error; ``max_bad_steps`` consecutive
non-finite updates stop the run as 'failed' (after recording the last one). Why an update was
skipped is kept in ``runs.error`` beside its ``update/*`` metrics.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from core.config import TrainConfig
from core.learn.distributed import ONE, Ranks, gather_step
from core.model import checkpoint
from core.run.lifecycle import StopFlag, stop_on_sigint
from core.run.step_rows import step_tables
from core.run.schedule import TrainingError
from core.run.steps import Setup, StepRecord, build, evaluate, rl_step, sft_step
from storage.behaviours import StepBehaviours

PROGRESS = {"reward/mean": "reward", "success/rate": "success", "sft/loss": "sft_loss",
            "eval/success": "eval", "time/step_s": "step_s"}
"""Metrics shown on the progress bar, with their short labels."""


def train(cfg: TrainConfig, recorder, progress: bool = True, ranks: Ranks = ONE) -> str:
    """Train and record one run (or continue ``cfg.resume``); return its run id.

    ``cfg`` is validated by whoever built it (``core.config.validate``): the command line does,
    once, where it reads its flags and config file. Under torchrun, ``ranks`` splits each batch
    across processes (core/learn/distributed.py); rank 0 alone records (the others pass a
    NullRecorder) and checkpoints."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    run = build(cfg, ranks)
    stop = StopFlag()
    # The Ctrl-C handler stays installed until the final status is written: a Stop that lands
    # after the last step must not leave the run marked 'running'.
    with stop_on_sigint(stop, "step"):  # core/run/lifecycle.py
        run_id = open_run(run, recorder)
        try:
            status, note = _loop(run, recorder, run_id, stop, progress and ranks.main)
        except Exception as exc:
            _mark_failed(recorder, run_id, exc)
            raise
        stop.finishing = True  # Ctrl-C from here on is ignored: the status write is short
        recorder.finish(status, error=note)
    return run_id


def _loop(run: Setup, recorder, run_id: str, stop: StopFlag,
          progress: bool) -> tuple[str, str | None]:
    """The steps; returns the run's final status ('finished' or 'stopped') and why the last
    skipped update was skipped (None if none was)."""
    cfg, ranks = run.cfg, run.ranks
    total = cfg.sft_steps + cfg.steps
    skipped = _Skips()
    write_step = _StepWriter(run, recorder)
    try:
        done = first_step(run, recorder, run_id)
        with tqdm(total=total, initial=max(done, 0), disable=not progress,
                  unit="step") as bar:
            if done < 0:  # the policy before any training: what step 1 and step 0's eval sample
                save_adapter(run, run_id, 0)
            if done < 0 and cfg.sft_steps == 0 and run.schedule.eval_on():
                write_step(0, evaluate(run, 0, progress))
            for step in range(max(done + 1, 1), total + 1):
                run.clock.start()
                record = sft_step(run, step) if step <= cfg.sft_steps else rl_step(run, step)
                record = record.with_metrics(run.clock.metrics())  # GPU peak memory and time
                skipped.count(record.bad, step)
                if run.schedule.eval_due(step):
                    record = record.with_evaluation(evaluate(run, step, progress))
                metrics = write_step(step, record)
                # every rank stops after the same step (a Ctrl-C may reach them apart)
                stop.stop_requested = bool(ranks.max([stop.stop_requested])[0])
                if skipped.in_a_row:  # this step's update was skipped: store why, then judge
                    recorder.set_status("running", error=skipped.note)
                    if skipped.in_a_row >= cfg.max_bad_steps:
                        raise TrainingError(f"{skipped.in_a_row} consecutive updates skipped "
                                            f"(max_bad_steps); last: {skipped.note}")
                if step % cfg.checkpoint_every == 0 or step == total or stop.stop_requested:
                    save(run, run_id, step)
                if cfg.adapter_every and (step % cfg.adapter_every == 0 or step == total or
                                          run.schedule.eval_due(step) or stop.stop_requested):
                    save_adapter(run, run_id, step)
                bar.update(1)
                bar.set_postfix({label: f"{metrics[k]:.3g}" for k, label in PROGRESS.items()
                                 if k in metrics})
                if stop.stop_requested:
                    return "stopped", skipped.note
    except KeyboardInterrupt:  # a second Ctrl-C: stop now, resume from the last checkpoint
        return "stopped", skipped.note
    return "finished", skipped.note


def _mark_failed(recorder, run_id: str, exc: Exception) -> None:
    if not run_id:
        return
    error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
    try:
        recorder.finish("failed", error=error)
    except Exception as mark_exc:  # e.g. the disk is full: report the first error
        tqdm.write(f"could not mark run {run_id} failed: {mark_exc}")


# -- start, resume, checkpoints -------------------------------------------------------------------
def open_run(run: Setup, recorder) -> str:
    """Start a new run, or reopen ``cfg.resume``; its run id. The config is stored as given, plus
    what this machine and model made of it (device, prompt format, LoRA modules): extra keys,
    which --resume ignores."""
    cfg = run.cfg
    config = {**cfg.to_dict(), **run.policy.resolved()}
    if not cfg.resume:
        return run.ranks.broadcast(recorder.start_run(config=config, name=cfg.name or None))
    recorder.resume_run(cfg.resume, config=config)
    return cfg.resume


def first_step(run: Setup, recorder, run_id: str) -> int:
    """Load where the run starts from (``init_from``, or its own last checkpoint when resumed);
    return the last completed step (-1 if none). A resumed run's steps after it are deleted."""
    cfg = run.cfg
    if not cfg.resume:
        return restore(run, run_id, cfg.init_from, f"cannot start from {cfg.init_from}") \
            if cfg.init_from else -1
    own = checkpoint.checkpoint_dir(cfg, run_id)
    if cfg.init_from and not (own / checkpoint.FILE).is_file():
        own = Path(cfg.init_from)  # stopped before its first checkpoint: start over from it
    done = restore(run, run_id, own, f"cannot resume {run_id}")
    recorder.delete_steps_after(done)
    return done


def restore(run: Setup, run_id: str, where, refusal: str) -> int:
    """Load the checkpoint at ``where`` into the policy and optimizer; its step (-1 if there is
    none). A checkpoint of another setup is refused, naming what differs."""
    cfg = run.cfg
    # rank 0 reads the checkpoint (it may be on rank 0's machine only) and hands it on
    ckpt = run.ranks.broadcast(checkpoint.load(Path(where)) if run.ranks.main else None)
    if ckpt is None:
        return -1
    _check_compatible(cfg, ckpt, refusal)
    note = checkpoint.restore(ckpt, run.policy,
                              run.sft_opt if ckpt.phase == "sft" else run.rl_opt)
    if note and run.ranks.main:
        tqdm.write(note)
    run.turn_credit.load_state(ckpt.heads)
    if cfg.init_from and not cfg.resume and cfg.adapter_every and run.ranks.main:
        save_adapter(run, run_id, ckpt.step)  # the policy the new run's first step starts from
    return ckpt.step


def _check_compatible(cfg: TrainConfig, ckpt, refusal: str) -> None:
    # an SFT-phase checkpoint has not used its algorithm yet: RL may go on with any
    keys = ("env", "model", "lora_rank", "lora_targets") + (("algo",) if ckpt.phase == "rl"
                                                             else ())
    for key in keys:
        if ckpt.config.get(key) != getattr(cfg, key):
            raise TrainingError(f"{refusal}: checkpoint has {key}="
                                f"{ckpt.config.get(key)!r}, config has {getattr(cfg, key)!r}")
    # Once RL has begun its KL reference is fixed (a checkpoint from before kl_reference existed
    # compared to the base model), and so is where SFT ended.
    had = ckpt.config.get("kl_reference", "base")
    if ckpt.phase == "rl" and had != cfg.kl_reference:
        raise TrainingError(f"{refusal}: its RL steps used kl_reference={had!r}, config has "
                            f"{cfg.kl_reference!r}")
    if ckpt.phase == "rl" and ckpt.config.get("sft_steps", 0) != cfg.sft_steps:
        raise TrainingError(f"{refusal}: its RL began after sft_steps="
                            f"{ckpt.config.get('sft_steps', 0)}, config has {cfg.sft_steps}")
    if ckpt.phase == "sft" and ckpt.step > cfg.sft_steps:
        raise TrainingError(f"{refusal}: checkpoint is after SFT step {ckpt.step}, config "
                            f"has sft_steps={cfg.sft_steps}")
    if ckpt.step > cfg.sft_steps + cfg.steps:
        raise TrainingError(f"{refusal}: checkpoint is after step {ckpt.step}, config has "
                            f"{cfg.sft_steps + cfg.steps} steps in all")


def save(run: Setup, run_id: str, step: int) -> None:
    if not run.ranks.main:  # the optimizer state is the same on every rank
        return
    cfg = run.cfg
    phase = "sft" if step <= cfg.sft_steps and cfg.sft_steps else "rl"
    checkpoint.save(checkpoint.checkpoint_dir(cfg, run_id), run.policy,
                    run.sft_opt if phase == "sft" else run.rl_opt, step, phase, cfg.to_dict(),
                    heads=run.turn_credit.state())


def save_adapter(run: Setup, run_id: str, step: int) -> None:
    """Keep the adapter as it is after ``step`` (core/model/checkpoint.py ``adapters/``), for
    branch-from-turn rollouts with the policy as it was."""
    if run.cfg.adapter_every and run.ranks.main:
        checkpoint.save_adapter(checkpoint.checkpoint_dir(run.cfg, run_id), run.policy, step)


# -- recording -------------------------------------------------------------------------------------
@dataclass
class _Skips:
    """Consecutive skipped updates, and why the last was skipped."""
    in_a_row: int = 0
    note: str | None = None

    def count(self, bad: str | None, step: int) -> None:
        if bad is None:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        self.note = f"step {step}: update skipped ({bad})"
        tqdm.write(self.note)


@dataclass
class _StepWriter:
    """Hands a finished step to the recorder (storage/recorder.py), which writes it in one
    transaction: metrics, trajectories (train, SFT and eval alike) with the stages' results as
    rows (core/run/step_rows.py), per-module gradient norms. Under torchrun rank 0 gathers every
    rank's trajectories and writes them all, each with its ``rank``; it also times the write."""
    run: Setup
    recorder: object
    last_write_s: float = 0.0
    """The previous step's database write: a write cannot time itself."""
    behaviours: StepBehaviours = field(default_factory=StepBehaviours)
    """Behaviours of the step's trajectories, what the advantage paid for, the alarms
    (storage/behaviours/); the same rows and metrics ``agentrl behaviours`` writes."""

    def __call__(self, step: int, record: StepRecord) -> dict:
        t_build = time.perf_counter()
        gathered = gather_step(self.run.ranks, record.trajs, record.results)
        if gathered is None:  # not rank 0: it records
            return record.metrics
        trajs, results, rank_of = gathered
        tables = step_tables(trajs, results)
        if self.run.ranks.world > 1:
            tables["trajectories"]["rank"] = rank_of
        norms = record.module_norms
        metrics = dict(record.metrics)
        t_behaviours = time.perf_counter()
        tables["behaviours"], paid = self.behaviours(step, tables)
        metrics.update(paid)
        metrics["time/behaviours_s"] = time.perf_counter() - t_behaviours
        if record.work_s is not None:
            # time/record_s is this step's row building plus the previous step's database write;
            # time/step_s leaves evaluation out (time/eval_s)
            metrics["time/record_s"] = time.perf_counter() - t_build + self.last_write_s
            metrics["time/step_s"] = record.work_s + metrics["time/record_s"]
        t_write = time.perf_counter()
        self.recorder.record_step(step, metrics=metrics, grad_stats={
            "module": list(norms), "norm": list(norms.values())}, **tables)
        self.last_write_s = time.perf_counter() - t_write
        return metrics
