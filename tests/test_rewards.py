import doctest

import pytest
from hypothesis import given, settings, strategies as st

import core.envs.answers as answers
from core.config import TrainConfig
from core.envs.base import Outcome, Task
from core.credit.rewards import (cost_reward, exact_match, extract_answer, format_reward,
                                 normalize_answer, outcome_reward, process_reward, score, token_f1)
from core.rollout.trajectory import Trajectory, Turn


def test_doctests_pass():
    result = doctest.testmod(answers)  # the answer matching's examples (Search-R1's normalisation)
    assert result.attempted >= 8 and result.failed == 0


def test_fixed_names_still_answer():
    """core.rewards.exact_match and core.advantages.ESTIMATORS are fixed names users call."""
    import numpy as np

    import core.advantages
    import core.rewards
    assert core.rewards.exact_match("The Eiffel Tower!", ["eiffel tower"]) == 1.0
    adv = core.advantages.ESTIMATORS["grpo"](np.array([1.0, 0.0]), ["g", "g"])
    assert adv[0] > 0 > adv[1]


# ---- normalisation and exact match -------------------------------------------------------------
@pytest.mark.parametrize("raw, expected", [
    ("The Eiffel Tower!", "eiffel tower"),
    ("  Lake\tVarno \n", "lake varno"),
    ("an apple, a pear & the plum.", "apple pear plum"),
    ("Theory of Athens", "theory of athens"),   # 'the' inside a word is kept
    ("THE", ""),
    ("1,842", "1842"),
    ("Saint-Ortan", "saintortan"),              # punctuation is dropped, not replaced by a space
])
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


@pytest.mark.parametrize("pred, golds, em", [
    ("The Eiffel Tower!", ["eiffel tower"], 1.0),
    ("eiffel tower", ["The Eiffel Tower!"], 1.0),
    ("EIFFEL   TOWER", ["x", "Eiffel Tower"], 1.0),
    ("Eiffel", ["Eiffel Tower"], 0.0),
    ("Eiffel Tower in Paris", ["Eiffel Tower"], 0.0),
    ("", ["Paris"], 0.0),
    (None, ["Paris"], 0.0),
    ("Paris", [], 0.0),
])
def test_exact_match(pred, golds, em):
    assert exact_match(pred, golds) == em


def test_exact_match_refuses_a_bare_string_of_golds():
    # "P" would otherwise match the gold "Paris" iterated letter by letter.
    with pytest.raises(TypeError, match="list of strings"):
        exact_match("P", "Paris")


def test_normalize_refuses_non_strings():
    with pytest.raises(TypeError):
        normalize_answer(1842)


@pytest.mark.parametrize("pred, golds, f1", [
    ("Varno City", ["Varno City"], 1.0),
    ("Lake Varno City", ["Varno City"], 0.8),         # P=2/3 R=1
    ("Varno", ["Varno City"], 2 / 3),                 # P=1 R=1/2
    ("city city", ["Varno City"], 0.5),               # multiset: one 'city' in common, P=R=1/2
    ("Osk", ["Varno City", "Osk"], 1.0),              # max over golds
    ("Rome", ["Varno City"], 0.0),
    ("the", ["a"], 1.0),                              # both normalise to nothing
    ("the", ["Osk"], 0.0),
    (None, ["Osk"], 0.0),
])
def test_token_f1(pred, golds, f1):
    assert token_f1(pred, golds) == pytest.approx(f1)


@pytest.mark.parametrize("text, answer", [
    ("<answer>Osk</answer>", "Osk"),
    ("<answer>first</answer> <think>hmm</think><answer> second \n</answer>", "second"),
    ("<answer>multi\nline</answer>", "multi\nline"),
    ("<answer>never closed", None),
    ("no tags at all", None),
    ("", None),
    (None, None),
    ("<answer></answer>", ""),
])
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_normalisation_is_idempotent(s):
    once = normalize_answer(s)
    assert normalize_answer(once) == once


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=20), st.lists(st.text(max_size=20), max_size=5), st.randoms())
def test_exact_match_ignores_gold_order(pred, golds, rnd):
    shuffled = list(golds)
    rnd.shuffle(shuffled)
    assert exact_match(pred, golds) == exact_match(pred, shuffled)
    assert exact_match(pred, golds) in (0.0, 1.0)
    assert token_f1(pred, golds) == token_f1(pred, shuffled)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=30))
def test_exact_match_is_symmetric_for_one_gold(s):
    assert exact_match(s, ["The Eiffel Tower"]) == exact_match("The Eiffel Tower", [s])


# ---- components on constructed trajectories ----------------------------------------------------
TASK = Task(task_id="t0", prompt="What is the capital of Osk?", golds=("Varno",))


def make_traj(actions, finish="answered", outcome=None, trained=None):
    """actions: list of (action_type, valid)."""
    turns = [Turn(turn=i, action=f"<{kind}>x</{kind}>", observation="", valid=valid,
                  action_type=kind, action_tokens=5) for i, (kind, valid) in enumerate(actions)]
    traj = Trajectory(traj_id="a", group_id="g", task=TASK, turns=turns, finish_reason=finish,
                      outcome=outcome)
    if trained is not None:
        traj.trained = trained
    return traj


def test_outcome_and_process_read_the_env_outcome():
    traj = make_traj([("search", True), ("answer", True)],
                     outcome=Outcome(score=1.0, success=True, answer="Varno", process=1.0))
    assert outcome_reward(traj) == 1.0 and process_reward(traj) == 1.0
    crashed = make_traj([("search", True)], finish="env_error", outcome=None)
    assert outcome_reward(crashed) == 0.0 and process_reward(crashed) == 0.0


@pytest.mark.parametrize("actions, finish, expected", [
    ([("search", True), ("answer", True)], "answered", 1.0),
    ([("invalid", False), ("search", True), ("answer", True)], "answered", 0.5 + 0.5 * 2 / 3),
    ([("search", True), ("search", True)], "max_turns", 0.5),
    ([("search", True), ("invalid", False)], "max_turns", 0.25),
    ([("invalid", False)], "invalid", 0.0),
    ([("move", True)], "done", 1.0),
    ([], "env_error", 0.0),
])
def test_format_reward(actions, finish, expected):
    assert format_reward(make_traj(actions, finish)) == pytest.approx(expected)


def test_cost_reward_hand_computed():
    cfg = TrainConfig(cost_per_turn=0.1, cost_per_token=0.01, cost_per_tool_call=0.05)
    # 3 turns, 2 searches (the answer is not a tool call), 7 trained tokens.
    traj = make_traj([("search", True), ("search", True), ("answer", True)],
                     trained=[False] * 4 + [True] * 7 + [False] * 3)
    assert cost_reward(traj, cfg) == pytest.approx(-(0.1 * 3 + 0.01 * 7 + 0.05 * 2))
    # Without a token view (imported runs) the per-turn action token counts are used: 3 * 5.
    untokenised = make_traj([("search", True), ("search", True), ("answer", True)])
    assert cost_reward(untokenised, cfg) == pytest.approx(-(0.3 + 0.01 * 15 + 0.1))
    assert cost_reward(traj, TrainConfig()) == 0.0


def test_score_weighted_total_hand_computed():
    cfg = TrainConfig(w_outcome=1.0, w_format=0.2, w_cost=1.0, w_process=0.5,
                      cost_per_turn=0.05, cost_per_tool_call=0.1)
    traj = make_traj([("invalid", False), ("search", True), ("answer", True)],
                     outcome=Outcome(score=0.0, success=False, answer="Osk", process=1.0))
    parts, total = score(traj, cfg)
    assert set(parts) == {"outcome", "format", "cost", "process"}
    fmt = 0.5 + 0.5 * 2 / 3
    cost = -(0.05 * 3 + 0.1 * 1)
    assert parts["outcome"] == 0.0 and parts["process"] == 1.0
    assert parts["format"] == pytest.approx(fmt) and parts["cost"] == pytest.approx(cost)
    assert total == pytest.approx(0.0 + 0.2 * fmt + cost + 0.5 * 1.0)


def test_score_with_default_config_is_the_outcome():
    traj = make_traj([("search", True), ("answer", True)],
                     outcome=Outcome(score=1.0, success=True, process=1.0))
    assert score(traj, TrainConfig())[1] == 1.0
    assert score(make_traj([("search", True)], "env_error"), TrainConfig())[1] == 0.0
