import pytest

from core.envs.base import Outcome, make_env
from core.envs.search.env import INVALID_FEEDBACK, SearchEnv
from core.credit.scoring import classify_trajectory
from storage.failures import FAILURE_CLASSES, classify, describe
from core.rollout.trajectory import Trajectory, Turn

ISSUE_CLASSES = {"format_error", "invalid_action", "no_answer", "answered_without_search",
                 "wrong_answer_with_evidence", "wrong_answer_without_evidence",
                 "repeated_action_loop", "tool_error_unrecovered", "collateral_damage",
                 "unmet_state_test", "success"}
INFO = "\n\n<information>Doc 1(Title: Osk) The capital of Osk is Varno.</information>\n\n"


def turn(action, observation="", valid=True, kind="search", error=None):
    return {"action": action, "observation": observation, "action_valid": valid,
            "action_type": kind, "error": error, "state_diff": None}


def search(q, obs=INFO):
    return turn(f"<search>{q}</search>", obs)


def answer(a):
    return turn(f"<answer>{a}</answer>", "", kind="answer")


GARBAGE = turn("I think it is Varno", INVALID_FEEDBACK, valid=False, kind="invalid")


def test_classes_cover_the_issue_and_are_described():
    assert ISSUE_CLASSES <= set(FAILURE_CLASSES) and len(set(FAILURE_CLASSES)) == len(FAILURE_CLASSES)
    for cls in FAILURE_CLASSES:
        assert describe(cls).endswith(".") and len(describe(cls)) > 20
    with pytest.raises(ValueError, match="unknown failure class"):
        describe("bad_luck")


# (turns, success, finish_reason, answer, info) -> class
CASES = {
    "success": ([search("capital of Osk"), answer("Varno")], True, "answered", "Varno",
                {"retrieved_gold": True}),
    "format_error": ([GARBAGE, GARBAGE | {"action": "still no tags"}], False, "max_turns", None, {}),
    "invalid_action": ([search("Osk"), turn("<search> </search>", INVALID_FEEDBACK, valid=False,
                                            error="empty search query")],
                       False, "max_turns", None, {}),
    "repeated_action_loop": ([search("capital of Osk"), search("capital of Osk"), answer("Osk")],
                             False, "answered", "Osk", {"retrieved_gold": True}),
    "tool_error_unrecovered": ([turn("<tool>{}</tool>", "ok", kind="tool"),
                                turn("<tool>{\"name\": \"x\"}</tool>", "error: unknown endpoint",
                                     kind="tool", error="unknown endpoint x"),
                                answer("done")], False, "answered", "done", {}),
    "no_answer": ([search("capital of Osk"), search("Varno founded")], False, "max_turns", None,
                  {"retrieved_gold": True}),
    "unmet_state_test": ([turn("<tool>{}</tool>", "ok", kind="tool"), answer("done")], False,
                         "answered", "done",
                         {"tests": [("reminder_created", True, ""), ("mail_sent", False, "")]}),
    "answered_without_search": ([answer("Paris")], False, "answered", "Paris", {}),
    "answered_without_tool_call": ([turn("Paris", kind="answer")], False, "answered", "Paris",
                                   {"tools_offered": True}),
    "wrong_answer_with_evidence": ([search("capital of Osk"), answer("Osk")], False, "answered",
                                   "Osk", {"retrieved_gold": True}),
    "wrong_answer_without_evidence": ([search("Osk river"), answer("Lenna")], False, "answered",
                                      "Lenna", {"retrieved_gold": False}),
    "collateral_damage": ([turn("<tool>{}</tool>", "ok", kind="tool"), answer("done")], True,
                          "answered", "done", {"collateral": True}),
    "sample_error": ([turn("<tool>{}</tool>", "ok", kind="tool")], False, "error", None, {}),
    "limit_exceeded": ([search("a"), search("b", "other")], False, "message_limit", None, {}),
    "refused": ([turn("I'm sorry, but I can't help with that.", kind="answer")], False,
                "answered", "I'm sorry, but I can't help with that.", {"tools_offered": True}),
    "wrong_answer": ([turn("add(x=2, y=3)", "add -> 5", kind="tool"),
                      turn("The answer is 6", kind="answer")], False, "answered", "6", {}),
    "unsolved": ([turn("<answer>Up</answer>", "grid 1", kind="move"),
                  turn("<answer>Left</answer>", "grid 2 (fell in a hole)", kind="move")],
                 False, "done", None, {}),
}


@pytest.mark.parametrize("expected", sorted(CASES))
def test_each_class_from_a_constructed_trajectory(expected):
    turns, success, finish, ans, info = CASES[expected]
    assert classify(turns, success=success, finish_reason=finish, answer=ans, info=info) == expected


def test_every_class_has_a_case():
    assert set(CASES) == set(FAILURE_CLASSES)


@pytest.mark.parametrize("turns, success, finish, ans, info, expected", [
    # harm outranks success
    ([answer("x")], True, "answered", "x", {"collateral": True}, "collateral_damage"),
    # success outranks a loop on the way
    ([search("q"), search("q"), answer("Varno")], True, "answered", "Varno", {}, "success"),
    # repeated garbage is a format problem first
    ([GARBAGE, GARBAGE, GARBAGE], False, "max_turns", None, {}, "format_error"),
    # the episode ended on an unparseable action after good searches
    ([search("a"), search("b", "other"), GARBAGE], False, "max_turns", None, {}, "format_error"),
    ([search("a"), GARBAGE], False, "invalid", None, {}, "format_error"),
    # one early format slip, then a wrong but evidenced answer: the answer explains the failure
    ([GARBAGE, search("capital of Osk"), answer("Osk")], False, "answered", "Osk",
     {"retrieved_gold": True}, "wrong_answer_with_evidence"),
    # the same action three times, not in a row
    ([search("q"), search("r", "x"), search("q"), search("s", "y"), search("q")], False,
     "max_turns", None, {}, "repeated_action_loop"),
    # walking the same direction is not a loop when the world changes
    ([turn("<answer>Up</answer>", "grid A", kind="move"),
      turn("<answer>Up</answer>", "grid B", kind="move")], False, "max_turns", None, {}, "no_answer"),
    # a failed tool call recovered by a successful one is not a tool error
    ([turn("<tool>bad</tool>", "err", kind="tool", error="bad args"),
      turn("<tool>good</tool>", "ok", kind="tool"), answer("done")], False, "answered", "done",
     {"tests": {"mail_sent": False}}, "unmet_state_test"),
    # a context that filled up, and a crashed env
    ([search("q")], False, "context_full", None, {}, "no_answer"),
    ([], False, "env_error", None, {}, "no_answer"),
    # evaluation logs: a refusal the provider marked, a content filter, giving up is no refusal
    ([turn("Let me check.", kind="answer")], False, "refused", None, {}, "refused"),
    ([], False, "content_filter", None, {}, "refused"),
    ([turn("I could not work it out, sorry about that.", kind="answer")], False, "answered",
     "I could not work it out, sorry about that.", {}, "answered_without_search"),
    # a wrong answer without tools, where none was offered (a QA eval): a wrong answer
    ([turn("Paris", kind="answer")], False, "answered", "Paris", {"tools_offered": False},
     "wrong_answer"),
    # a wrong answer with no record of what was retrieved (a verl dump): not a search failure
    ([search("Osk river"), answer("Lenna")], False, "answered", "Lenna", {}, "wrong_answer"),
    # answering after a refused search: the last tool call failed and nothing succeeded after it
    ([turn("<search></search>", INVALID_FEEDBACK, valid=False, error="empty search query"),
      answer("Varno")], False, "answered", "Varno", {}, "tool_error_unrecovered"),
])
def test_rule_order(turns, success, finish, ans, info, expected):
    assert classify(turns, success=success, finish_reason=finish, answer=ans, info=info) == expected


def test_imported_turns_with_missing_keys():
    # no action_type / validity / observation: Search-R1 parsing of the text fills the type in
    turns = [{"action": "<search>capital of Osk</search>"}, {"action": "<answer>Osk</answer>"}]
    assert classify(turns, success=False, finish_reason="answered", answer="Osk",
                    info={"retrieved_gold": True}) == "wrong_answer_with_evidence"
    assert classify([{"action": "<answer>Osk</answer>"}], success=False, finish_reason="answered",
                    answer="Osk", info=None) == "answered_without_search"
    assert classify([{"action": "hello", "action_valid": False}], success=False,
                    finish_reason="max_turns", answer=None, info={}) == "format_error"
    with pytest.raises(TypeError):
        classify("<answer>x</answer>", success=False, finish_reason="answered", answer="x", info={})


# ---- real trajectories from the search environment ---------------------------------------------
@pytest.fixture(scope="module")
def env():
    return SearchEnv(templates="capital")


def play(env, actions, finish="answered"):
    task = env.tasks("train", 1, 0)[0]
    ep = env.episode(task, 0)
    ep.reset()
    turns = []
    for i, action in enumerate(actions(task)):
        res = ep.step(action)
        turns.append(Turn(turn=i, action=action, observation=res.observation, valid=res.valid,
                          action_type=res.action_type, error=res.error))
        if res.done:
            break
    return Trajectory(traj_id="t", group_id="g", task=task, turns=turns,
                      finish_reason="answered" if ep.done else finish, outcome=ep.outcome())


def test_classify_trajectory_on_search_episodes(env):
    subject = lambda task: task.meta["subject"]  # noqa: E731
    gold = lambda task: task.golds[0]  # noqa: E731
    cases = {
        "success": lambda t: [f"<search>capital of {subject(t)}</search>",
                              f"<answer>{gold(t)}</answer>"],
        "wrong_answer_with_evidence": lambda t: [f"<search>capital of {subject(t)}</search>",
                                                 f"<answer>{subject(t)}</answer>"],
        "wrong_answer_without_evidence": lambda t: ["<search>qqqxz</search>", "<answer>Rome</answer>"],
        "answered_without_search": lambda t: ["<answer>Rome</answer>"],
        "format_error": lambda t: ["The capital is Rome."],
        "no_answer": lambda t: [f"<search>capital of {subject(t)}</search>", "<search>Rome</search>"],
        "repeated_action_loop": lambda t: ["<search>Rome</search>", "<search>Rome</search>"],
    }
    for expected, actions in cases.items():
        traj = play(env, actions, finish="max_turns")
        assert classify_trajectory(traj) == expected, expected


def test_trajectory_without_outcome_is_not_a_success(env):
    traj = play(env, lambda t: ["<search>capital</search>"], finish="env_error")
    traj.outcome = None
    assert classify_trajectory(traj) == "no_answer"
    traj.info["collateral"] = True
    assert classify_trajectory(traj) == "collateral_damage"


def test_outcome_tests_feed_the_state_test_rule(env):
    traj = play(env, lambda t: ["<search>capital</search>", "<answer>x</answer>"])
    traj.outcome = Outcome(score=0.5, success=False, answer="x",
                           tests=[("a", True, ""), ("b", False, "missing row")])
    assert classify_trajectory(traj) == "unmet_state_test"


def test_search_env_is_importable_by_name():
    assert make_env("search").name == "search"
