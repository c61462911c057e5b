"""Guess the number: a complete environment written only against the public protocol.

    python -m core.train --env examples.guess:Factory --env-options high=16 --sft-steps 2 ...

A task hides a whole number in [1, high]; each turn the model guesses with
``<guess>N</guess>`` and is told "higher" or "lower". Train secrets are even, held-out secrets
odd, so the two splits never share a task. The scripted expert bisects the interval still open,
which finds any secret within ceil(log2(high)) + 1 guesses.

Grading: outcome 1.0 when the secret was guessed, else 0.0; process = how much of [1, high] the
guesses ruled out, (high - (hi - lo + 1)) / (high - 1), in [0, 1].
"""
from __future__ import annotations

import random
import re

from core.envs.base import Outcome, StepResult, Task
from core.envs.options import Option, take_options

GUESS = re.compile(r"<guess>\s*(-?\d{1,9})\s*</guess>")


class Factory:
    """``--env examples.guess:Factory``; options (``--env-options``): high, max_guesses."""

    name = "guess"
    stop_tags = ("</guess>",)          # generation stops right after a guess
    observation_role = "user"          # each "higher"/"lower" is a new user message
    system_prompt = ("Find the secret whole number. Answer with one guess per turn, e.g. "
                     "<guess>7</guess>. After each wrong guess you are told whether the secret "
                     "is higher or lower.")

    OPTIONS = {
        "high": Option(int, 2, 1_000_000, default=100, doc="secrets are whole numbers in [1, high]"),
        "max_guesses": Option(int, 1, 1000, default=10, doc="guesses before the episode ends"),
    }
    """Declared once: ``--env-options`` are checked against these (an unknown name or a value
    out of bounds is refused, naming it) before the run starts and when the env is built."""

    def __init__(self, seed: int = 0, topk: int = 3, **options):
        # ``seed`` and ``topk`` come with every environment; this one needs neither.
        taken = take_options(self.name, self.OPTIONS, options)
        self.high, self.max_guesses = taken["high"], taken["max_guesses"]

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        if split not in ("train", "heldout"):
            raise ValueError(f"guess: split must be train or heldout, got {split!r}")
        rng = random.Random(f"guess-{split}-{seed}-{self.high}")   # str seeds are stable
        first = 2 if split == "train" else 1                        # even | odd secrets
        secrets = range(first, self.high + 1, 2)
        tasks = []
        for i in range(n):
            secret = rng.choice(secrets)
            tasks.append(Task(task_id=f"guess-{split}-{seed}-{i}", split=split,
                              prompt=f"The secret is a whole number from 1 to {self.high}.",
                              golds=(str(secret),), meta={"secret": secret}))
        return tasks

    def split_size(self, split: str) -> int:
        return len(range(2 if split == "train" else 1, self.high + 1, 2))

    def is_answer(self, action_text: str) -> bool:
        return GUESS.search(action_text) is not None

    def episode(self, task: Task, seed: int) -> "GuessEpisode":
        return GuessEpisode(self, task)   # no randomness inside an episode: seed is unused


class GuessEpisode:
    def __init__(self, env: Factory, task: Task):
        self.env, self.task = env, task
        self.secret = int(task.meta["secret"])
        self.lo, self.hi = 1, env.high     # the interval the feedback still leaves open
        self.guesses, self.found = 0, False

    def reset(self) -> str:
        return f"{self.task.prompt} You have {self.env.max_guesses} guesses."

    def state_key(self) -> str:
        return f"{self.lo}..{self.hi}"

    def step(self, action_text: str) -> StepResult:
        self.guesses += 1
        out_of_guesses = self.guesses >= self.env.max_guesses
        match = GUESS.search(action_text)
        if match is None:
            return StepResult("Invalid: answer with <guess>N</guess>.", done=out_of_guesses,
                              valid=False, error="no <guess>N</guess>", state_key=self.state_key())
        n = int(match.group(1))
        if n == self.secret:
            self.found, self.lo, self.hi = True, n, n
            return StepResult(f"{n} is right!", done=True, valid=True, action_type="answer",
                              parsed={"guess": n}, reward=1.0, state_key=self.state_key())
        if n < self.secret:
            self.lo, hint = max(self.lo, n + 1), "higher"
        else:
            self.hi, hint = min(self.hi, n - 1), "lower"
        return StepResult(f"{n} is wrong: the secret is {hint}.", done=out_of_guesses, valid=True,
                          action_type="answer", parsed={"guess": n}, state_key=self.state_key())

    def outcome(self) -> Outcome:
        ruled_out = (self.env.high - (self.hi - self.lo + 1)) / (self.env.high - 1)
        return Outcome(score=float(self.found), success=self.found,
                       answer=str(self.secret) if self.found else None,
                       process=max(0.0, min(1.0, ruled_out)), info={"guesses": self.guesses})

    def expert_action(self) -> str:
        return f"<guess>{(self.lo + self.hi) // 2}</guess>"

    def render(self) -> list[dict]:
        """Optional: the state as a one-row table, which Replay shows before and after each
        turn (SVG text or PNG bytes would be shown as a picture)."""
        return [{"secret is at least": self.lo, "secret is at most": self.hi,
                 "guesses left": self.env.max_guesses - self.guesses}]
