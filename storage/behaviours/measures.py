"""Behaviours of one trajectory, computed from what is recorded: pure functions, registered by
name. Torch-free and standard library only, so the trainer calls them on each step and the
``agentrl behaviours`` job on any stored run, imported ones included (job.py).

Why here, in storage and not in core: the job reads imported runs on machines without torch, the
failure taxonomy (storage/failures.py) reads the same records for the same reason, and storage is
below core in the layer contract, so the trainer (core/run) and a user's environment (core/envs
or a plugin) may both import this module while the pages read the results through storage.

A trajectory is a plain mapping (``records`` in job.py builds it from the tables, the trainer
from its step's rows):

    traj_id, step, split, task_id, answer (None: never answered), golds (list or None),
    success (the trajectory's own grade, None where not recorded), finish_reason, num_turns,
    response_tokens (None: not recorded),
    tools_offered (the run's environment has a tool or search action),
    turns: [{turn, action, observation, action_valid, action_type, error, parsed}],
    info_gain: {turn: gain} or None (IGPO's per-turn gain, turn_signals, where recorded)

A behaviour function returns a float or None; None means *cannot be computed for this
trajectory* and becomes no row (never 0): an environment without tools has no
``no_successful_tool_call``, a run without information gain no ``evidence_ignored``.

Sources. RAGEN (Wang et al. 2025, "Understanding self-evolution in LLM agents via multi-turn RL"),
its fourth lesson: with outcome-only rewards agents learn shallow strategies -- templated
reasoning, answering before evidence, hallucinated or ignored observations -- while the reward
looks healthy. Search-R1 (Jin et al. 2025) for the search grammar (<search>/<answer>,
<information> observations) and its answer normalisation (lower-case, drop punctuation and the
articles a/an/the, collapse whitespace) used by every answer match below.
"""
from __future__ import annotations

import functools
import math
import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from storage.protocol import ACTION, TOOL_ACTIONS, parse_action

Traj = Mapping[str, Any]


@dataclass(frozen=True)
class Behaviour:
    name: str
    fn: Callable
    """scope 'trajectory': fn(traj) -> float | None; scope 'step': fn(trajs) -> [float | None]."""
    scope: str = "trajectory"
    shallow: bool = False
    """On the seed's list of shallow strategies: the alarm watches it (payoff.py)."""


BEHAVIOURS: dict[str, Behaviour] = {}


def register_behaviour(name: str, *, scope: str = "trajectory", shallow: bool = False):
    """Register a behaviour function under ``name`` (a user's environment may add its own).

    ``scope='trajectory'``: ``fn(traj) -> float | None``. ``scope='step'``: ``fn(trajs) ->
    list`` of one value (or None) per trajectory of the step, for behaviours that compare a
    trajectory with the rest of its step. A name registered twice by different functions is an
    error (two meanings for one metric name).
    """
    if scope not in ("trajectory", "step"):
        raise ValueError(f"scope must be 'trajectory' or 'step', got {scope!r}")
    if not re.fullmatch(r"[a-z0-9_]{1,64}", name):
        raise ValueError(f"behaviour name {name!r}: lower-case letters, digits and _ only")

    def wrap(fn: Callable) -> Callable:
        old = BEHAVIOURS.get(name)
        if old is not None and old.fn is not fn:
            raise ValueError(f"behaviour {name!r} is registered twice")
        BEHAVIOURS[name] = Behaviour(name, fn, scope, shallow)
        return fn
    return wrap


# ---- reading a turn ----------------------------------------------------------------------------
_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize(text: str | None) -> str:
    """Search-R1's answer normalisation: white_space_fix(remove_articles(remove_punc(lower(s))))."""
    return " ".join(_ARTICLES.sub(" ", (text or "").lower().translate(_PUNCT)).split())


_TAG = re.compile(r"</?[A-Za-z_][\w-]*>")


def mentions(text: str | None, answer: str | None) -> bool:
    """The normalised answer occurs as whole words in the normalised text. Tags are cut out
    first: removing their punctuation would glue 'Paris</information>' into one word."""
    needle = normalize(answer)
    return bool(needle) and f" {needle} " in f" {normalize(_TAG.sub(' ', text or ''))} "


def kind(turn: Mapping[str, Any]) -> str | None:
    """The action type; for imported turns without one, Search-R1's parse of the action text."""
    if turn.get("action_type"):
        return turn["action_type"]
    parsed = parse_action(turn.get("action"))
    return parsed[0] if parsed else None


def tool_turns(traj: Traj) -> list[Mapping[str, Any]]:
    return [t for t in traj.get("turns") or () if kind(t) in TOOL_ACTIONS]


def succeeded(turn: Mapping[str, Any]) -> bool:
    """A tool call that ran: not refused by the parser or the environment, no error."""
    return turn.get("action_valid") is not False and not turn.get("error")


def answered(traj: Traj) -> bool:
    return traj.get("answer") is not None


def golds(traj: Traj) -> list[str]:
    return [g for g in traj.get("golds") or () if isinstance(g, str) and g.strip()]


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_ANSWER_IS = re.compile(r"\banswer\s*(?:is|:|=)\s*", re.IGNORECASE)


def answer_forms(traj: Traj) -> list[str]:
    """The answer as recorded and the short forms a free-text answer states it in: the content
    of an ``<answer>`` tag or a ``\\boxed{}``, and the text after the last "answer is" /
    "answer:" / "answer =" (``"The answer is 5."`` -> ``"5."``). Forms that normalise to
    nothing are left out; [] for a trajectory that never answered.

    >>> answer_forms({"answer": "The answer is 5"})
    ['The answer is 5', '5']
    """
    text = traj.get("answer")
    if text is None:
        return []
    forms = [text, *_ANSWER_TAG.findall(text), *_BOXED.findall(text)]
    said = list(_ANSWER_IS.finditer(text))
    if said:
        forms.append(text[said[-1].end():])
    return [f for f in dict.fromkeys(f.strip() for f in forms) if normalize(f)]


def graded_right(traj: Traj) -> bool | None:
    """Whether the answer is right, by the trajectory's own grade first: ``success`` where it is
    recorded (an environment's or a log's scorer, which reads free text better than a string
    match); else whether an answer form equals a gold under Search-R1's normalisation; None
    without a grade or golds. No measure may contradict the grade: a graded-right answer never
    conflicts with a gold it saw, and is grounded if a gold was observed."""
    if traj.get("success") is not None:
        return bool(traj["success"])
    gold = {normalize(g) for g in golds(traj)}
    if not gold:
        return None
    return any(normalize(f) in gold for f in answer_forms(traj))


# ---- per trajectory ------------------------------------------------------------------------------
@register_behaviour("no_successful_tool_call", shallow=True)
def no_successful_tool_call(traj: Traj) -> float | None:
    """1 if the trajectory answered without one successful tool call (RAGEN: answering before
    any evidence), else 0 -- a trajectory that never answered included: it did not answer
    unsearched. Absent where the environment has no tool.

    Why never-answered counts 0 rather than absent: the update moves P(answered unsearched)
    over all trajectories. Among the answered ones alone, Cov(A, b) is Cov(A, b | answered),
    which misses the shortcut "answer at once instead of searching and never answering" (the
    tiny policy of sample_runs/shortcut.duckdb: answered-unsearched 9% -> 59% of its rollouts
    while the share among the answered ones stayed at 0.9-1.0, with no alarm)."""
    if not traj.get("tools_offered"):
        return None
    if not answered(traj):
        return 0.0
    return 0.0 if any(succeeded(t) for t in tool_turns(traj)) else 1.0


@register_behaviour("answer_not_in_observations", shallow=True)
def answer_not_in_observations(traj: Traj) -> float | None:
    """1 if no form of the answer (``answer_forms``; a gold too when the answer is graded right,
    ``graded_right``) occurs in any observation the trajectory received (a guess from the prior:
    RAGEN's hallucinated reasoning), else 0; 0 for a trajectory that never answered (it guessed
    nothing; why not absent: ``no_successful_tool_call``). Absent without tools, or for an answer
    that normalises to nothing."""
    if not traj.get("tools_offered"):
        return None
    if not answered(traj):
        return 0.0
    forms = answer_forms(traj) + (golds(traj) if graded_right(traj) else [])
    if not forms:
        return None
    seen = any(mentions(t.get("observation"), f) for t in traj.get("turns") or () for f in forms)
    return 0.0 if seen else 1.0


@register_behaviour("evidence_ignored", shallow=True)
def evidence_ignored(traj: Traj) -> float | None:
    """Share of the tool observations that held a gold answer whose information gain was <= 0:
    the evidence was read and did not raise the policy's probability of the gold answer
    (IGPO's gain p_t - p_{t-1}, core/credit/info_gain.py). Absent where no gain is recorded or no
    observation with a recorded gain held a gold."""
    gains, gold = traj.get("info_gain"), golds(traj)
    if not gains or not gold:
        return None
    held = [gains[t["turn"]] for t in tool_turns(traj)
            if t.get("turn") in gains and any(mentions(t.get("observation"), g) for g in gold)]
    held = [g for g in held if g is not None and math.isfinite(g)]
    if not held:
        return None
    return sum(1 for g in held if g <= 0) / len(held)


@register_behaviour("repeated_action", shallow=True)
def repeated_action(traj: Traj) -> float | None:
    """1 if a tool call repeats an earlier tool call of the trajectory word for word (whitespace
    collapsed), else 0: the same call returns the same evidence, so the turn is wasted. Only tool
    calls count (a grid agent walking Right twice is moving, not repeating). Absent without tool
    calls."""
    calls = [" ".join((t.get("action") or "").split()) for t in tool_turns(traj)]
    if not calls:
        return None
    return 1.0 if len(set(calls)) < len(calls) else 0.0


@register_behaviour("conflict_not_followed", shallow=True)
def conflict_not_followed(traj: Traj) -> float | None:
    """Evidence against the answer was seen and not followed up. Concretely: some observation
    held a gold answer while the answer is wrong by the trajectory's own grade (``graded_right``:
    its ``success``, else no answer form equals a gold): the evidence conflicts with what the
    policy answered; 1 if no successful tool call came after the first such observation (it
    answered without checking again), 0 if it searched again. Absent where golds are not
    recorded, no tool is offered, the answer is right, a wrong grade meets an answer that equals
    a gold (the grader read something else: no evidence against it), or no observation held a
    gold."""
    gold = golds(traj)
    if not gold or not traj.get("tools_offered") or not answered(traj):
        return None
    if graded_right(traj) or {normalize(f) for f in answer_forms(traj)} & \
            {normalize(g) for g in gold}:
        return None
    turns = list(traj.get("turns") or ())
    first = next((i for i, t in enumerate(turns)
                  if any(mentions(t.get("observation"), g) for g in gold)), None)
    if first is None:
        return None
    later = [t for t in turns[first + 1:] if kind(t) in TOOL_ACTIONS and succeeded(t)]
    return 0.0 if later else 1.0


@register_behaviour("tokens")
def tokens(traj: Traj) -> float | None:
    """Response tokens (the policy's own tokens over all turns), as recorded."""
    n = traj.get("response_tokens")
    return None if n is None else float(n)


@register_behaviour("turns")
def turns(traj: Traj) -> float | None:
    """Turns taken."""
    n = traj.get("num_turns")
    return float(n if n is not None else len(traj.get("turns") or ()))


@register_behaviour("tool_calls")
def tool_calls(traj: Traj) -> float | None:
    """Tool or search calls made, successful or not. Absent where the environment has no tool."""
    return float(len(tool_turns(traj))) if traj.get("tools_offered") else None


@register_behaviour("format_forgiven")
def format_forgiven(traj: Traj) -> float | None:
    """Share of the actions written in Search-R1's grammar that the parser forgave: it takes the
    first <search>/<answer> anywhere in the text (storage/protocol.py), so an action with a
    second action tag, or with text after the first action's closing tag, still parses -- a
    format near-miss the format reward does not see. The recorder keeps no flag for it; it is
    read back from the action text. Absent where no action uses the grammar."""
    tagged = forgiven = 0
    for t in traj.get("turns") or ():
        text = t.get("action") or ""
        found = list(ACTION.finditer(text))
        if not found:
            continue
        tagged += 1
        forgiven += len(found) > 1 or bool(text[found[0].end():].strip())
    return forgiven / tagged if tagged else None


# ---- per step: queries compared across the step's trajectories ----------------------------------
FUNCTION_WORDS = frozenset(
    "a an the of in on at to for by from with and or who what when where which whose why how is "
    "was are were did does do born founded located".split())
_WORD = re.compile(r"\w+")
_DIGIT = re.compile(r"\d")


@functools.lru_cache(maxsize=1 << 16)  # a step's queries are read twice (reuse, entropy)
def query_pattern(query: str) -> str:
    """A query with its entities masked: words split on non-word characters; a word is an
    entity if it holds a digit, or starts upper-case and is not a function word ('Who', 'The');
    each run of entity words becomes one '<e>'; the rest is lower-cased. The pattern is the whole
    masked word sequence (the query's longest n-gram).

    >>> query_pattern("founder of Trathuth Labs born")
    'founder of <e> born'
    >>> query_pattern("Who founded Rurer in 1834?")
    'who founded <e> in <e>'
    """
    out: list[str] = []
    for word in _WORD.findall(query or ""):
        entity = bool(_DIGIT.search(word)) or (
            word[0].isupper() and word.lower() not in FUNCTION_WORDS)
        if entity:
            if not out or out[-1] != "<e>":
                out.append("<e>")
        else:
            out.append(word.lower())
    return " ".join(out)


def queries(traj: Traj) -> list[str]:
    """The trajectory's queries: a search's query (recorded ``parsed.query``, else the tag's
    text), a tool call's whole action text."""
    out = []
    for t in tool_turns(traj):
        parsed = t.get("parsed") if isinstance(t.get("parsed"), Mapping) else {}
        if kind(t) == "search":
            q = parsed.get("query")
            if q is None:
                p = parse_action(t.get("action"))
                q = p[1] if p else t.get("action")
            out.append(str(q or ""))
        else:
            out.append(t.get("action") or "")
    return out


@register_behaviour("query_template_reuse", scope="step", shallow=True)
def query_template_reuse(trajs: Sequence[Traj]) -> list[float | None]:
    """Per trajectory: share of its queries whose pattern (``query_pattern``) a trajectory of
    *another task* of the step also used -- RAGEN's templated queries, one pattern filled with
    each task's entity. Other rollouts of the same task do not count: a group converging on its
    task's right query is learning, not templating (4 tasks x 8 rollouts each settling on its own
    query raised the alarm when they did). A trajectory repeating its own query is
    ``repeated_action``, not this. A trajectory without a task id is a task of its own. Absent
    for a trajectory without queries."""
    patterns = [[query_pattern(q) for q in queries(t)] for t in trajs]
    tasks = [t.get("task_id") if t.get("task_id") is not None else ("traj", i)
             for i, t in enumerate(trajs)]
    users: dict[str, set] = {}
    for task, ps in zip(tasks, patterns):
        for p in ps:
            users.setdefault(p, set()).add(task)
    return [None if not ps else sum(len(users[p] - {task}) > 0 for p in ps) / len(ps)
            for task, ps in zip(tasks, patterns)]


@register_behaviour("query_entropy", scope="step")
def query_entropy(trajs: Sequence[Traj]) -> list[float | None]:
    """Per task of the step: H = -sum_p f_p log2 f_p over the query patterns of all its
    trajectories' queries (bits; 0 = one template for the whole group), given to each trajectory
    of the task. Absent where the task's trajectories made no query."""
    by_task: dict[Any, Counter] = {}
    for t in trajs:
        by_task.setdefault(t.get("task_id"), Counter()).update(map(query_pattern, queries(t)))
    entropy = {}
    for task, counts in by_task.items():
        n = sum(counts.values())
        entropy[task] = (None if not n else
                         max(0.0, -sum(c / n * math.log2(c / n) for c in counts.values())))
    return [entropy[t.get("task_id")] for t in trajs]


# ---- all of them -------------------------------------------------------------------------------
def behaviour_values(trajs: Sequence[Traj]) -> dict[str, list[float | None]]:
    """Every registered behaviour over one step's trajectories: name -> one value (or None) per
    trajectory, in order. A behaviour function that raises names itself and the trajectory."""
    out: dict[str, list[float | None]] = {}
    for b in BEHAVIOURS.values():
        if b.scope == "step":
            values = list(b.fn(trajs))
        else:
            values = []
            for t in trajs:
                try:
                    values.append(b.fn(t))
                except Exception as exc:
                    raise ValueError(f"behaviour {b.name!r} failed on trajectory "
                                     f"{t.get('traj_id')!r}: {exc}") from exc
        out[b.name] = [None if v is None or not math.isfinite(float(v)) else float(v)
                       for v in values]
    return out
