"""Branch-from-turn counterfactual rollouts: which turn lost the reward? (AgentPRM-style
Monte-Carlo values of a recorded trajectory's states and actions.)

For each asked turn t of a recorded trajectory:

* rebuild the state before turn t: a fresh episode of the same task and episode seed, replaying the
  recorded actions a_0..a_{t-1}; every replayed observation must equal the recorded one, else the
  job is refused naming the first differing turn (``ReplayMismatch``; core/jobs/branch_replay.py);
* K continuations that sample a new action at t (``resample``) and K that keep the recorded a_t
  and sample from t+1 on (``keep``), each to the end of the episode, with the policy as it was
  (the nearest adapter snapshot at or before the one that sampled the trajectory) and fresh
  episode seeds after the replay (stochastic worlds: slips);
* all continuations of all turns go through one batched rollout (the engine of core/rollout/engine.py:
  one shared KV cache, rows leave as their episodes end).

Estimates (core/jobs/branch_estimates.py), with R the continuation's return (its reward as trained on,
core/credit/rewards.py)::

    V(s_t)      = mean of R over the resample continuations
    Q(s_t, a_t) = mean of R over the keep continuations
    A_t         = Q(s_t, a_t) - V(s_t)

with 95% intervals that stay truthful at small K (Wilson / Newcombe for 0-1 returns, else a
seeded bootstrap), and the worst turn: argmin_t A_t among the turns whose interval for A lies
below 0, "the turn that lost the reward"; when none does, the candidates with A < 0 and how many
continuations would tell (core/jobs/branch_estimates.py).

CLI (exit 0 with the estimates recorded; 2 with a message and nothing written for bad input)::

    python -m core.branch --db PATH --run RUN_ID --traj TRAJ_ID [--turns all|0,2] --k 8 [--seed S]
        [--export FILE.jsonl|FILE.parquet]
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from core.config import Environments
from core.credit.scoring import score_all
from core.envs.base import Outcome, observation_role
from core.envs.guard import GuardedEpisode

from core.jobs.branch_estimates import estimate, worst_turn
from core.jobs.branch_job import Job
from core.jobs.branch_replay import (KEEP_MODES, BranchError, ReplayMismatch, branch_point,
                                     end_reason, replay)
from core.jobs.rebuild import config_of, require_trainer
from core.model import checkpoint
from core.model.device import resolve
from core.model.policy import policy_from_config
from core.rollout.continuation import Start, continue_all, recorded_turns
from core.rollout.episode import grade
from core.rollout.sampling import Sampling
from core.rollout.trajectory import Trajectory, Turn
from core.rollout.transcript import prompt_ids, record_turn
from core.run.step_rows import step_tables
from core.run.schedule import Schedule
from storage import branches, evalsets
from storage.db import StoreError

MAX_K = 64
KINDS = ("resample", "keep")


def parse_turns(spec: str, n: int) -> list[int]:
    if n == 0:
        raise BranchError("the trajectory has no turns to branch from")
    if spec.strip().lower() == "all":
        return list(range(n))
    try:
        turns = sorted({int(p) for p in spec.split(",") if p.strip()})
    except ValueError:
        raise BranchError(f"--turns must be 'all' or comma-separated turn numbers, got {spec!r}")
    if not turns:
        raise BranchError("--turns names no turn")
    bad = [t for t in turns if not 0 <= t < n]
    if bad:
        raise BranchError(f"turn {bad[0]} is out of range: the trajectory has turns 0..{n - 1}")
    return turns


def _find_task(cfg, envs: Environments, split: str, task_id: str):
    """The recorded task and the environment it was played in, drawn again the way the trainer
    drew it (core/run/schedule.py)."""
    schedule = Schedule(cfg, envs.train, envs.sft, envs.eval)
    pools = [(envs.eval, schedule.eval_tasks)] if split == "eval" else \
        [(envs.sft, schedule.sft_pool), (envs.train, schedule.pool)] if split == "sft" else \
        [(envs.train, schedule.pool), (envs.sft, schedule.sft_pool)]
    for owner, pool in pools:
        for task in pool:
            if task.task_id == task_id:
                return owner, task
    raise BranchError(f"task {task_id!r} is not among the run's {split} tasks drawn again from "
                      "its configuration: the environment cannot be rebuilt")


def prepare_job(db: str, run_id: str, traj_id: str, turns: str = "all", k: int = 8,
                seed: int = 0, keep: str = "fresh") -> Job:
    """Check everything that can be checked before the model loads; BranchError if bad."""
    if keep not in KEEP_MODES:
        raise BranchError(f"--keep-transition must be one of {', '.join(KEEP_MODES)}, got {keep!r}")
    if not 1 <= k <= MAX_K:
        raise BranchError(f"--k must be between 1 and {MAX_K}, got {k}")
    if not Path(db).is_file():
        raise BranchError(f"no store at {db}")
    try:
        data = branches.parent(db, run_id, traj_id)
    except StoreError as exc:
        raise BranchError(str(exc)) from exc
    if data is None:
        raise BranchError(f"no run {run_id!r} in {db}")
    require_trainer(data["source"], run_id, BranchError)
    traj = data["traj"]
    if traj is None:
        raise BranchError(f"no trajectory {traj_id!r} in run {run_id!r}")
    split = str(traj.get("split") or "train")
    if split == "branch":
        raise BranchError(f"{traj_id!r} is itself a branch continuation; branch the trajectory it "
                          "came from")
    info = traj.get("info")
    info = json.loads(info) if isinstance(info, str) else (info or {})
    if "episode_seed" not in info:
        raise BranchError(f"{traj_id!r} has no recorded episode seed: its episode cannot be "
                          "replayed")
    turn_list = parse_turns(turns, len(data["turns"]))
    cfg = config_of(data["config"], BranchError)
    envs = Environments(cfg)
    try:
        envs.of_split(split)
    except Exception as exc:
        raise BranchError(f"environment {cfg.env!r} cannot be rebuilt: {exc}") from exc
    try:
        env, task = _find_task(cfg, envs, split, str(traj["task_id"]))
    except BranchError:
        raise
    except Exception as exc:
        raise BranchError(f"the run's tasks cannot be drawn again: {exc}") from exc
    step = int(traj["step"])
    ckpt_dir = evalsets.adapter_home(db, run_id, {"checkpoint_dir": cfg.checkpoint_dir})
    sampled_by = step if split == "eval" else max(step - 1, 0)
    snap = checkpoint.nearest_adapter(ckpt_dir, sampled_by)
    if snap is None:
        raise BranchError(f"run {run_id!r} has no saved adapter at or before step {sampled_by} "
                          f"(looked in {ckpt_dir.parent.name}/{ckpt_dir.name}/{checkpoint.ADAPTERS}/); "
                          "train with adapter_every > 0 to keep them")
    job = Job(db=str(db), run_id=run_id, traj_id=traj_id, step=step, split=split, cfg=cfg,
              env=env, task=task, episode_seed=int(info["episode_seed"]), turns=turn_list, k=k,
              seed=seed, recorded=data["turns"], tokens=data["tokens"], ckpt_dir=ckpt_dir,
              snapshot_step=snap, sampled_by=sampled_by, keep=keep)
    # every asked turn's start (and its kept action) must replay before any model work
    replay(env, task, job.episode_seed, job.recorded, max(turn_list) + 1)
    return job


# -- the continuations ----------------------------------------------------------------------------
def child_seed(seed: int, turn: int, kind: str, i: int) -> int:
    """The continuation's episode seed (fresh randomness after the replay)."""
    return (seed * 1_000_003 + turn * 7_919 + KINDS.index(kind) * 4_099 + i * 31 + 17) % 2 ** 31


def starts(job: Job, tokenizer, sampling, guard=None) -> list[Start]:
    """K resample and K keep continuations per asked turn, each at its branch point
    (core/jobs/branch_replay.py: a keep continuation's kept action is executed afresh, unless the job
    replays recorded transitions)."""
    tok = job.tokens
    out = []
    for turn in job.turns:
        for kind in KINDS:
            for i in range(job.k):
                seed = child_seed(job.seed, turn, kind, i)
                point = branch_point(job.env, job.task, job.episode_seed, job.recorded, turn,
                                     kind, seed, keep=job.keep, guard=guard)
                if i == 0 and kind == "resample":
                    want = prompt_ids(tokenizer, job.env.system_prompt, point.first)
                    have = [int(x) for x in tok[tok["turn"] < 0]["token_id"]]
                    if want != have:
                        raise ReplayMismatch(-1, "the prompt's tokens differ (another tokenizer "
                                                 "or system prompt)")
                out.append(_start(job, tokenizer, sampling, turn, kind, i, seed, point))
    return out


def _start(job: Job, tokenizer, sampling, turn: int, kind: str, i: int, seed: int,
           point) -> Start:
    """One continuation's trajectory so far: the recorded history before its first sampled turn
    (and, for a keep drawn afresh, the kept action with its new observation)."""
    tok, fresh = job.tokens, kind == "keep" and job.keep == "fresh"
    upto = turn + 1 if kind == "keep" else turn   # the next turn the policy samples
    history = turn if fresh else upto             # turns taken from the record as they were
    prefix = tok[tok["turn"] < history]
    traj = Trajectory(
        traj_id=f"{job.traj_id}~b{turn}{kind[0]}{i}", task=job.task, split="branch",
        group_id=f"{job.traj_id}~b{turn}{kind[0]}", turns=recorded_turns(job.recorded, history),
        info={"episode_seed": seed,
              "branch": {"parent": job.traj_id, "turn": turn, "kind": kind, "keep": job.keep,
                         "job_id": job.job_id, "checkpoint_step": job.snapshot_step,
                         "seed": job.seed}})
    traj.token_ids = [int(x) for x in prefix["token_id"]]
    traj.roles = [str(r) for r in prefix["role"]]
    # the history's own actions count as the episode's (cost per token), whatever mask the
    # parent's split applied; nothing of a continuation is ever trained
    traj.trained = [r == "action" for r in traj.roles]
    traj.logprobs = [None if lp is None or lp != lp else float(lp) for lp in prefix["logprob"]]
    traj.token_turn = [int(x) for x in prefix["turn"]]
    start, rec = Start(traj, point.episode, upto, point.key), job.recorded[turn]
    reason = None
    if fresh and point.kept is not None:   # the kept action, its transition drawn afresh
        acted = tok[(tok["turn"] == turn) & (tok["role"] == "action")]
        lps = [None if lp is None or lp != lp else float(lp) for lp in acted["logprob"]]
        _, reason = record_turn(traj, tokenizer, turn, str(rec.get("action") or ""),
                                [int(x) for x in acted["token_id"]], lps, point.kept, sampling,
                                action_truncated=bool(rec.get("action_truncated")),
                                state_key=rec.get("state_key") or None,
                                role=observation_role(job.env))
    elif fresh and point.kept_error is not None:
        traj.turns.append(Turn(turn=turn, action=str(rec.get("action") or ""), observation="",
                               valid=False, error=point.kept_error,
                               state_key=rec.get("state_key") or None))
        reason = "env_error"
    if point.done or reason is not None:
        start.done_reason = reason or end_reason(rec if fresh else job.recorded[upto - 1],
                                                 point.last)
        if isinstance(point.episode, GuardedEpisode):
            grade(traj, point.episode, start.done_reason)  # a failing outcome: env_error
        else:
            try:
                traj.outcome = point.episode.outcome()
            except Exception as exc:
                traj.outcome = Outcome(score=0.0, success=False, info={"error": repr(exc)})
            traj.finish_reason = start.done_reason
    return start


# -- recording ------------------------------------------------------------------------------------
@dataclass
class Result:
    job: Job
    children: list
    rows: list[dict]
    """``estimate`` per turn."""
    worst: int | None
    seconds: float = 0.0


def returns_of(children: list) -> dict[int, dict[str, list[float]]]:
    """The scored continuations' returns by turn and kind, as ``estimate`` takes them."""
    out: dict[int, dict[str, list[float]]] = {}
    for t in children:
        b = t.info["branch"]
        out.setdefault(b["turn"], {k: [] for k in KINDS})[b["kind"]].append(float(t.reward))
    return out


def record(result: Result) -> None:
    """The job in one transaction (storage/branches.py): continuations (split 'branch', never
    trained), one ``branches`` row each, the per-turn summary in ``turn_signals``."""

    job = result.job
    tables = step_tables(result.children)
    tokens = tables["tokens"]
    tokens["trained"] = [False] * len(tokens["trained"])  # no optimiser ever saw them
    brows = [{"traj_id": job.traj_id, "turn": t.info["branch"]["turn"],
              "kind": t.info["branch"]["kind"], "child_traj_id": t.traj_id,
              "return": float(t.reward), "checkpoint_step": job.snapshot_step,
              "job_id": job.job_id, "seed": job.seed} for t in result.children]
    srows = [{"traj_id": job.traj_id, "turn": r["turn"], "name": name, "value": float(r[name]),
              "source": "branch"}
             for r in result.rows for name in ("q", "v", "a", "q_lo", "q_hi", "v_lo", "v_hi",
                                               "a_lo", "a_hi", "n", "k_needed")]
    for r in result.rows:
        srows.append({"traj_id": job.traj_id, "turn": r["turn"], "name": "worst",
                      "value": float(r["turn"] == result.worst), "source": "branch"})
    branches.write_job(job.db, job.run_id, job.step, job.traj_id, job.turns, tables,
                       pd.DataFrame(brows), pd.DataFrame(srows))


# -- run ------------------------------------------------------------------------------------------
def run_job(job: Job, progress=None, device: str = "auto") -> Result:
    """Load the policy as it was (on ``device``: auto is CUDA when torch sees a GPU), run every
    continuation in one batch, score and estimate."""
    # deferred: torch, only when a model runs (importing this module stays torch-free)
    import torch

    t0 = time.perf_counter()
    if job.cfg.threads:
        torch.set_num_threads(job.cfg.threads)
    try:
        where = resolve(device)
    except Exception as exc:  # ConfigError: e.g. cuda asked for where torch sees none
        raise BranchError(str(exc)) from exc
    policy = policy_from_config(job.cfg, device=where)
    checkpoint.put_adapter(checkpoint.load_adapter(job.ckpt_dir, job.snapshot_step), policy)
    # the policy's own sampling (training temperature) even for an evaluation trajectory: a
    # greedy evaluation would make the K continuations one
    sampling = Sampling.from_config(job.cfg)
    # every episode call under the run's deadline and caps (core/envs/guard.py), on the
    # episode's own worker from the replay on
    with sampling.guard(job.env) as guard:
        items = starts(job, policy.tokenizer, sampling, guard)
        children = continue_all(policy, job.env, items, sampling, seed=job.seed,
                                progress=progress)
    score_all(children, job.cfg)
    rows = estimate(returns_of(children), seed=job.seed)
    return Result(job, children, rows, worst_turn(rows), time.perf_counter() - t0)
