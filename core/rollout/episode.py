"""What every episode shares, whoever writes its actions: the local policy in one batch
(core/rollout/engine.py, also for evaluation and branch continuations) or an endpoint
(core/run/collection.py). Each opens its episodes here, executes an action here and ends an
episode here, so the seeds, the ids, the final-answer rule and the finish reasons are written once.

    episode seed   (seed * 1_000_003 + g * 1_009 + r) mod 2^31 for rollout r of task g
    ids            traj_id {prefix}-g{g}-r{r}, group_id {prefix}-g{g}
    final turn     with final_answer_turn, one extra turn after max_turns in which only an answer
                   is executed (Search-R1); it ends as final_answer, or max_turns without one
    env failure    a step or grade that fails ends that trajectory as env_error, not the run
    pictures       an episode with ``render()`` is drawn after reset and after every step; a
                   picture that fails or breaks a cap is a note in ``trajectories.info``, never
                   the episode's end (but a render past the deadline leaves its episode unable
                   to take another call, as any call would)
"""
from __future__ import annotations

from dataclasses import dataclass

from core.envs.base import Outcome, StepResult, Task
from core.envs.guard import EnvError, Guard, GuardedEpisode
from core.envs.render import checked_render
from core.rollout.trajectory import Trajectory, Turn

FINAL_ONLY_ANSWER = ("final-answer turn: only an answer is accepted; the action was not "
                     "executed")
MAX_RENDER_NOTES = 8
"""Notes on pictures not kept, per trajectory; ``render_failures`` counts them all."""


def episode_seed(seed: int, g: int, r: int) -> int:
    """The seed of rollout ``r`` of task ``g`` in a batch sampled with ``seed``."""
    return (seed * 1_000_003 + g * 1_009 + r) % (2 ** 31)


@dataclass
class Opened:
    """One episode, reset: its trajectory (ids, task, split, seed), the guarded episode, the
    first message and the state it starts from."""
    traj: Trajectory
    episode: GuardedEpisode
    first: str
    state_key: str | None


def open_episodes(guard: Guard, tasks: list[Task], group_size: int, seed: int, prefix: str,
                  split: str) -> list[Opened]:
    """``group_size`` episodes of each task, opened and reset in order (a failing reset fails
    the run, named by the guard)."""
    opened = []
    for g, task in enumerate(tasks):
        for r in range(group_size):
            ep_seed = episode_seed(seed, g, r)
            episode = guard.open(task, ep_seed)
            first = episode.reset()
            traj = Trajectory(traj_id=f"{prefix}-g{g}-r{r}", group_id=f"{prefix}-g{g}",
                              task=task, split=split, info={"episode_seed": ep_seed})
            if episode.prompt_cut_bytes:  # it will end as context_full: say why
                traj.info["prompt_cut_bytes"] = episode.prompt_cut_bytes
            record_render(traj, episode, -1)
            opened.append(Opened(traj, episode, first, initial_state_key(episode)))
    return opened


def initial_state_key(episode) -> str | None:
    """The episode's ``state_key()`` right after reset (the first turn's anchor), if it has one."""
    key_of = getattr(episode, "state_key", None)
    if not callable(key_of):
        return None
    key = key_of()
    return None if key is None else str(key)


def record_render(traj: Trajectory, episode: GuardedEpisode, turn: int) -> None:
    """Keep the episode's picture of its state after ``turn`` (-1: after reset) in
    ``traj.renders`` when it offers ``render()``. A render that raises, returns something
    unusable or too big is not kept: ``traj.info`` notes why (``render_notes``, the first
    ``MAX_RENDER_NOTES``; ``render_failures``, all of them) and the episode goes on. Only a
    guarded episode is asked (a branch job's unguarded replay is not: nothing bounds it)."""
    if not (isinstance(episode, GuardedEpisode) and episode.renders):
        return
    try:
        picture = checked_render(episode.render())
    except EnvError as exc:
        picture = f"render failed: {exc.text}"
    if isinstance(picture, str):
        traj.info["render_failures"] = traj.info.get("render_failures", 0) + 1
        notes = traj.info.setdefault("render_notes", [])
        if len(notes) < MAX_RENDER_NOTES:
            notes.append({"turn": turn, "note": picture[:500]})
    elif picture is not None:
        traj.renders.append({"turn": turn, "kind": picture.kind, "body": picture.body})


def execute(episode: GuardedEpisode, action: str, final: bool, state_key: str | None
            ) -> StepResult:
    """The environment's answer to ``action``: in the final-answer turn anything but an answer is
    refused without being executed. EnvError when the env fails (the caller ends the trajectory
    with ``step_failed`` and ``grade(..., "env_error")``)."""
    if final and not episode.guard.is_answer(action):
        return StepResult("", done=True, valid=False, action_type="invalid",
                          error=FINAL_ONLY_ANSWER, state_key=state_key)
    return episode.step(action)  # checked, observation cut by bytes


def end_reason(result: StepResult) -> str | None:
    """Why a step ended the episode: answered, done (a valid last step) or invalid; None while
    it goes on."""
    if not result.done:
        return None
    if result.action_type == "answer":
        return "answered"
    return "done" if result.valid else "invalid"


def final_reason(reason: str | None, final: bool) -> str | None:
    """In the final-answer turn the episode ends either way: final_answer if it answered, else
    max_turns."""
    if not final:
        return reason
    return "final_answer" if reason == "answered" else "max_turns"


def step_failed(traj: Trajectory, exc: EnvError, turn: Turn) -> Turn:
    """``turn`` as the failed step ``exc`` says: the error on the turn, its step reward unknown
    (recorded NULL), and ``trajectories.info.env_error`` naming the env, the call and the turn.
    The caller ends the trajectory as env_error."""
    turn.error, turn.env_failed = exc.text, True
    traj.info.setdefault("env_error", {**exc.info(), "turn": turn.turn})
    return turn


def grade(traj: Trajectory, episode: GuardedEpisode, reason: str) -> None:
    """End ``traj`` with ``reason`` and the episode's outcome.

    An outcome that fails (raises, times out, returns a NaN or wrong-typed score) ends the
    trajectory as ``env_error`` instead, graded score 0, not a success: the env, not the
    policy, failed, and a wrong answer's failure class would blame the policy. The error and the
    env go in the outcome's info and in ``trajectories.info.env_error`` (with the finish reason
    it had); a step that failed first keeps its own error there."""
    traj.finish_reason = reason
    try:
        traj.outcome = episode.outcome()
    except EnvError as exc:
        traj.outcome = Outcome(score=0.0, success=False, info={"error": exc.text, "env": exc.env})
        traj.info.setdefault("env_error", {**exc.info(), "finish_reason": reason})
        traj.finish_reason = "env_error"
