"""final_answer_turn (Search-R1): an episode still going after max_turns gets one last generation
in which only an answer is executed, recorded with its own finish reason (issue #16 point 5)."""
import pytest

from core.config import ConfigError, TrainConfig, validate
from core.envs.base import Outcome, StepResult, Task, make_env
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling
from core.commands.train import build_parser, resolve_config
from core.rollout.trajectory import FINISH_REASONS

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Episode:
    """Never ends by itself; counts the steps it really executed."""

    def __init__(self, task, answers):
        self.task, self.answers, self.executed, self.answer = task, answers, 0, None

    def reset(self):
        return "Say anything."

    def step(self, action_text):
        self.executed += 1
        if self.answers(action_text) and self.executed > 2:  # only the final turn answers
            self.answer = action_text
            return StepResult("", done=True, valid=True, action_type="answer")
        return StepResult("ok", done=False, valid=True, action_type="tool")

    def outcome(self):
        return Outcome(score=float(self.answer is not None), success=self.answer is not None,
                       answer=self.answer, info={"executed": self.executed})


class Env:
    name, stop_tags, system_prompt = "talk", ("</a>",), ""

    def __init__(self, answers: bool):
        self.answers = answers

    def is_answer(self, text):
        return self.answers

    def tasks(self, split, n, seed):
        return [Task(task_id=f"t{i}", prompt="Say anything.") for i in range(n)]

    def episode(self, task, seed):
        return Episode(task, lambda text: self.answers)


@pytest.fixture(scope="module")
def pol():
    from core.model.policy import load_policy
    return load_policy("tiny", seed=0)


def run(pol, env, final):
    return rollout(pol, env, env.tasks("train", 1, 0), group_size=2, seed=0,
                   sampling=Sampling(max_turns=2, max_new_tokens=3, max_context=512,
                                     final_answer_turn=final))


def test_final_answer_turn_answers_with_its_own_finish_reason(pol):
    assert "final_answer" in FINISH_REASONS
    for traj in run(pol, Env(answers=True), final=True):
        assert traj.finish_reason == "final_answer" and traj.num_turns == 3
        assert traj.turns[-1].action_type == "answer" and traj.outcome.success
        assert traj.turns[-1].turn == 2
    for traj in run(pol, Env(answers=True), final=False):  # off: Search-R1's plain cut
        assert traj.finish_reason == "max_turns" and traj.num_turns == 2


def test_anything_but_an_answer_is_not_executed_in_the_final_turn(pol):
    for traj in run(pol, Env(answers=False), final=True):
        assert traj.finish_reason == "max_turns" and traj.num_turns == 3
        last = traj.turns[-1]
        assert not last.valid and "not executed" in last.error and last.observation == ""
        assert traj.outcome.info["executed"] == 2  # the env never saw the third action
        assert traj.roles[-1] == "action"          # nothing appended after it


def test_envs_say_what_an_answer_is():
    search = make_env("search")
    assert search.is_answer("<think>x</think><answer>Paris</answer>")
    assert not search.is_answer("<search>capital of Osk</search>")
    apps = make_env("apps")
    assert apps.is_answer("<answer>done</answer>") and not apps.is_answer("<code>1</code>")


def test_config_and_cli(pol):
    with pytest.raises(ConfigError, match="final_answer_turn"):
        validate(TrainConfig(env="frozenlake", final_answer_turn=True))
    cfg = resolve_config(build_parser().parse_args(["--env", "search", "--final-answer-turn",
                                                    "true", "--db", "x.duckdb"]))
    assert cfg.final_answer_turn is True
    assert Sampling.from_config(cfg).final_answer_turn and Sampling.from_config(cfg, eval=True).final_answer_turn
    with pytest.raises(ValueError, match="is_answer"):  # an env without an answer action
        rollout(pol, make_env("bandit"), make_env("bandit").tasks("train", 1, 0), group_size=1,
                seed=0, sampling=Sampling(max_turns=1, final_answer_turn=True))
