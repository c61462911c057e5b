"""Malformed model output in every environment: each is a recorded invalid action (never a crash)
and earns format reward 0 when it is the trajectory's only action.

Format-reward semantics (core/rewards.format_reward): 0.5 * ended-by-answering + 0.5 * share of
valid actions. One malformed action alone therefore scores 0; a malformed action after valid ones
keeps partial credit for those (a deliberate scheme: Search-R1 style structure credit per action).
Output cut by the token limit is recorded as ``action_truncated`` (tests/test_rollout.py::
test_limits_are_enforced_and_recorded drives that through the real sampler).
"""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.config import TrainConfig
from core.envs.base import StepResult, make_env
from core.credit.rewards import score
from core.rollout.trajectory import Trajectory, Turn

ENVS = ("search", "apps", "frozenlake", "sokoban", "bandit", "corridor")
MALFORMED = {
    "no closing tag": "<answer>Paris",
    "unbalanced": "<search>capital</answer>",
    "nested": "<answer><answer>Paris</answer>",
    "nested tool": "<tool><tool>{}</tool></tool>",
    "empty": "",
    "whitespace": "  \n\t ",
    "cut by the token limit": "I think the answer is <ans",
    "replacement characters": "<answer>\ufffd\ufffd</answer",
    "lone surrogate": "<search>\udcff</search",
    "control bytes": "\x00\x1b[31m<answer>\x07",
    "html": "<script>alert(1)</script>",
}


@pytest.fixture(scope="module")
def envs():
    return {name: make_env(name, seed=0) for name in ENVS}


def _episode(env):
    task = env.tasks("train", 1, 0)[0]
    ep = env.episode(task, seed=0)
    ep.reset()
    return task, ep


@pytest.mark.parametrize("name", ENVS)
@pytest.mark.parametrize("kind", MALFORMED)
def test_malformed_output_is_an_invalid_action_with_format_reward_0(envs, name, kind):
    env = envs[name]
    task, ep = _episode(env)
    text = MALFORMED[kind]
    result = ep.step(text)
    assert isinstance(result, StepResult) and isinstance(result.observation, str)
    result.observation.encode("utf-8")                     # storable, tokenizable
    if (name, kind) in (("search", "nested"), ("apps", "nested")):
        # Search-R1's parser takes the first <answer>...</answer>: the answer "<answer>Paris" is
        # a well-formed action whose content is wrong, so it ends the episode with outcome 0.
        assert result.parsed == {"answer": "<answer>Paris"} and ep.outcome().success is False
        return
    assert result.valid is False, (name, kind, result)
    traj = Trajectory(traj_id="t", group_id="g", task=task, finish_reason="invalid"
                      if result.done else "max_turns", outcome=ep.outcome(),
                      turns=[Turn(turn=0, action=text, observation=result.observation,
                                  valid=result.valid, action_type=result.action_type,
                                  error=result.error)])
    parts, _ = score(traj, TrainConfig(env=name, w_format=1.0))
    assert parts["format"] == 0.0


@pytest.mark.parametrize("name", ENVS)
def test_any_text_sequence_never_crashes_an_episode(envs, name):
    env = envs[name]

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.text(alphabet=st.sampled_from(list("<>/answeruchtol{}\"[]:ULRD\n"))
                            | st.characters(), max_size=40), min_size=1, max_size=3))
    def run(actions):
        _, ep = _episode(env)
        for text in actions:
            r = ep.step(text)
            assert isinstance(r, StepResult) and isinstance(r.observation, str)
            r.observation.encode("utf-8")
            if r.done:
                break
        ep.outcome()
    run()
