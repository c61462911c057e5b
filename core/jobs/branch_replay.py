"""Rebuilding a recorded state for a branch job (core/jobs/branch.py): a fresh episode of the same task
and episode seed, replaying the recorded actions a_0..a_{t-1}. Every environment is deterministic
from (task, seed), so every replayed observation (and state key) must equal the recorded one, else
the job is refused naming the first differing turn (``ReplayMismatch``).

``branch_point`` then gives each continuation fresh randomness (``reseed``). A ``keep``
continuation estimates Q(s_t, a_t), so it executes the recorded a_t *after* the reseed: on a
stochastic world (a slippery lake) the kept action's transition is drawn afresh, as Q's
expectation over s_{t+1} requires. Replaying a_t with its recorded transition (``KEEP_MODES``
"recorded") estimates r_t + V(the recorded s_{t+1}) instead; it is kept, labelled, for
deterministic debugging.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from core.rollout.episode import initial_state_key

KEEP_MODES = ("fresh", "recorded")
"""How a keep continuation executes the kept action: with a freshly drawn transition (Q(s_t, a_t),
the default) or with the recorded one (r_t + V(recorded s_{t+1}); deterministic debugging)."""


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
    """The final-answer turn recorded an action it did not execute (core/rollout/engine.py)."""
    return str(turn.get("error") or "").startswith("final-answer turn")


def replay(env, task, episode_seed: int, recorded: list[dict], upto: int, guard=None):
    """A fresh episode of ``task`` with ``episode_seed`` after the recorded actions
    a_0..a_{upto-1}: returns (episode, first message, state key now, done, last StepResult).
    Raises ``ReplayMismatch`` at the first turn whose observation, state or end differs.
    With ``guard`` (core/envs/guard.py) the episode is opened and called through it: each call
    under the run's deadline, on the episode's own worker thread, where the continuation's
    later calls run too."""
    try:
        episode = (guard.open(task, episode_seed) if guard is not None
                   else env.episode(task, seed=episode_seed))
        first = episode.reset()
    except Exception as exc:
        raise ReplayMismatch(0, f"the environment's episode could not start: {exc}") from exc
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
    it has one, else its ``rng`` when that is a ``random.Random`` (the grid games' slips). A
    guarded episode is reseeded on its worker thread, under the deadline."""
    inner = getattr(episode, "inner", None)
    if inner is not None and callable(getattr(episode, "call", None)):
        episode.call("reseed", lambda: reseed(inner, seed))
        return
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


@dataclass
class BranchPoint:
    """Where one continuation starts: its episode (reseeded), the first message, the state key
    and whether the episode has ended, after the replayed turns; for a keep continuation whose
    action was drawn afresh, ``kept`` is that action's StepResult (None otherwise)."""
    episode: object
    first: str
    key: str | None
    done: bool
    last: object
    kept: object = None
    kept_error: str | None = None
    """The environment's error when the kept action was executed afresh (the continuation ends
    there as env_error)."""


def branch_point(env, task, episode_seed: int, recorded: list[dict], turn: int, kind: str,
                 seed: int, keep: str = "fresh", guard=None) -> BranchPoint:
    """The state a ``kind`` continuation from ``turn`` starts in, with fresh randomness ``seed``:
    resample: a_0..a_{t-1} replayed, then reseeded (the policy samples a_t anew);
    keep, "fresh": the same, then the recorded a_t executed on the reseeded episode;
    keep, "recorded": a_0..a_t replayed as recorded, then reseeded.
    ``guard``: the episode opened and called through it (``replay``)."""
    if keep not in KEEP_MODES:
        raise BranchError(f"keep mode must be one of {KEEP_MODES}, got {keep!r}")
    upto = turn + 1 if kind == "keep" and keep == "recorded" else turn
    episode, first, key, done, last = replay(env, task, episode_seed, recorded, upto, guard)
    reseed(episode, seed)
    point = BranchPoint(episode, first, key, done, last)
    if kind == "keep" and keep == "fresh":
        rec = recorded[turn]
        if _not_executed(rec):  # the final-answer turn's unexecuted action: the episode ends
            point.done = True
            return point
        try:
            point.kept = episode.step(rec["action"])
        except Exception as exc:  # an env bug ends this continuation, not the job
            point.kept_error, point.done = f"{type(exc).__name__}: {exc}", True
            return point
        point.key, point.done, point.last = point.kept.state_key, bool(point.kept.done), point.kept
    return point
