"""Continuations of recorded trajectories (core/jobs/branch.py): rows that start at different turns,
each replayed to its own state, run to their episodes' ends in ONE batch on the rollout engine of
core/rollout/engine.py (shared KV cache, left-padded chunks, rows leave as their episodes end).

The generation of a turn is the engine's own (``generate_turn``); only the turn bookkeeping (each
row's own turn counter) is here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from core.model.kv_cache import Batch
from core.model.policy import token_texts
from core.rollout.engine import _act, _fill_missing_logprobs, _finish, _Row, generate_turn
from core.rollout.trajectory import Turn


def recorded_turns(recorded: list[dict], upto: int) -> list:
    """The recorded turns 0..upto-1 as ``Turn`` records (a continuation's history)."""

    def load(v):
        if isinstance(v, str):
            try:
                return json.loads(v)
            except ValueError:
                return None
        return v if isinstance(v, (dict, list)) else None
    out = []
    for rec in recorded[:upto]:
        out.append(Turn(turn=int(rec["turn"]), action=str(rec.get("action") or ""),
                        observation=str(rec.get("observation") or ""),
                        valid=bool(rec.get("action_valid")),
                        action_type=str(rec.get("action_type") or "invalid"),
                        parsed=load(rec.get("parsed")), error=rec.get("error") or None,
                        state_diff=load(rec.get("state_diff")),
                        obs_truncated=bool(rec.get("obs_truncated")),
                        action_truncated=bool(rec.get("action_truncated")),
                        step_reward=float(rec.get("step_reward") or 0.0),
                        state_key=rec.get("state_key") or None, info=load(rec.get("info")) or {}))
    return out


@dataclass
class Start:
    """One continuation before it runs: its trajectory so far, its episode, its next turn."""
    traj: object
    episode: object
    next_turn: int
    state_key: str | None
    done_reason: str | None = None
    """Set when the episode already ended (a kept final action): nothing left to sample."""


def continue_all(policy, env, items: list[Start], sampling, seed: int, progress=None) -> list:
    """Run every unfinished continuation to its episode's end in ONE batch (the rollout engine of
    core/rollout/engine.py: shared KV cache, left-padded chunks, rows leave as their episodes end).
    Rows start at different turns; each carries its own turn counter. Returns the trajectories."""
    # deferred: torch, only when a model runs (importing this module stays torch-free)
    import torch

    # on the policy's device, like core/rollout/engine.py (each device reproducible on its own)
    generator = torch.Generator(device=getattr(policy, "device", "cpu")).manual_seed(seed)
    last = sampling.max_turns - 1 + int(sampling.final_answer_turn)
    rows, turn_of = [], {}
    for s in items:
        if s.done_reason is not None:
            continue
        row = _Row(traj=s.traj, episode=s.episode, pending=list(s.traj.token_ids),
                   state_key=s.state_key)
        turn_of[id(row)] = s.next_turn
        if s.next_turn > last:
            _finish(row, "max_turns")
        elif len(row.traj.token_ids) >= sampling.max_context:
            _finish(row, "context_full")
        else:
            rows.append(row)
    was_training = policy.model.training
    policy.model.eval()
    total, rounds = len(rows), 0
    try:
        with torch.inference_mode():
            batch = Batch(policy, rows, sampling.precision)
            while batch.rows:
                generate_turn(batch, env, sampling, generator)
                for row in batch.rows:
                    turn = turn_of[id(row)]
                    turn_of[id(row)] = turn + 1
                    _act(row, turn, sampling, policy.tokenizer, env,
                         final=sampling.final_answer_turn and turn == sampling.max_turns)
                    if not row.done and turn >= last:
                        _finish(row, "max_turns")
                batch.keep([i for i, row in enumerate(batch.rows) if not row.done])
                rounds += 1
                if progress is not None:
                    progress(total - len(batch.rows), total, rounds)
    finally:
        policy.model.train(was_training)
    trajs = [s.traj for s in items]
    _fill_missing_logprobs(policy, [r.traj for r in rows], sampling.temperature)
    for traj in trajs:
        traj.token_text = token_texts(policy.tokenizer, traj.token_ids)
    return trajs
