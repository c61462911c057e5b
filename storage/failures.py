"""Failure taxonomy: ordered rules that name why a recorded trajectory did not succeed. Torch-free.

The rules read only what every recorded trajectory has — its turns (action, observation,
validity, action type, error, state diff; any may be missing in imported runs), whether it
succeeded, why it finished, its final answer and the outcome's info — so the same function
classifies the trainer's ``Trajectory`` objects and plain dicts from other trainers' dumps.

Rules are tried in this order and the first that matches names the class. The order goes from
harm and success, through the most basic cause of failure (the model could not even act), to the
most specific account of a wrong answer; a trajectory with several problems gets the one that
explains the others:

 1. collateral_damage   the world was changed in ways the task did not ask for. Harm outranks
                        everything, even an otherwise successful outcome.
 2. success             solved: nothing else needs explaining.
 2a. sample_error       the harness raised (finish reason ``error``: an Inspect sample's tool,
                        model API or scorer crashed): whatever the agent did was cut off by it.
 2b. refused            the model declined the task: the log says so (finish reason ``refused``:
                        a refusal the provider marked; ``content_filter``: its filter stopped
                        the output), or its final words are a refusal ("I can't help with
                        that", "I'm sorry, but I cannot assist ...": ``REFUSAL``, read only
                        at the start of a final answer, so giving up on a task is not one).
 3. format_error        no parseable action where it mattered (every action unparseable, or the
                        episode ended on one): the model never got to use the environment.
 4. invalid_action      it ended on (or only made) actions that parsed but were refused
                        (empty query, illegal move, bad arguments).
 5. repeated_action_loop the same step repeated: one (action, observation) pair twice in a row or
                        three times in all (the Echo Trap's repetition). The observation is part
                        of the step, so a grid agent walking Up twice is not a loop, while
                        bumping into a wall twice is; without observations, actions alone count.
                        Before tool errors: retrying the identical failing call is the loop.
 6. tool_error_unrecovered the last tool call failed and none succeeded after it (LOOP's agents
                        learned not to give up after failed calls).
 6a. limit_exceeded    an evaluation limit cut the episode (finish reason ``{type}_limit``:
                        Inspect's token, message, time, working, context, turn or cost limits).
                        After the loop and tool-error rules, which explain why a budget ran out.
 7. no_answer           it ran out of turns or context (or the env failed) without answering.
 8. unmet_state_test    a unit test on the final state failed (stateful envs): more precise than
                        any answer-level class below.
 9. answered_without_search  it answered without a single successful search or tool call, where
                        the environment has one: the log says a tool was offered
                        (``info.tools_offered``), or, with no such record, the episode called one
                        or answered in Search-R1's ``<answer>`` vocabulary, which comes with its
                        search. A bandit's pull (action ``pull``) or a grid's move has no tool to
                        skip: such an answer that missed is a ``wrong_answer``.
 9a. answered_without_tool_call  the same where the tools are not a search: the log names the
                        tools offered (an Inspect task, a chat trace) or the calls were of
                        another tool (code, api), and none was a search. The search env's
                        runs keep the name above.
10. wrong_answer_with_evidence     wrong although a gold answer was in the retrieved evidence
                        (info.retrieved_gold): a reading failure.
11. wrong_answer_without_evidence  wrong and the evidence never held the answer
                        (info.retrieved_gold false): a search failure.
11a. wrong_answer       wrong, with no record of what was retrieved (an evaluation log, a chat
                        trace, an apps episode, a bandit's pull): the grader said no, and that is
                        all we know.
12. unsolved            none of the above: ended without success for a reason the rules do not
                        name (a grid agent that fell into a hole).
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any, Callable, Mapping, Sequence

from storage.protocol import parse_action
from storage.trajectory import FAILURE_CLASSES, PROPER_ENDINGS, TOOL_ACTIONS

Turns = Sequence[Mapping[str, Any]]
REFUSED = frozenset({"refused", "content_filter"})
REFUSAL = re.compile(
    r"(?:<think>.*?</think>\s*)?\W*(?:(?:I'?m|I am) (?:sorry|afraid)|Sorry|I apologi[sz]e)?"
    r"[,.!]?\s*(?:but\s+)?I (?:(?:must|have to) (?:decline|refuse)|(?:can(?:not|'t|’t| not)|"
    r"won(?:'t|’t)|will not|(?:am|'m) (?:not able|unable) to) (?:help|assist|comply|fulfil|"
    r"fulfill|engage|provide (?:that|this|any|instructions|assistance|help)|do that|do this))\b",
    re.IGNORECASE | re.DOTALL)
"""A refusal at the start of an answer; "I could not work it out" (giving up) is not one."""


# ---- what one turn was ---------------------------------------------------------------------------
def _kind(turn: Mapping[str, Any]) -> str | None:
    """The action type; for imported turns without one, Search-R1's parse of the action text."""
    kind = turn.get("action_type")
    if kind:
        return kind
    parsed = parse_action(turn.get("action") or "")
    return parsed[0] if parsed else None


def _valid(turn: Mapping[str, Any]) -> bool | None:
    value = turn.get("action_valid", turn.get("valid"))
    return None if value is None else bool(value)


def _unparsed(turn: Mapping[str, Any]) -> bool:
    kind = _kind(turn)
    return kind == "invalid" or (kind is None and _valid(turn) is False)


def _refused(turn: Mapping[str, Any]) -> bool:
    return _valid(turn) is False and _kind(turn) not in (None, "invalid")


def _tool_failed(turn: Mapping[str, Any]) -> bool:
    return bool(turn.get("error")) or _valid(turn) is False


def _tool_calls(turns: Turns) -> list[Mapping[str, Any]]:
    return [t for t in turns if _kind(t) in TOOL_ACTIONS]


def _failed_tests(tests: Any) -> bool:
    """tests as (name, passed, detail) rows, {"name", "passed"} dicts, or {name: passed}."""
    if isinstance(tests, Mapping):
        return not all(bool(v) for v in tests.values())
    for test in tests or ():
        passed = test.get("passed") if isinstance(test, Mapping) else test[1]
        if not passed:
            return True
    return False


# ---- the rules, in order -------------------------------------------------------------------------
# Each takes (turns, success, finish_reason, answer, info) and returns True when it names the case.
def collateral_damage(turns, success, finish, answer, info) -> bool:
    return bool(info.get("collateral"))


def succeeded(turns, success, finish, answer, info) -> bool:
    return bool(success)


def sample_error(turns, success, finish, answer, info) -> bool:
    return finish == "error"


def refused(turns, success, finish, answer, info) -> bool:
    if finish in REFUSED:
        return True
    last = turns[-1] if turns else None
    return bool(last) and _kind(last) == "answer" and bool(REFUSAL.match(last.get("action") or ""))


def format_error(turns, success, finish, answer, info) -> bool:
    if not turns:
        return False
    ended = finish in PROPER_ENDINGS
    return (finish == "invalid" or all(_unparsed(t) for t in turns)
            or (not ended and _unparsed(turns[-1])))


def invalid_action(turns, success, finish, answer, info) -> bool:
    if not turns:
        return False
    return (all(_refused(t) for t in turns)
            or (finish not in PROPER_ENDINGS and _refused(turns[-1])))


def repeated_action_loop(turns, success, finish, answer, info) -> bool:
    def step(t):
        return (" ".join((t.get("action") or "").split()), t.get("observation"))
    steps = [step(t) for t in turns if (t.get("action") or "").strip()]
    consecutive = any(a == b for a, b in zip(steps, steps[1:]))
    return consecutive or any(n >= 3 for n in Counter(steps).values())


def tool_error_unrecovered(turns, success, finish, answer, info) -> bool:
    calls = _tool_calls(turns)
    return bool(calls) and _tool_failed(calls[-1])


def limit_exceeded(turns, success, finish, answer, info) -> bool:
    return isinstance(finish, str) and finish.endswith("_limit")


def no_answer(turns, success, finish, answer, info) -> bool:
    return answer is None and finish not in PROPER_ENDINGS


def unmet_state_test(turns, success, finish, answer, info) -> bool:
    return _failed_tests(info.get("tests"))


def _offers_tools(turns: Turns, info: Mapping[str, Any]) -> bool:
    """Whether the episode's environment had a search or tool action (rule 9)."""
    offered = info.get("tools_offered")
    if offered is not None:
        return bool(offered)
    return any(_kind(t) in TOOL_ACTIONS or _kind(t) == "answer" for t in turns)


def _skipped_tools(turns, answer, info) -> bool:
    return answer is not None and _offers_tools(turns, info) \
        and not any(not _tool_failed(t) for t in _tool_calls(turns))


def _searches(turns: Turns, info: Mapping[str, Any]) -> bool:
    """Whether the episode's tool is a search: a search call among its turns, or, with no record
    of the tools offered and no call of another tool, Search-R1's ``<answer>`` vocabulary."""
    kinds = {_kind(t) for t in turns}
    if "search" in kinds:
        return True
    return info.get("tools_offered") is None and not kinds & set(TOOL_ACTIONS)


def answered_without_search(turns, success, finish, answer, info) -> bool:
    return _skipped_tools(turns, answer, info) and _searches(turns, info)


def answered_without_tool_call(turns, success, finish, answer, info) -> bool:
    return _skipped_tools(turns, answer, info)


def wrong_answer_with_evidence(turns, success, finish, answer, info) -> bool:
    return answer is not None and bool(info.get("retrieved_gold"))


def wrong_answer_without_evidence(turns, success, finish, answer, info) -> bool:
    return answer is not None and "retrieved_gold" in info


def wrong_answer(turns, success, finish, answer, info) -> bool:
    return answer is not None


def unsolved(turns, success, finish, answer, info) -> bool:
    return True


_RULE_OF: dict[str, Callable[..., bool]] = {
    "collateral_damage": collateral_damage, "success": succeeded, "sample_error": sample_error,
    "refused": refused, "format_error": format_error, "invalid_action": invalid_action,
    "repeated_action_loop": repeated_action_loop,
    "tool_error_unrecovered": tool_error_unrecovered, "limit_exceeded": limit_exceeded,
    "no_answer": no_answer, "unmet_state_test": unmet_state_test,
    "answered_without_search": answered_without_search,
    "answered_without_tool_call": answered_without_tool_call,
    "wrong_answer_with_evidence": wrong_answer_with_evidence,
    "wrong_answer_without_evidence": wrong_answer_without_evidence,
    "wrong_answer": wrong_answer, "unsolved": unsolved}
if set(_RULE_OF) != set(FAILURE_CLASSES):
    raise AssertionError("every class of the trajectory model has one rule, and only those: "
                         f"{sorted(set(_RULE_OF) ^ set(FAILURE_CLASSES))}")
RULES: tuple[tuple[str, Callable[..., bool]], ...] = tuple(
    (name, _RULE_OF[name]) for name in FAILURE_CLASSES)
"""The rules in the trajectory model's order (storage/trajectory.py ``FAILURE_CLASSES``)."""

DESCRIPTIONS: dict[str, str] = {
    "collateral_damage": "The agent changed records the task did not ask it to touch.",
    "success": "The task was solved: the answer or the final state passed the grader.",
    "sample_error": "The evaluation harness raised an error during the episode (a tool, the "
                    "model API or the scorer crashed), so it never finished.",
    "refused": "The model declined the task (in its own words, or the provider's refusal or "
               "content filter stopped it) instead of trying it.",
    "format_error": "The model's output could not be parsed as an action, so it never really "
                    "used the environment.",
    "invalid_action": "The actions parsed but the environment refused them (empty query, illegal "
                      "move, bad arguments) and the episode ended that way.",
    "repeated_action_loop": "The agent repeated the same step, getting the same observation back, "
                            "instead of trying something new.",
    "tool_error_unrecovered": "The last tool call failed and the agent never made a successful "
                              "call after it.",
    "limit_exceeded": "An evaluation limit (tokens, messages, time, cost) cut the episode "
                      "before the agent finished.",
    "no_answer": "The episode ran out of turns or context before the agent answered or finished.",
    "unmet_state_test": "A unit test on the final state of the world failed.",
    "answered_without_search": "The agent answered from its own guess without a single "
                               "successful search.",
    "answered_without_tool_call": "The agent answered from its own guess without a single "
                                  "successful tool call, though tools were offered.",
    "wrong_answer_with_evidence": "The answer was wrong although a gold answer was in the "
                                  "retrieved evidence: a reading failure.",
    "wrong_answer_without_evidence": "The answer was wrong and the retrieved evidence never "
                                     "contained it: a search failure.",
    "wrong_answer": "The agent answered and the grader marked the answer wrong (the log holds "
                    "no record of retrieved evidence to tell a reading from a search failure).",
    "unsolved": "The episode ended without success for a reason none of the other rules name.",
}


# ---- entry points --------------------------------------------------------------------------------
def classify(turns: Turns, *, success: bool, finish_reason: str, answer: str | None,
             info: Mapping[str, Any] | None) -> str:
    """The first class in FAILURE_CLASSES whose rule matches this trajectory."""
    if not isinstance(turns, Sequence) or isinstance(turns, (str, bytes)):
        raise TypeError("turns must be a list of turn dicts")
    info = info or {}
    for name, rule in RULES:
        if rule(turns, success, finish_reason, answer, info):
            return name
    raise AssertionError("unreachable: the last rule always matches")


def describe(cls: str) -> str:
    """One sentence explaining a failure class, for the app."""
    if cls not in DESCRIPTIONS:
        raise ValueError(f"unknown failure class {cls!r}; one of {', '.join(FAILURE_CLASSES)}")
    return DESCRIPTIONS[cls]
