"""GiGPO anchors come from the environment's state key, so one state reached at different turns
is one anchor (issue #16 point 4). Before, the anchor hashed the observation text, which holds
the turn counter ("Turn 2: State: ... You have 8 actions left"): equal states never met."""
from types import SimpleNamespace

import pytest

from core.config import ConfigError, TrainConfig, validate
from core.credit.assign import anchor_keys, gigpo
from core.envs.base import Outcome, StepResult, Task, make_env, observation_role
from core.rollout.episode import initial_state_key
from core.rollout.sampling import Sampling
from core.rollout.transcript import record_turn
from core.rollout.trajectory import Trajectory


@pytest.fixture(scope="module")
def tok():
    from core.model.policy import load_tokenizer
    return load_tokenizer("tiny")


def _edge_task(env):
    """A lake whose start is on the top edge with frozen ice to its right (not the goal)."""
    for task in env.tasks("train", 300, 0):
        lake, (r, c) = task.meta["lake"], task.meta["start"]
        if r == 0 and c + 1 < len(lake[0]) and lake[0][c + 1] == "F":
            return task
    raise AssertionError("no suitable lake")


def scripted(env, task, moves, tok, traj_id, reward=0.0):
    """A trajectory of ``moves`` played the way the rollout plays them (record_turn, the state
    key each turn acted from)."""
    episode = env.episode(task, seed=0)
    traj = Trajectory(traj_id=traj_id, group_id="g0", task=task)
    key, sampling = initial_state_key(episode), Sampling(max_turns=len(moves))
    for turn, move in enumerate(moves):
        action = f"<answer>{move}</answer>"
        result = episode.step(action)
        record_turn(traj, tok, turn, action, tok.encode(action), None, result, sampling,
                    state_key=key, role=observation_role(env))
        key = result.state_key
    traj.reward = reward
    return traj


def test_same_frozenlake_state_at_turns_1_and_3_shares_an_anchor(tok):
    env = make_env("frozenlake", slip=0.0, actions_per_turn=1, max_actions=10)
    task = _edge_task(env)
    a = scripted(env, task, ["Right", "Down"], tok, "a", reward=1.0)
    b = scripted(env, task, ["Up", "Up", "Right", "Down"], tok, "b")  # Up hits the edge
    # a acts from start+Right at turn 1, b at turn 3: the observations differ (turn counter)...
    assert a.turns[0].observation != b.turns[2].observation
    # ...the state is the same, and so is the anchor
    assert a.turns[1].state_key == b.turns[3].state_key
    ka, kb = anchor_keys(a), anchor_keys(b)
    assert ka[1] == kb[3]
    assert ka[0] == kb[0] == kb[1] == kb[2]  # the start: bumping into the edge stays there
    assert len({ka[1], ka[0]}) == 2
    # and GiGPO compares them: the two turns from start+Right form a step group of two
    cfg = SimpleNamespace(algo="gigpo", gigpo_gamma=1.0, gigpo_weight=1.0)
    credit = gigpo([a, b], cfg)
    (turn_a, turn_b), (ep_a, ep_b) = credit.turn_advantages, credit.advantage
    step_a = turn_a[1] - ep_a
    step_b = turn_b[3] - ep_b
    assert step_a > 0 > step_b


def test_every_builtin_env_offers_state_keys(tok):
    """Each env's key is the state, not the text: equal after the same moves, never None."""
    for name in ("frozenlake", "sokoban", "bandit", "corridor", "search", "apps"):
        env = make_env(name)
        task = env.tasks("train", 1, 0)[0]
        episode = env.episode(task, seed=0)
        start = initial_state_key(episode)
        assert isinstance(start, str) and start, name
        result = episode.step(episode.expert_action())
        assert isinstance(result.state_key, str) and result.state_key, name


def test_search_key_is_the_set_of_documents_read():
    env = make_env("search", topk=2)
    task = env.tasks("train", 1, 0)[0]
    first, second = env.episode(task), env.episode(task)
    query = task.meta["question"]
    r1 = first.step(f"<search>{query}</search>")
    first.step("no action at all")                        # invalid: nothing new read
    r2 = second.step(f"<search>{query}</search>")
    assert r1.state_key == r2.state_key == first.state_key() != "docs:"
    assert second.step("<answer>x</answer>").state_key == r2.state_key


def test_apps_key_changes_only_when_the_database_does():
    env = make_env("apps")
    task = env.tasks("train", 1, 0)[0]
    episode = env.episode(task)
    start = episode.state_key()
    docs = episode.step('<tool>{"name": "apis.show_docs", "arguments": {}}</tool>')
    assert docs.state_key == start                      # reading changes nothing
    while True:                                          # the expert's plan writes at some point
        action = episode.expert_action()
        if action.startswith("<answer>"):
            break
        result = episode.step(action)
        if result.state_diff:
            assert result.state_key != start
            return
    pytest.skip("this task's plan writes nothing")


class FlipEpisode:
    """A user's episode whose state flips between s0 and s1 at every step."""

    def __init__(self, task):
        self.task, self.n = task, 0

    def reset(self):
        return "Say anything."

    def state_key(self):
        return f"s{self.n % 2}"

    def step(self, action_text):
        self.n += 1
        return StepResult("ok", done=False, valid=True, action_type="move",
                          state_key=self.state_key(), info={"n": self.n})

    def outcome(self):
        return Outcome(score=0.0, success=False)


class FlipEnv:
    """A user's environment, loadable as ``--env tests.test_state_keys:FlipEnv``."""
    name, stop_tags, system_prompt = "flip", ("</a>",), ""

    def __init__(self, seed=0, **options):
        self.options = options

    def tasks(self, split, n, seed):
        return [Task(task_id=f"t{i}", prompt="Say anything.", split=split) for i in range(n)]

    def episode(self, task, seed):
        return FlipEpisode(task)


def test_user_env_by_module_path():
    env = make_env("tests.test_state_keys:FlipEnv", seed=1, depth=3)
    assert isinstance(env, FlipEnv) and env.options == {"depth": 3}
    validate(TrainConfig(env="tests.test_state_keys:FlipEnv", env_options="depth=3"))
    with pytest.raises(ValueError, match="cannot load"):
        make_env("tests.test_state_keys:NoSuchEnv")
    with pytest.raises(ConfigError, match="package.module:Factory"):
        validate(TrainConfig(env="flip env"))


def test_rollout_records_the_state_each_turn_acted_from():
    """Through the real batched rollout (tiny model): turn k's key is the state after turn k-1."""
    from core.model.policy import load_policy
    from core.rollout.engine import rollout

    env = make_env("tests.test_state_keys:FlipEnv")
    pol = load_policy("tiny", seed=0)
    trajs = rollout(pol, env, env.tasks("train", 1, 0), group_size=2, seed=0,
                    sampling=Sampling(max_turns=3, max_new_tokens=3, max_context=512))
    for traj in trajs:
        assert [t.state_key for t in traj.turns] == ["s0", "s1", "s0"]
        assert [t.info for t in traj.turns] == [{"n": 1}, {"n": 2}, {"n": 3}]
        keys = anchor_keys(traj)
        assert keys[0] == keys[2] != keys[1]
