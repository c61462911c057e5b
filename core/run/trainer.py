"""train(cfg, recorder): the training loop, sole owner of the optimizer.

A run is a sequence of steps numbered once: SFT warm-start steps 1..M (when ``sft_steps`` > 0),
then RL steps M+1..M+N. Held-out evaluation runs before training when there is no SFT (step 0),
right after SFT (carrying step M), every ``eval_every`` RL steps and at the end. One RL step:

    rollout -> rewards -> advantages -> loss + optimizer step -> record

Every stage returns its results (trajectories, rewards on them, ``Credit``, ``UpdateResult``) and
the step's record takes them (``_Step``: trajectories, ``StageResults``, metrics); the recorder
writes the step in one transaction. Which tasks a step draws is core/run/schedule.py's.
Ctrl-C stops after the current step (status 'stopped'); a crash marks the run 'failed' with the
error; ``max_bad_steps`` consecutive non-finite updates stop the run as 'failed' (after recording
the last one). Why an update was skipped is kept in ``runs.error`` beside its ``update/*`` metrics.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from core.config import Environments, TrainConfig, validate
from core.config.algorithms import needs_value_head
from core.credit.assign import Credit, assign
from core.credit.scoring import score_all
from core.credit.turn_credit import TurnCredit
from core.learn.distributed import ONE, Ranks, gather_step, number_demos, number_rollouts
from core.learn.update import (carry_second_moments, make_samples, policy_update, score_reference,
                               score_values, sft_update)
from core.model import checkpoint
from core.model import device as devices
from core.model.policy import policy_from_config
from core.rollout.diagnostics import entropy_mean, rollout_metrics, success_of
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling
from core.rollout.sft import demonstrations
from core.run.lifecycle import stop_on_sigint
from core.run.records import StageResults, step_tables
from core.run.schedule import Schedule, TrainingError, eval_sampling_seed


PROGRESS = {"reward/mean": "reward", "success/rate": "success", "sft/loss": "sft_loss",
            "eval/success": "eval", "time/step_s": "step_s"}
"""Metrics shown on the progress bar, with their short labels."""


def train(cfg: TrainConfig, recorder, progress: bool = True, ranks: Ranks = ONE) -> str:
    """Train and record one run (or continue ``cfg.resume``); return its run id.

    Under torchrun, ``ranks`` splits each batch across processes (core/learn/distributed.py); rank 0
    alone records (the others pass a NullRecorder) and checkpoints."""
    validate(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    return _Run(cfg, recorder, progress and ranks.main, ranks).go()


class _Run:
    def __init__(self, cfg: TrainConfig, recorder, progress: bool, ranks: Ranks = ONE):
        self.cfg, self.recorder, self.progress, self.ranks = cfg, recorder, progress, ranks
        envs = Environments(cfg)
        self.env, self.sft_env, self.eval_env = envs.train, envs.sft, envs.eval
        # one GPU per rank under torchrun (cuda:LOCAL_RANK); ConfigError for a GPU not there
        self.device = devices.resolve(cfg.device, ranks.local_rank, ranks.world)
        ranks.use_device(self.device)
        self.policy = policy_from_config(cfg, device=self.device)
        self.clock = devices.StepClock(self.device)
        params = self.policy.trainable_parameters()
        ranks.sync_parameters(params)
        self.sft_opt = torch.optim.AdamW(params, lr=cfg.sft_lr, weight_decay=0.0)
        self.rl_opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
        self.sampling = Sampling.from_config(cfg)
        self.eval_sampling = Sampling.from_config(cfg, eval=True)
        self.schedule = Schedule(cfg, self.env, self.sft_env, self.eval_env)
        self.eval_tasks = self.schedule.eval_tasks
        self.bad_steps, self.last_write_s, self.stop_requested = 0, 0.0, False
        self.finishing = False
        self.skip_note: str | None = None
        """Why the last skipped update was skipped; stored in runs.error next to its metrics."""
        self.turn_credit = TurnCredit(cfg, self.policy, ranks)  # heads fitted on every rank's batch
        self.run_id = ""

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> int:
        """Start a new run or reopen cfg.resume; return the last completed step (-1 if none)."""
        cfg = self.cfg
        if not cfg.resume:
            # the config as given, plus what this machine and model made of it (device, prompt
            # format, LoRA modules): extra keys, which --resume ignores
            self.run_id = self.ranks.broadcast(self.recorder.start_run(
                config={**cfg.to_dict(), **self.policy.resolved()}, name=cfg.name or None))
            return self._restore(cfg.init_from, f"cannot start from {cfg.init_from}") \
                if cfg.init_from else -1
        self.run_id = cfg.resume
        self.recorder.resume_run(self.run_id, config={**cfg.to_dict(), **self.policy.resolved()})
        own = checkpoint.checkpoint_dir(cfg, self.run_id)
        if cfg.init_from and not (own / checkpoint.FILE).is_file():
            own = Path(cfg.init_from)  # stopped before its first checkpoint: start over from it
        done = self._restore(own, f"cannot resume {self.run_id}")
        self.recorder.delete_steps_after(done)
        return done

    def _restore(self, where, refusal: str) -> int:
        """Load the checkpoint at ``where`` into the policy and optimizer; its step (-1 if there
        is none). A checkpoint of another setup is refused, naming what differs."""
        cfg = self.cfg
        # rank 0 reads the checkpoint (it may be on rank 0's machine only) and hands it on
        ckpt = self.ranks.broadcast(checkpoint.load(Path(where)) if self.ranks.main else None)
        if ckpt is None:
            return -1
        # an SFT-phase checkpoint has not used its algorithm yet: RL may go on with any
        keys = ("env", "model", "lora_rank", "lora_targets") + (("algo",) if ckpt.phase == "rl"
                                                                 else ())
        for key in keys:
            if ckpt.config.get(key) != getattr(cfg, key):
                raise TrainingError(f"{refusal}: checkpoint has {key}="
                                    f"{ckpt.config.get(key)!r}, config has {getattr(cfg, key)!r}")
        # Once RL has begun its KL reference is fixed (a checkpoint from before kl_reference
        # existed compared to the base model), and so is where SFT ended.
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
        checkpoint.restore(ckpt, self.policy, self.sft_opt if ckpt.phase == "sft" else self.rl_opt)
        self.turn_credit.load_state(ckpt.heads)
        if cfg.init_from and not cfg.resume and cfg.adapter_every and self.ranks.main:
            self.save_adapter(ckpt.step)  # the policy the new run's first step starts from
        return ckpt.step

    def go(self) -> str:
        cfg = self.cfg
        total = cfg.sft_steps + cfg.steps
        # The Ctrl-C handler stays installed until the final status is written: a Stop that lands
        # after the last step must not leave the run marked 'running'.
        with stop_on_sigint(self, "step"):  # core/run/lifecycle.py
            status = self._loop(total)
            self.finishing = True  # Ctrl-C from here on is ignored: the status write is short
            self.recorder.finish(status, error=self.skip_note)
        return self.run_id

    def _loop(self, total: int) -> str:
        """The steps; returns the run's final status ('finished' or 'stopped')."""
        cfg, bar, status = self.cfg, None, "finished"
        try:
            done = self.start()
            bar = tqdm(total=total, initial=max(done, 0), disable=not self.progress, unit="step")
            if done < 0:  # the policy before any training: what step 1 and step 0's eval sample
                self.save_adapter(0)
            if done < 0 and cfg.sft_steps == 0 and self.schedule.eval_on():
                self.write(0, self.evaluate(0))
            for step in range(max(done + 1, 1), total + 1):
                self.clock.start()
                record = self.sft_step(step) if step <= cfg.sft_steps else self.rl_step(step)
                record.metrics.update(self.clock.metrics())  # GPU peak memory and time (CUDA)
                if self.schedule.eval_due(step):
                    record.add(self.evaluate(step))
                metrics = self.write(step, record)
                # every rank stops after the same step (a Ctrl-C may reach them apart)
                self.stop_requested = bool(self.ranks.max([self.stop_requested])[0])
                if self.bad_steps:  # this step's update was skipped: store why, then judge
                    self.recorder.set_status("running", error=self.skip_note)
                    if self.bad_steps >= cfg.max_bad_steps:
                        raise TrainingError(f"{self.bad_steps} consecutive updates skipped "
                                            f"(max_bad_steps); last: {self.skip_note}")
                if step % cfg.checkpoint_every == 0 or step == total or self.stop_requested:
                    self.save(step)
                if cfg.adapter_every and (step % cfg.adapter_every == 0 or step == total or
                                          self.schedule.eval_due(step) or self.stop_requested):
                    self.save_adapter(step)
                bar.update(1)
                bar.set_postfix({label: f"{metrics[k]:.3g}" for k, label in PROGRESS.items()
                                 if k in metrics})
                if self.stop_requested:
                    status = "stopped"
                    break
        except KeyboardInterrupt:  # a second Ctrl-C: stop now, resume from the last checkpoint
            status = "stopped"
        except Exception as exc:
            if self.run_id:
                error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
                try:
                    self.recorder.finish("failed", error=error)
                except Exception as mark_exc:  # e.g. the disk is full: report the first error
                    tqdm.write(f"could not mark run {self.run_id} failed: {mark_exc}")
            raise
        finally:
            if bar is not None:
                bar.close()
        return status

    def save(self, step: int) -> None:
        if not self.ranks.main:  # the optimizer state is the same on every rank
            return
        phase = "sft" if step <= self.cfg.sft_steps and self.cfg.sft_steps else "rl"
        checkpoint.save(checkpoint.checkpoint_dir(self.cfg, self.run_id), self.policy,
                        self.sft_opt if phase == "sft" else self.rl_opt, step, phase,
                        self.cfg.to_dict(), heads=self.turn_credit.state())

    def save_adapter(self, step: int) -> None:
        """Keep the adapter as it is after ``step`` (core/model/checkpoint.py ``adapters/``), for
        branch-from-turn rollouts with the policy as it was."""
        if self.cfg.adapter_every and self.ranks.main:
            checkpoint.save_adapter(checkpoint.checkpoint_dir(self.cfg, self.run_id), self.policy,
                                    step)

    # -- the steps --------------------------------------------------------------------------------
    def rl_step(self, step: int) -> "_Step":
        """rollout -> rewards -> advantages -> loss + optimizer step; each stage's result goes to
        the step's record."""
        cfg, policy = self.cfg, self.policy
        t0 = time.perf_counter()
        if cfg.kl_reference == "sft" and not policy.has_reference:
            # the first RL step (or a resume from the last SFT checkpoint): the policy as SFT
            # left it becomes the KL reference; a resumed RL phase restored it from the checkpoint
            policy.freeze_reference()
        if cfg.rl_moments == "sft":
            # the first RL step after SFT (or a resume from SFT's last checkpoint): RL's AdamW
            # starts from SFT's second moments, not the fresh state whose first step moves
            # every weight by lr (core/learn/update.py carry_second_moments); no-op once RL has stepped
            carry_second_moments(self.sft_opt, self.rl_opt)
        # -- rollout: this rank's whole groups
        own = self._rollouts(self.env, self.schedule.rl_tasks(step), cfg.group_size, self.sampling,
                             seed=(self.schedule.seed(step) + 7_919 * self.ranks.rank) % 2 ** 31,
                             prefix=f"s{step}")
        record = _Step(own)
        t1 = time.perf_counter()
        # -- rewards
        score_all(own, cfg)
        turns = self.turn_credit.measure(own)  # information gain, SPA progress, PRM scores
        for t in own:  # the sum of gains is recorded as a reward component (not in the total)
            if t.traj_id in turns.info_gain_totals:
                t.rewards["info_gain"] = turns.info_gain_totals[t.traj_id]
        record.results.turn_signals += turns.rows
        t2 = time.perf_counter()
        # -- advantages, over every rank's trajectories
        credit, trajs = self._credit(own, turns.gains, turns.contributions, turns.prm_scores)
        record.results.add_credit(own, credit.turn_advantages)
        # -- loss + optimizer step
        samples = make_samples(own, credit.per_token, credit.returns, credit.values)
        score_reference(policy, [s for s in samples if not s.traj.filtered], cfg)
        result = policy_update(policy, self.rl_opt, samples, cfg, seed=self.schedule.seed(step),
                               ranks=self.ranks)
        record.add_update(samples, result)
        self._check_bad(result.bad, step)
        t3 = time.perf_counter()
        record.metrics = {**self._rl_metrics(trajs, result, t1 - t0, t2 - t1, t3 - t2),
                          **turns.metrics}
        record.work_s = t3 - t0
        return record

    def _credit(self, own: list, gains: list | None = None, contributions: list | None = None,
                prm_scores: list | None = None) -> tuple[Credit, list]:
        """This rank's share of the batch's credit, and the whole batch: group statistics (and
        StarPO-S's top groups, PPO's whitening, information gain's group normalisation) need
        every rank's scored trajectories."""
        critic = needs_value_head(self.cfg.algo)
        values = score_values(self.policy, own, self.cfg) if critic else [None] * len(own)
        gains = gains if gains is not None else [None] * len(own)
        contributions = contributions if contributions is not None else [None] * len(own)
        prm_scores = prm_scores if prm_scores is not None else [None] * len(own)
        batch, first = self.ranks.everyone(list(zip(own, values, gains, contributions, prm_scores,
                                                    [self.ranks.rank] * len(own))))
        trajs = [b[0] for b in batch]
        credit = assign(trajs, self.cfg, [b[1] for b in batch] if critic else None,
                        info_gains=[b[2] for b in batch], progress=[b[3] for b in batch],
                        prm=[b[4] for b in batch], ranks_of=[b[5] for b in batch])
        for t, a, f in zip(trajs, credit.advantage, credit.filtered):
            # the record's and the update's per-trajectory credit: credit returns it, the run
            # puts it on the trajectories it records and trains on
            t.advantage, t.filtered = a, f
        return credit.part(first, first + len(own)), trajs

    def _rl_metrics(self, trajs: list, result, rollout_s: float, reward_s: float,
                    update_s: float) -> dict:
        generated = sum(t.response_tokens for t in trajs)
        metrics = {**rollout_metrics(trajs), **result.metrics,
                   "policy/entropy": entropy_mean(trajs),
                   "adv/mean": _mean([t.advantage for t in trajs]),
                   "adv/abs_mean": _mean([abs(t.advantage) for t in trajs]),
                   "adv/filtered_frac": _mean([float(t.filtered) for t in trajs]),
                   "update/skipped": float(result.bad is not None or
                                           "update/kl_aborted" in result.metrics),
                   "time/rollout_s": rollout_s, "time/reward_s": reward_s,
                   "time/update_s": update_s,
                   "perf/tokens_per_s": generated / max(rollout_s, 1e-9),
                   "perf/generated_tokens": float(generated)}
        if self.ranks.world > 1:
            metrics["dist/ranks"] = float(self.ranks.world)
        return metrics

    def sft_step(self, step: int) -> "_Step":
        cfg = self.cfg
        t0 = time.perf_counter()
        tasks = self.schedule.sft_tasks(step)
        mine = self.ranks.block(len(tasks))
        demos = demonstrations(self.sft_env, tasks[mine.start:mine.stop], self.policy.tokenizer,
                               self.sampling, seed=self.schedule.seed(step), id_prefix=f"s{step}")
        number_demos(demos, f"s{step}", mine.start)
        record = _Step(demos)
        t1 = time.perf_counter()
        score_all(demos, cfg)
        t2 = time.perf_counter()
        samples = make_samples(demos)
        result = sft_update(self.policy, self.sft_opt, samples, cfg, ranks=self.ranks,
                            seed=self.schedule.seed(step))
        record.add_update(samples, result)
        self._check_bad(result.bad, step)
        t3 = time.perf_counter()
        ok, reward, n = self.ranks.sum([sum(float(success_of(t)) for t in demos),
                                        sum(t.reward for t in demos), len(demos)])
        record.metrics = {**result.metrics,
                          "sft/demo_success": ok / n if n else 0.0,
                          "sft/demo_reward": reward / n if n else 0.0,
                          "time/rollout_s": t1 - t0, "time/reward_s": t2 - t1,
                          "time/update_s": t3 - t2}
        record.work_s = t3 - t0
        return record

    def evaluate(self, step: int) -> "_Step":
        """Held-out tasks, one rollout each at eval temperature, recorded with split 'eval'."""
        t0 = time.perf_counter()
        own = self._rollouts(self.eval_env, self.eval_tasks, 1, self.eval_sampling,
                             seed=eval_sampling_seed(self.cfg) + 7_919 * self.ranks.rank,
                             prefix=f"e{step}",
                             split="eval")
        score_all(own, self.cfg)
        trajs, _ = self.ranks.everyone(own)
        roll = rollout_metrics(trajs)
        metrics = {"eval/success": roll["success/rate"], "eval/reward_mean": roll["reward/mean"],
                   "eval/turns_mean": roll["env/turns_mean"],
                   "eval/valid_action_ratio": roll["env/valid_action_ratio"],
                   "eval/tasks": float(len(trajs)), "time/eval_s": time.perf_counter() - t0}
        if self.progress:
            tqdm.write(f"step {step}: eval/success {metrics['eval/success']:.3f} "
                       f"on {len(trajs)} held-out tasks")
        return _Step(own, metrics=metrics)

    def _rollouts(self, env, tasks: list, group_size: int, sampling: Sampling, seed: int,
                  prefix: str, split: str = "train") -> list:
        """This rank's share of ``tasks`` (whole groups), rolled out from this rank's ``seed``
        and numbered as one process would number them."""
        mine = self.ranks.block(len(tasks))
        own = rollout(self.policy, env, tasks[mine.start:mine.stop], group_size=group_size,
                      sampling=sampling, seed=seed,
                      id_prefix=prefix, split=split) if mine else []
        number_rollouts(own, prefix, mine.start, group_size)
        return own

    # -- recording --------------------------------------------------------------------------------
    def write(self, step: int, record: "_Step") -> dict:
        """Write the step in one transaction: metrics, trajectories (train, SFT and eval alike),
        rewards, turns, tokens, per-module gradient norms and test results. Under torchrun rank 0
        gathers every rank's trajectories and writes them all, each with its ``rank``."""
        t_build = time.perf_counter()
        gathered = gather_step(self.ranks, record.trajs, record.results)
        if gathered is None:  # not rank 0: it records
            return record.metrics
        trajs, results, rank_of = gathered
        tables = step_tables(trajs, results)
        if self.ranks.world > 1:
            tables["trajectories"]["rank"] = rank_of
        norms = record.module_norms
        grad_rows = {"module": list(norms), "norm": list(norms.values())}
        metrics = record.metrics
        if record.work_s is not None:
            # A write cannot time itself: time/record_s is this step's row building plus the
            # previous step's database write. time/step_s leaves evaluation out (time/eval_s).
            metrics["time/record_s"] = time.perf_counter() - t_build + self.last_write_s
            metrics["time/step_s"] = record.work_s + metrics["time/record_s"]
        t_write = time.perf_counter()
        self.recorder.record_step(step, metrics=metrics, grad_stats=grad_rows, **tables)
        self.last_write_s = time.perf_counter() - t_write
        return metrics

    def _check_bad(self, bad: str | None, step: int) -> None:
        if bad is None:
            self.bad_steps = 0
            return
        self.bad_steps += 1
        self.skip_note = f"step {step}: update skipped ({bad})"
        tqdm.write(self.skip_note)


@dataclass
class _Step:
    """What one step hands to the recorder: its trajectories as rollout and rewards left them,
    the later stages' results by trajectory (``StageResults``), metrics and module norms."""
    trajs: list
    results: StageResults = field(default_factory=StageResults)
    metrics: dict = field(default_factory=dict)
    work_s: float | None = None
    """Rollout + reward + update seconds (None for an evaluation alone)."""
    module_norms: dict = field(default_factory=dict)

    def add_update(self, samples, result) -> None:
        """The update's per-token values, per-trajectory and per-module gradient norms."""
        self.results.add_update(samples, result.grad_norms)
        self.module_norms = result.module_norms

    def add(self, other: "_Step") -> None:
        self.metrics.update(other.metrics)
        self.trajs = self.trajs + other.trajs
        self.results = self.results.merge(other.results)


def _mean(xs) -> float:
    xs = list(xs)
    return float(sum(xs) / len(xs)) if xs else 0.0
