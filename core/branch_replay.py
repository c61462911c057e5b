"""Rebuilding a recorded state for a branch job (core/branch.py): a fresh episode of the same task
and episode seed, replaying the recorded actions a_0..a_{t-1}. Every environment is deterministic
from (task, seed), so every replayed observation (and state key) must equal the recorded one, else
the job is refused naming the first differing turn (``ReplayMismatch``).
"""
from __future__ import annotations

import random


class BranchError(ValueError):
    """Bad input: the job cannot run (CLI exit 2, nothing written)."""


class ReplayMismatch(BranchError):
    def __init__(self, turn: int, why: str):
        self.turn = turn
        super().__init__(f"replay differs from the record at turn {turn}: {why}; the "
                         "trajectory's environment cannot be rebuilt as recorded")


def _same_observation(replayed: str, recorded: str | None, truncated: bool) -> bool:
    recorded = recorded or ""
    if not truncated:
        return replayed == recorded
    # a cut observation is the decoded prefix of its tokens: its last character may be a
    # partial one, so compare up to it
    return replayed.startswith(recorded[:-1])


def _not_executed(turn: dict) -> bool:
    """The final-answer turn recorded an action it did not execute (core/rollout.py)."""
    return str(turn.get("error") or "").startswith("final-answer turn")


def replay(env, task, episode_seed: int, recorded: list[dict], upto: int):
    """A fresh episode of ``task`` with ``episode_seed`` after the recorded actions
    a_0..a_{upto-1}: returns (episode, first message, state key now, done, last StepResult).
    Raises ``ReplayMismatch`` at the first turn whose observation, state or end differs."""
    from core.rollout import initial_state_key
    episode = env.episode(task, seed=episode_seed)
    first = episode.reset()
    key, done, result = initial_state_key(episode), False, None
    for k in range(upto):
        rec = recorded[k]
        if done:
            raise ReplayMismatch(k, "the replayed episode had already ended")
        if rec.get("state_key") is not None and key is not None and str(key) != rec["state_key"]:
            raise ReplayMismatch(k, f"state {key!r} instead of {rec['state_key']!r}")
        if _not_executed(rec):
            done = True
            continue
        try:
            result = episode.step(rec["action"])
        except Exception as exc:
            raise ReplayMismatch(k, f"the environment raised {type(exc).__name__}: {exc}") from exc
        if not _same_observation(result.observation, rec.get("observation"),
                                 bool(rec.get("obs_truncated"))):
            raise ReplayMismatch(k, "the observation differs")
        key, done = result.state_key, bool(result.done)
    return episode, first, key, done, result


def reseed(episode, seed: int) -> None:
    """Fresh randomness for a continuation after the replay: the episode's ``reseed(seed)`` when
    it has one, else its ``rng`` when that is a ``random.Random`` (the grid games' slips)."""
    if callable(getattr(episode, "reseed", None)):
        episode.reseed(seed)
    elif isinstance(getattr(episode, "rng", None), random.Random):
        episode.rng.seed(seed)


def end_reason(rec: dict, result) -> str:
    """Why a replay that ended at the recorded turn ``rec`` ended, as a finish reason
    (``result``: the replay's last StepResult, None when no action was executed)."""
    if result is None or _not_executed(rec):
        return "max_turns"
    if result.action_type == "answer":
        return "answered"
    return "done" if result.valid else "invalid"
