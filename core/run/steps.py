"""One training step as a function of what the run trains with: ``rl_step``, ``sft_step`` and
``evaluate`` each take the run's ``Setup`` and a step number and return a ``StepRecord``, which the
trainer (core/run/trainer.py) writes. One RL step:

    rollout -> rewards -> advantages -> loss + optimizer step

Every stage returns its results (trajectories, rewards on them, ``Credit``, ``UpdateResult``); the
step gathers them into its record. Nothing here records or decides when a run stops.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from core.config import Environments, TrainConfig
from core.credit.assign import Credit, assign
from core.algorithms.catalog import resolve
from core.algorithms.registry import Algorithm
from core.credit.scoring import score_all
from core.credit.turn_credit import TurnCredit
from core.learn.distributed import Ranks, number_demos, number_rollouts
from core.learn.update import (carry_second_moments, make_samples, policy_update, score_reference,
                               score_values, sft_update)
from core.model import device as devices
from core.model.policy import Policy, policy_from_config
from core.rollout.diagnostics import entropy_mean, rollout_metrics, success_of
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling
from core.rollout.sft import demonstrations
from core.run.stage_results import StageResults
from core.run.schedule import Schedule, eval_sampling_seed


@dataclass(frozen=True)
class Setup:
    """What a run trains with, built once (``build``) and the same at every step: the config,
    the ranks, the algorithm ``cfg.algo`` names (resolved once, here, and handed to the policy,
    credit and the update), the environments, the policy and its two optimizers, sampling
    settings, the task schedule and the turn-credit heads. The policy, optimizers and heads change as they learn;
    which objects they are does not."""
    cfg: TrainConfig
    ranks: Ranks
    algo: Algorithm
    envs: Environments
    device: torch.device
    policy: Policy
    clock: devices.StepClock
    sft_opt: torch.optim.Optimizer
    rl_opt: torch.optim.Optimizer
    sampling: Sampling
    eval_sampling: Sampling
    schedule: Schedule
    turn_credit: TurnCredit


def build(cfg: TrainConfig, ranks: Ranks) -> Setup:
    """The run's parts: one GPU per rank under torchrun (cuda:LOCAL_RANK; ConfigError for a GPU
    that is not there), the LoRA parameters the same on every rank, AdamW for SFT and for RL."""
    algo = resolve(cfg.algo)
    envs = Environments(cfg)
    device = devices.resolve(cfg.device, ranks.local_rank, ranks.world)
    ranks.use_device(device)
    policy = policy_from_config(cfg, device=device, value_head=algo.needs_value_head)
    params = policy.trainable_parameters()
    ranks.sync_parameters(params)
    return Setup(cfg=cfg, ranks=ranks, algo=algo, envs=envs, device=device, policy=policy,
                 clock=devices.StepClock(device),
                 sft_opt=torch.optim.AdamW(params, lr=cfg.sft_lr, weight_decay=0.0),
                 rl_opt=torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0),
                 sampling=Sampling.from_config(cfg),
                 eval_sampling=Sampling.from_config(cfg, eval=True),
                 schedule=Schedule(cfg, envs.train, envs.sft, envs.eval),
                 # heads fitted on every rank's batch
                 turn_credit=TurnCredit(cfg, policy, ranks))


@dataclass(frozen=True)
class StepRecord:
    """What one step hands to the recorder: its trajectories as rollout and rewards left them,
    the later stages' results by trajectory (``StageResults``), metrics and module norms."""
    trajs: list
    results: StageResults = field(default_factory=StageResults)
    metrics: dict = field(default_factory=dict)
    work_s: float | None = None
    """Rollout + reward + update seconds (None for an evaluation alone)."""
    module_norms: dict = field(default_factory=dict)
    bad: str | None = None
    """Why this step's update was skipped (a non-finite loss or gradient), else None."""

    def with_metrics(self, metrics: dict) -> "StepRecord":
        return dataclasses.replace(self, metrics={**self.metrics, **metrics})

    def with_evaluation(self, other: "StepRecord") -> "StepRecord":
        """This step and the held-out evaluation that followed it, written as one step."""
        return dataclasses.replace(self, trajs=self.trajs + other.trajs,
                                   results=self.results.merge(other.results),
                                   metrics={**self.metrics, **other.metrics})


def rl_step(run: Setup, step: int) -> StepRecord:
    """rollout -> rewards -> advantages -> loss + optimizer step; each stage's result goes into
    the step's record."""
    cfg, policy = run.cfg, run.policy
    t0 = time.perf_counter()
    if cfg.kl_reference == "sft" and not policy.has_reference:
        # the first RL step (or a resume from the last SFT checkpoint): the policy as SFT left it
        # becomes the KL reference; a resumed RL phase restored it from the checkpoint
        policy.freeze_reference()
    if cfg.rl_moments == "sft":
        # the first RL step after SFT (or a resume from SFT's last checkpoint): RL's AdamW starts
        # from SFT's second moments, not the fresh state whose first step moves every weight by lr
        # (core/learn/update.py carry_second_moments); no-op once RL has stepped
        carry_second_moments(run.sft_opt, run.rl_opt)
    # -- rollout: this rank's whole groups
    own = _rollouts(run, run.envs.train, run.schedule.rl_tasks(step), cfg.group_size, run.sampling,
                    seed=(run.schedule.seed(step) + 7_919 * run.ranks.rank) % 2 ** 31,
                    prefix=f"s{step}")
    t1 = time.perf_counter()
    # -- rewards
    score_all(own, cfg)
    turns = run.turn_credit.measure(own)  # information gain, SPA progress, PRM scores
    for t in own:  # the sum of gains is recorded as a reward component (not in the total)
        if t.traj_id in turns.info_gain_totals:
            t.rewards["info_gain"] = turns.info_gain_totals[t.traj_id]
    results = StageResults(turn_signals=list(turns.rows))
    t2 = time.perf_counter()
    # -- advantages, over every rank's trajectories
    credit, trajs = _credit(run, own, turns.gains, turns.contributions, turns.prm_scores)
    results.add_credit(own, credit.turn_advantages)
    # -- loss + optimizer step
    samples = make_samples(own, credit.per_token, credit.returns, credit.values)
    score_reference(policy, [s for s in samples if not s.traj.filtered], cfg)
    result = policy_update(policy, run.rl_opt, samples, cfg, seed=run.schedule.seed(step),
                           ranks=run.ranks, algo=run.algo)
    results.add_update(samples, result.grad_norms)
    t3 = time.perf_counter()
    return StepRecord(own, results, {**_rl_metrics(run, trajs, result, t1 - t0, t2 - t1, t3 - t2),
                                     **turns.metrics},
                      work_s=t3 - t0, module_norms=result.module_norms, bad=result.bad)


def _credit(run: Setup, own: list, gains: list | None = None, contributions: list | None = None,
            prm_scores: list | None = None) -> tuple[Credit, list]:
    """This rank's share of the batch's credit, and the whole batch: group statistics (and
    StarPO-S's top groups, PPO's whitening, information gain's group normalisation) need every
    rank's scored trajectories."""
    critic = run.algo.needs_value_head
    values = score_values(run.policy, own, run.cfg) if critic else [None] * len(own)
    gains = gains if gains is not None else [None] * len(own)
    contributions = contributions if contributions is not None else [None] * len(own)
    prm_scores = prm_scores if prm_scores is not None else [None] * len(own)
    batch, first = run.ranks.everyone(list(zip(own, values, gains, contributions, prm_scores,
                                               [run.ranks.rank] * len(own))))
    trajs = [b[0] for b in batch]
    credit = assign(trajs, run.cfg, [b[1] for b in batch] if critic else None,
                    info_gains=[b[2] for b in batch], progress=[b[3] for b in batch],
                    prm=[b[4] for b in batch], ranks_of=[b[5] for b in batch], algo=run.algo)
    for t, a, f in zip(trajs, credit.advantage, credit.filtered):
        # the record's and the update's per-trajectory credit: credit returns it, the step puts
        # it on the trajectories it records and trains on
        t.advantage, t.filtered = a, f
    return credit.part(first, first + len(own)), trajs


def _rl_metrics(run: Setup, trajs: list, result, rollout_s: float, reward_s: float,
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
    if run.ranks.world > 1:
        metrics["dist/ranks"] = float(run.ranks.world)
    return metrics


def sft_step(run: Setup, step: int) -> StepRecord:
    """The expert's demonstrations of this step's tasks, one supervised update on them."""
    t0 = time.perf_counter()
    tasks = run.schedule.sft_tasks(step)
    mine = run.ranks.block(len(tasks))
    demos = demonstrations(run.envs.sft, tasks[mine.start:mine.stop], run.policy.tokenizer,
                           run.sampling, seed=run.schedule.seed(step), id_prefix=f"s{step}")
    number_demos(demos, f"s{step}", mine.start)
    t1 = time.perf_counter()
    score_all(demos, run.cfg)
    t2 = time.perf_counter()
    samples = make_samples(demos)
    result = sft_update(run.policy, run.sft_opt, samples, run.cfg, ranks=run.ranks,
                        seed=run.schedule.seed(step))
    results = StageResults()
    results.add_update(samples, result.grad_norms)
    t3 = time.perf_counter()
    ok, reward, n = run.ranks.sum([sum(float(success_of(t)) for t in demos),
                                   sum(t.reward for t in demos), len(demos)])
    metrics = {**result.metrics,
               "sft/demo_success": ok / n if n else 0.0,
               "sft/demo_reward": reward / n if n else 0.0,
               "time/rollout_s": t1 - t0, "time/reward_s": t2 - t1, "time/update_s": t3 - t2}
    return StepRecord(demos, results, metrics, work_s=t3 - t0, module_norms=result.module_norms,
                      bad=result.bad)


def evaluate(run: Setup, step: int, progress: bool = False) -> StepRecord:
    """Held-out tasks, one rollout each at eval temperature, recorded with split 'eval'."""
    t0 = time.perf_counter()
    own = _rollouts(run, run.envs.eval, run.schedule.eval_tasks, 1, run.eval_sampling,
                    seed=eval_sampling_seed(run.cfg) + 7_919 * run.ranks.rank,
                    prefix=f"e{step}", split="eval")
    score_all(own, run.cfg)
    trajs, _ = run.ranks.everyone(own)
    roll = rollout_metrics(trajs)
    metrics = {"eval/success": roll["success/rate"], "eval/reward_mean": roll["reward/mean"],
               "eval/turns_mean": roll["env/turns_mean"],
               "eval/valid_action_ratio": roll["env/valid_action_ratio"],
               "eval/tasks": float(len(trajs)), "time/eval_s": time.perf_counter() - t0}
    if progress:
        tqdm.write(f"step {step}: eval/success {metrics['eval/success']:.3f} "
                   f"on {len(trajs)} held-out tasks")
    return StepRecord(own, metrics=metrics)


def _rollouts(run: Setup, env, tasks: list, group_size: int, sampling: Sampling, seed: int,
              prefix: str, split: str = "train") -> list:
    """This rank's share of ``tasks`` (whole groups), rolled out from this rank's ``seed`` and
    numbered as one process would number them."""
    mine = run.ranks.block(len(tasks))
    own = rollout(run.policy, env, tasks[mine.start:mine.stop], group_size=group_size,
                  sampling=sampling, seed=seed, id_prefix=prefix, split=split) if mine else []
    number_rollouts(own, prefix, mine.start, group_size)
    return own


def _mean(xs) -> float:
    xs = list(xs)
    return float(sum(xs) / len(xs)) if xs else 0.0
