"""Helpers shared by the RAGEN-style text games (frozenlake, sokoban, bandit). Torch-free.

Three things must be identical across those games, so they live here:

- observations are plain text, each one a new user message (``observation_role = "user"``): the
  rollout renders it with the policy tokenizer's own chat template, so no game knows any model's
  chat markers;
- the action format (RAGEN): ``<think>...</think>`` optional, then ``<answer>Up || Left</answer>``,
  actions split on ``||``, names case-insensitive, at most a few actions per turn;
- seeded randomness and the train/held-out split, both derived from SHA-256 digests so they are
  identical in every process (Python's ``hash`` of a string is salted per process).
"""
from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

INVALID_PENALTY = -0.1
"""RAGEN's step reward for a turn whose output has no valid action."""

SPLITS = ("train", "heldout")

MOVES: dict[str, tuple[int, int]] = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
"""Grid actions: canonical name -> (row delta, column delta)."""

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass
class ParsedAnswer:
    actions: list[str]
    """Canonical action names, in order (empty when invalid)."""
    error: str | None = None
    """Why the output is invalid; None when valid."""
    dropped: int = 0
    """Actions beyond the per-turn cap, ignored (RAGEN keeps the first ones)."""
    raw: str | None = None
    """The text inside <answer>...</answer>, if any."""


def parse_answer(text: str, names: Sequence[str], max_actions: int) -> ParsedAnswer:
    """Parse ``<answer>A || B</answer>`` from model output (untrusted text).

    The first ``<answer>`` block counts; text before it (a ``<think>`` block) is ignored. Every
    ``||``-separated item must be one of ``names`` (case-insensitive) or the whole turn is invalid
    and nothing is executed; items beyond ``max_actions`` are dropped.
    """
    match = _ANSWER.search(text or "")
    if match is None:
        return ParsedAnswer([], "no <answer>...</answer> block")
    raw = match.group(1)
    lookup = {name.lower(): name for name in names}
    items = [item.strip() for item in raw.split("||")]
    if not any(items):
        return ParsedAnswer([], "empty answer", raw=raw)
    actions = []
    for item in items:
        if item.lower() not in lookup:
            shown = item if len(item) <= 40 else item[:40] + "..."
            return ParsedAnswer([], f"unknown action {shown!r}", raw=raw)
        actions.append(lookup[item.lower()])
    kept = actions[:max_actions]
    return ParsedAnswer(kept, None, dropped=len(actions) - len(kept), raw=raw)


def format_help(names: Sequence[str], max_actions: int) -> str:
    """One sentence on the answer format, used in system prompts and invalid-action feedback."""
    first = names[0]
    if max_actions <= 1:
        return f"Answer with one action, e.g. <answer>{first}</answer>. Valid actions: {', '.join(names)}."
    second = names[min(2, len(names) - 1)]
    return (f"Answer with <answer>{first}</answer>, or up to {max_actions} actions joined by ||, "
            f"e.g. <answer>{first} || {second}</answer>. Valid actions: {', '.join(names)}.")


def state_block(turn: int, grid: str, actions_left: int) -> str:
    """RAGEN's per-turn state text: ``Turn k: State:\\n<grid>\\nYou have N actions left.``"""
    return f"Turn {turn}: State:\n{grid}\nYou have {actions_left} actions left."


def render(rows: Sequence[Sequence[str]]) -> str:
    """Cells separated by spaces (one SmolLM2 token per cell), rows by newlines."""
    return "\n".join(" ".join(row) for row in rows)


def digest(*parts: object) -> str:
    """SHA-256 hex of the parts joined by '|': stable across processes and machines."""
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()


def seeded_rng(*parts: object) -> random.Random:
    """A ``random.Random`` seeded from a digest of ``parts`` (e.g. task id and episode seed)."""
    return random.Random(int(digest(*parts)[:16], 16))


def split_of(key: str, heldout_share: float = 0.2) -> str:
    """Assign a layout to train or heldout by its digest, so the splits can never share one,
    whatever seeds either was generated from."""
    return "heldout" if int(digest("split", key)[:8], 16) < heldout_share * 2**32 else "train"


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def check_count(n: int) -> None:
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")


def step_to(pos: tuple[int, int], move: str) -> tuple[int, int]:
    dr, dc = MOVES[move]
    return pos[0] + dr, pos[1] + dc


PERPENDICULAR: Mapping[str, tuple[str, str]] = {
    "Up": ("Left", "Right"), "Down": ("Left", "Right"),
    "Left": ("Up", "Down"), "Right": ("Up", "Down"),
}
