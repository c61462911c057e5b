"""Two-armed bandit (RAGEN): one pull, a safe arm and a risky arm. The workshop demo.

Payouts (RAGEN): the low arm pays 0.1 every time; the high arm pays 1.0 with probability 0.25,
else 0. The high arm has the higher expected value (0.25 > 0.1) and much higher variance, so a
group of rollouts that disagree gets a visible reward spread — that is the point of the demo.

Which name is which (``arms`` option):
- ``fixed`` (default): the arms are always Phoenix (low, 0.1) and Dragon (high, 0.25 expected). The
  prompt lists both, in an order that varies per task, and does not say which pays what: the
  policy must learn from rewards alone that Dragon is better — one preference over one name, which
  a tiny model picks up within a few GRPO steps. Tasks of both splits are the same game, so the
  held-out split (disjoint task ids and pull seeds) measures that learned preference.
- ``stated``: each task draws two names from a pool and says which pays what; the policy must read
  the prompt. Train and held-out name pools are disjoint, so held-out success means reading, not
  memorising a name. Harder for a small model.

Expert (``expert`` option): ``best`` (default) always pulls the higher-EV arm. ``uniform`` pulls
either arm with probability 1/2 (seeded by task and episode seed): demonstrations that teach only
the answer format, so an SFT warm start leaves the choice itself for RL to learn — the demo's
visible learning curve (success rate from ~0.5 towards 1).

Success = pulled the arm with the higher expected value. Outcome score = the payout actually
received (0, 0.1 or 1.0; already in [0, 1]), RAGEN's training signal with its variance.
Invalid output ends the single-turn episode with RAGEN's -0.1 step reward and score 0.
"""
from __future__ import annotations

from core.envs.base import Outcome, StepResult, Task, register
from core.envs.games.grid import (INVALID_PENALTY, check_count, check_split, parse_answer,
                            seeded_rng)
from core.envs.options import Option, take_options

LOW_PAYOUT = 0.1
HIGH_PAYOUT = 1.0
HIGH_PROB = 0.25
FIXED_ARMS = ("Phoenix", "Dragon")
"""(low arm, high arm) in ``fixed`` mode."""
NAME_POOLS = {
    "train": ("Amber", "Cobalt", "Saffron", "Indigo", "Juniper", "Maple", "Cedar", "Willow",
              "Falcon", "Otter", "Lynx", "Heron"),
    "heldout": ("Onyx", "Quartz", "Topaz", "Garnet", "Badger", "Raven", "Aspen", "Birch"),
}
"""``stated`` mode: names the two splits draw arms from (disjoint)."""
MODES = ("fixed", "stated")
EXPERTS = ("best", "uniform")


def payout(is_high: bool, u: float) -> float:
    """r = 0.1 for the low arm; r = 1.0 if u < 0.25 else 0 for the high arm (u ~ U[0, 1))."""
    if not is_high:
        return LOW_PAYOUT
    return HIGH_PAYOUT if u < HIGH_PROB else 0.0


@register("bandit")
class Bandit:
    """Environment factory; options: ``OPTIONS`` (see the module docstring). ``seed`` and
    ``topk`` are the arguments every environment is built with (core/config/env_options.py's
    env_kwargs); nothing is retrieved here, so topk changes nothing."""

    name = "bandit"
    stop_tags = ("</answer>",)
    observation_role = "user"
    OPTIONS = {
        "arms": Option(str, default="fixed", choices=MODES,
                       doc="fixed names and payouts, or stated in each task"),
        "expert": Option(str, default="best", choices=EXPERTS,
                         doc="the SFT demonstrations' arm: the best one or either at random"),
    }
    system_prompt = (
        "You are playing a two-armed bandit: a slot machine with two arms, each with its own "
        "payout. You pull exactly one arm. You may think first inside <think>...</think>, then "
        "answer with the arm's name, e.g. <answer>NAME</answer>.")

    def __init__(self, seed: int = 0, topk: int = 3, **options):
        opts = take_options(self.name, self.OPTIONS, options)
        self.seed, self.arms, self.expert = seed, opts["arms"], opts["expert"]

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        check_count(n)
        rng = seeded_rng("bandit-tasks", self.arms, split, seed)
        tasks = []
        for i in range(n):
            if self.arms == "fixed":
                low, high = FIXED_ARMS
            else:
                low, high = rng.sample(NAME_POOLS[split], 2)
            shown = [low, high] if rng.random() < 0.5 else [high, low]
            meta = {"low": low, "high": high, "shown": shown, "mode": self.arms}
            tasks.append(Task(task_id=f"bandit-{self.arms}-{split}-{seed}-{i}",
                              prompt=self._prompt(meta), golds=(high,), split=split, meta=meta))
        return tasks

    def episode(self, task: Task, seed: int) -> "BanditEpisode":
        return BanditEpisode(self, task, seed)

    @staticmethod
    def _prompt(meta: dict) -> str:
        first, second = meta["shown"]
        if meta["mode"] == "stated":
            says = {meta["low"]: f"{meta['low']} pays {LOW_PAYOUT} every time.",
                    meta["high"]: (f"{meta['high']} pays {HIGH_PAYOUT} with probability {HIGH_PROB} "
                                   "and nothing otherwise.")}
            rules = f"{says[first]} {says[second]}"
        else:
            rules = (f"One arm always pays {LOW_PAYOUT}. The other pays {HIGH_PAYOUT} with "
                     f"probability {HIGH_PROB} and nothing otherwise. You are not told which is which.")
        return (f"The two arms are {first} and {second}. {rules} Pull the arm that pays more on "
                f"average: answer <answer>{first}</answer> or <answer>{second}</answer>.")


class BanditEpisode:
    def __init__(self, env: Bandit, task: Task, seed: int):
        meta = task.meta
        if not all(isinstance(meta.get(k), str) for k in ("low", "high")) or meta["low"] == meta["high"]:
            raise ValueError(f"bandit task {task.task_id!r}: meta needs two distinct arm names")
        self.env, self.task = env, task
        self.low, self.high = meta["low"], meta["high"]
        # One uniform draw per episode decides the risky arm's payout, whichever arm is pulled.
        rng = seeded_rng("bandit-pull", task.task_id, seed)
        self.u = rng.random()
        self.coin = rng.random()  # the uniform expert's choice, drawn apart from the payout
        self.arm: str | None = None
        self.reward = 0.0
        self.done = False

    def reset(self) -> str:
        return self.env._prompt(self.task.meta)

    def step(self, action_text: str) -> StepResult:
        if self.done:
            raise RuntimeError("bandit: step() after the episode ended")
        self.done = True
        names = (self.low, self.high)
        parsed = parse_answer(action_text, names, 1)
        if parsed.error:
            self.reward = INVALID_PENALTY
            text = (f"Invalid action: {parsed.error}. Answer with one arm's name, e.g. "
                    f"<answer>{names[0]}</answer>. No arm was pulled. The game is over.")
            return StepResult(text, done=True, valid=False,
                              action_type="invalid", parsed={"actions": [], "raw": parsed.raw},
                              reward=INVALID_PENALTY, error=parsed.error,
                              state_key=self.state_key())
        self.arm = parsed.actions[0]
        self.reward = payout(self.arm == self.high, self.u)
        text = f"You pulled {self.arm} and received {self.reward}. The game is over."
        return StepResult(text, done=True, valid=True, action_type="pull",
                          parsed={"actions": parsed.actions, "dropped": parsed.dropped},
                          reward=self.reward, info={"arm": self.arm, "payout": self.reward},
                          state_key=self.state_key())

    def outcome(self) -> Outcome:
        pulled = self.arm is not None
        return Outcome(score=self.reward if pulled else 0.0, success=self.arm == self.high,
                       answer=self.arm, process=0.0,
                       info={"total_env_reward": self.reward, "moves": int(pulled),
                             "arm": self.arm, "high_arm": self.high, "risky": self.arm == self.high})

    def state_key(self) -> str:
        """``start`` before the pull, then the arm pulled (``none`` after an invalid answer)."""
        return "start" if not self.done else f"pulled {self.arm or 'none'}"

    def expert_action(self) -> str:
        """The arm with the higher expected value (0.25 > 0.1); either arm for ``uniform``."""
        if self.env.expert == "uniform":
            return f"<answer>{self.task.meta['shown'][int(self.coin < 0.5)]}</answer>"
        return f"<answer>{self.high}</answer>"
