"""SFT warm start: the environment's scripted expert demonstrates, LoRA learns to imitate.

The seed's point: SFT teaches the format, RL teaches the strategy. A demonstration is built as a
``Trajectory`` exactly like a rollout (same chat-templated prompt, same observation wrapping and
truncation, same roles), with the expert's action text in place of sampled tokens, so the masks
are the rollout's masks: only action tokens are trained, observations never are.

Demonstrations come from train-split tasks only; the held-out tasks are never shown. The expert's
episodes are called through the run's guard (core/envs/guard.py: a deadline on every call, byte
caps); a demonstration whose env call fails is left out, named on stderr, and SFT stops with the
env's error only when none is left. An episode with ``render()`` is drawn after reset and after
every step, as a rollout is (core/rollout/episode.py ``record_render``), so Replay shows the
expert's states too.
"""
from __future__ import annotations

import sys
from typing import Sequence

from core.envs.base import Environment, Task, observation_role
from core.envs.guard import EnvError, GuardedEpisode
from core.model.policy import token_texts
from core.rollout.episode import initial_state_key, record_render
from core.rollout.sampling import Sampling
from core.rollout.transcript import append_tokens, prompt_ids, record_turn
from core.rollout.trajectory import Trajectory


def demonstration(env: Environment, task: Task, tokenizer, sampling: Sampling, seed: int,
                  traj_id: str, group_id: str, guard=None) -> Trajectory:
    """One expert episode of ``task`` as a trajectory with split 'sft' (through ``guard`` when
    given: EnvError if a call into the env fails)."""
    if task.split != "train":
        raise ValueError(f"demonstrations use train tasks only; {task.task_id} is {task.split}")
    episode = guard.open(task, seed) if guard is not None else env.episode(task, seed=seed)
    traj = Trajectory(traj_id=traj_id, group_id=group_id, task=task, split="sft",
                      info={"episode_seed": seed})
    append_tokens(traj, prompt_ids(tokenizer, env.system_prompt, episode.reset()), "prompt", -1)
    record_render(traj, episode, -1)  # pictures as a rollout's (a guarded episode's) are kept
    reason, key = None, initial_state_key(episode)
    for turn in range(sampling.max_turns):
        action = (episode.call("expert_action", episode.inner.expert_action)
                  if isinstance(episode, GuardedEpisode) else episode.expert_action())
        ids = tokenizer.encode(action, add_special_tokens=False)
        ids = ids[:max(sampling.max_context - len(traj.token_ids), 0)]
        result = episode.step(action)
        _, reason = record_turn(traj, tokenizer, turn, action, ids, None, result, sampling,
                                state_key=key, role=observation_role(env))
        record_render(traj, episode, turn)
        key = result.state_key
        if reason is not None:
            break
    traj.finish_reason = reason or "max_turns"
    traj.outcome = episode.outcome()
    traj.token_text = token_texts(tokenizer, traj.token_ids)
    return traj


def demonstrations(env: Environment, tasks: Sequence[Task], tokenizer, sampling: Sampling,
                   seed: int, id_prefix: str) -> list[Trajectory]:
    out, failed = [], []
    with sampling.guard(env) as guard:
        for i, task in enumerate(tasks):
            try:
                out.append(demonstration(env, task, tokenizer, sampling, seed=seed * 1_000_003 + i,
                                         traj_id=f"{id_prefix}-d{i}", group_id=f"{id_prefix}-d{i}",
                                         guard=guard))
            except EnvError as exc:  # one broken expert episode does not stop SFT
                failed.append(exc)
                print(f"warning: SFT demonstration {id_prefix}-d{i} ({task.task_id}) left out: "
                      f"{exc}", file=sys.stderr, flush=True)
    if tasks and not out:
        raise failed[0]
    return out
