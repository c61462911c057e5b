"""Answer matching, as Search-R1's ``qa_em`` grader does it: normalise (lower-case, drop ASCII
punctuation, drop the whole words a/an/the, collapse whitespace), then compare with each gold.
Environments grade with it (core/envs/search, core/envs/apps); core/credit/rewards.py re-exports
it (``core.rewards.exact_match`` is a fixed name). Pure, standard library only.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Sequence

_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


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
