"""Reward components as plain functions, and their weighted total. Torch-free.

The seed names four kinds of reward; each is one function of a finished ``Trajectory`` and is
recorded as its own row in the ``rewards`` table:

    outcome  in [0, 1]  the environment's grade of the final answer/state (EM, F1, tests passed)
    format   in [0, 1]  every action parsed and the episode ended by answering (scheme below)
    cost     <= 0       -(per-turn + per-token + per-tool-call charges)
    process  in [0, 1]  the environment's process signal (search: gold seen in retrieved evidence)

    total = w_outcome * outcome + w_format * format + w_cost * cost + w_process * process

One dense signal is measured per turn rather than per trajectory: ``info_gain`` (core/info_gain.py,
IGPO), the rise of the policy's teacher-forced probability of the gold answer over each turn. It
is recorded as its own component (the trajectory's sum of gains) but stays out of the total: with
``w_info_gain`` > 0 it is paid turn by turn as credit (core/credit.py), not as reward.

Answer matching follows Search-R1's ``qa_em`` grader: normalise (lower-case, drop ASCII
punctuation, drop the whole words a/an/the, collapse whitespace), then compare with each gold.
"""
from __future__ import annotations

import math
import re
import string
from collections import Counter
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:  # imported for annotations only: rewards must stay importable without torch
    from core.config import TrainConfig
    from core.trajectory import Trajectory

_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

# Actions that call a tool and are charged ``cost_per_tool_call`` (grid moves and answers are not).
TOOL_ACTIONS = frozenset({"search", "tool", "code", "docs", "api"})
# Finish reasons that mean the policy ended the episode itself.
PROPER_ENDINGS = frozenset({"answered", "done"})


# ---- answer matching -------------------------------------------------------------------------
def normalize_answer(s: str) -> str:
    """white_space_fix(remove_articles(remove_punc(lower(s)))), as Search-R1/SQuAD grade answers.

    >>> normalize_answer("  The Eiffel   Tower! ")
    'eiffel tower'
    >>> normalize_answer("A theory of an apple")
    'theory of apple'
    """
    if not isinstance(s, str):
        raise TypeError(f"normalize_answer expects str, got {type(s).__name__}")
    s = s.lower().translate(_PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _check_golds(golds: Sequence[str]) -> None:
    # A bare string would be iterated character by character and match single letters.
    if isinstance(golds, str) or not all(isinstance(g, str) for g in golds):
        raise TypeError("golds must be a list of strings, e.g. ['Paris'], not a single string")


def exact_match(prediction: str | None, golds: Sequence[str]) -> float:
    """EM = 1.0 if normalize(prediction) == normalize(g) for some gold g, else 0.0.

    A missing prediction (None) scores 0.0.

    >>> exact_match("The Eiffel Tower!", ["eiffel tower"])
    1.0
    >>> exact_match("Eiffel", ["eiffel tower", "la tour eiffel"])
    0.0
    """
    _check_golds(golds)
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return 1.0 if any(pred == normalize_answer(g) for g in golds) else 0.0


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:  # both empty counts as agreement (SQuAD v2 rule)
        return float(pred_tokens == gold_tokens)
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str | None, golds: Sequence[str]) -> float:
    """max over golds of 2PR / (P + R), P = |common| / |pred tokens|, R = |common| / |gold tokens|.

    Tokens are the whitespace-split normalised answers; common is their multiset intersection.

    >>> token_f1("Lake Varno city", ["Varno City"])
    0.8
    >>> token_f1("nothing", ["Varno"])
    0.0
    """
    _check_golds(golds)
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction).split()
    return max((_f1(pred, normalize_answer(g).split()) for g in golds), default=0.0)


def extract_answer(text: str | None) -> str | None:
    """The stripped content of the LAST <answer>...</answer> in text, or None if there is none.

    >>> extract_answer("<answer>a</answer> then <answer> Varno </answer>")
    'Varno'
    >>> extract_answer("<answer>unclosed") is None
    True
    """
    if not text:
        return None
    matches = _ANSWER.findall(text)
    return matches[-1].strip() if matches else None


# ---- components --------------------------------------------------------------------------------
def outcome_reward(traj: "Trajectory") -> float:
    """outcome = traj.outcome.score (the env's grade in [0, 1]); 0 when there is no outcome
    (the env crashed or the trajectory was cut before grading)."""
    return float(traj.outcome.score) if traj.outcome is not None else 0.0


def format_reward(traj: "Trajectory") -> float:
    """format = 0.5 * ended + 0.5 * valid_frac, where valid_frac = valid actions / actions and
    ended = 1 if the policy ended the episode itself (finish_reason answered | done), else 0.

    So 1.0 exactly when every action parsed and the episode was answered; an episode that never
    answered gets at most 0.5 (0.5 * fraction of valid actions); no actions at all gets 0.
    Like Search-R1's format-aware reward, structure is rewarded apart from correctness, but as a
    separate component so its weight is a config value rather than baked into the outcome.
    """
    if not traj.turns:
        return 0.0
    valid_frac = sum(1 for t in traj.turns if t.valid) / len(traj.turns)
    ended = 1.0 if traj.finish_reason in PROPER_ENDINGS else 0.0
    return 0.5 * ended + 0.5 * valid_frac


def _response_tokens(traj: "Trajectory") -> int:
    # Trainer trajectories carry the loss mask; imported ones may only carry per-turn counts.
    if traj.trained:
        return traj.response_tokens
    return sum(t.action_tokens for t in traj.turns)


def cost_reward(traj: "Trajectory", cfg: "TrainConfig") -> float:
    """cost = -(cost_per_turn * turns + cost_per_token * response tokens
              + cost_per_tool_call * tool calls)  (<= 0 for non-negative prices).

    Tool calls are turns whose action_type is in TOOL_ACTIONS (search, tool, code, docs, api),
    counted whether or not the call succeeded: a failed call still costs.
    """
    tool_calls = sum(1 for t in traj.turns if t.action_type in TOOL_ACTIONS)
    return -(cfg.cost_per_turn * traj.num_turns
             + cfg.cost_per_token * _response_tokens(traj)
             + cfg.cost_per_tool_call * tool_calls)


def process_reward(traj: "Trajectory") -> float:
    """process = traj.outcome.process (search: 1 if a gold answer appeared in retrieved evidence
    before the answer); 0 when there is no outcome."""
    return float(traj.outcome.process) if traj.outcome is not None else 0.0


# name -> (component function of (traj, cfg), TrainConfig field holding its weight)
COMPONENTS: dict[str, tuple[Callable[["Trajectory", "TrainConfig"], float], str]] = {
    "outcome": (lambda traj, cfg: outcome_reward(traj), "w_outcome"),
    "format": (lambda traj, cfg: format_reward(traj), "w_format"),
    "cost": (cost_reward, "w_cost"),
    "process": (lambda traj, cfg: process_reward(traj), "w_process"),
}


DENSE_COMPONENTS: dict[str, str] = {"info_gain": "w_info_gain"}
"""Per-turn signals recorded as a component, paid as turn-level credit, not in the total."""


def score(traj: "Trajectory", cfg: "TrainConfig") -> tuple[dict[str, float], float]:
    """(components, total) with total = sum_c w_c * component_c over COMPONENTS.

    Components are returned unweighted, so the rewards table shows what each signal said and the
    weights (stored with the run's config) show how much it counted.

    A component that is not a finite number raises ValueError naming the trajectory, its task
    and the component: one NaN would turn the whole step's advantages into NaN. (Our rollouts
    check the env's outcome before it gets here, core/envs/guard.py; this names what else does.)
    """
    parts = {}
    for name, (fn, _) in COMPONENTS.items():
        value = fn(traj, cfg)
        try:
            parts[name] = float(value)
        except (TypeError, ValueError, OverflowError):
            parts[name] = math.nan
        if not math.isfinite(parts[name]):
            raise ValueError(f"trajectory {traj.traj_id} (task {traj.task.task_id}): reward "
                             f"component {name} is {value!r:.80}, not a finite number")
    total = sum(getattr(cfg, weight) * parts[name] for name, (_, weight) in COMPONENTS.items())
    return parts, float(total)
