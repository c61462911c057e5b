"""Information gain per turn (IGPO): how much each turn raised the policy's belief in the gold answer.

After turn t the policy's probability of the gold answer a (L tokens) is read teacher-forced, as
the geometric mean of the answer tokens' probabilities:

    p_t = exp( (1/L) * sum_{j=1..L} log pi(a_j | q, o_<=t, a_<j) )

with ``<answer>`` appended to the context the policy would act from next (the history up to and
including turn t's observation, ending with the assistant header), so a is read where the policy
would write its answer. p_0 is read before any turn (the prompt alone). Turn t's signal is

    info_gain_t = p_t - p_{t-1}          (turns 1..T-1 in IGPO's numbering; the final turn
                                          keeps the outcome reward and gets no gain)

That is the paper's gain (``info_gain_type`` "prob"). IGPO's released training script uses the
log-probability difference instead ("log_prob": the same reads, differenced as the mean log
probability of the answer tokens, log p_t - log p_{t-1}); ``turn_gains`` takes either.

In this code's 0-based turns: turn k's gain is p(after turn k) - p(before turn k), for every turn
but the last. The turn contexts of one trajectory are prefixes of each other, so they are read in
one row (``pack``): the history once, then one answer block per turn that sees only its own
prefix. Rows are scored in padded batches, without gradients. The first gold answer is the one
read (golds are aliases).

Recorded per turn in ``turn_signals`` (source 'train'): ``answer_prob`` (p after turn k; turn -1
holds p_0) and ``info_gain``; the trajectory's sum of gains (p_{T-1} - p_0, the sum telescopes)
is its ``info_gain`` reward component. With ``w_info_gain`` > 0 the gains become IGPO's turn
returns on each turn's action tokens (core/algorithms/estimators.py ``igpo_turn_advantages``, applied by
core/credit/assign.py). A gain that is not finite (a NaN read) is recorded as it is, left out of the
total and of the credit, and counted (``info_gain/skipped_turns``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from core.model.policy import token_logprobs
from core.rollout.trajectory import Trajectory

ANSWER_OPEN = "<answer>"
"""What the policy writes before an answer (Search-R1's tag): the gold is read right after it."""
BATCH = 8
"""Rows per forward pass."""


def answer_probability(token_logprobs: Sequence[float]) -> float:
    """p = exp((1/L) * sum_j log pi(a_j | ...)): the geometric mean of the L answer tokens'
    probabilities.

    >>> round(answer_probability([math.log(0.5), math.log(0.125)]), 6)
    0.25
    """
    if len(token_logprobs) == 0:
        raise ValueError("an answer needs at least one token")
    return math.exp(math.fsum(token_logprobs) / len(token_logprobs))


GAIN_TYPES = ("prob", "log_prob")
"""How a turn's gain is differenced: the answer probability (IGPO's paper) or its log (IGPO's
released training script, ``info_gain_type=log_prob_diff``)."""


def turn_gains(probs: Sequence[float], kind: str = "prob") -> list[float]:
    """[v_1 - v_0, v_2 - v_1, ...] for probs = [p_0, p_1, ..., p_{T-1}] (p_0 before any turn, p_k
    after turn k-1), v = p ("prob") or log p ("log_prob"): one gain per turn but the last, whose
    reward is the outcome. log 0 is -inf, so such a gain is not finite (skipped by the credit).

    >>> [round(g, 6) for g in turn_gains([0.1, 0.4, 0.3])]
    [0.3, -0.1]
    >>> [round(g, 6) for g in turn_gains([0.1, 0.4], "log_prob")]
    [1.386294]
    """
    if kind not in GAIN_TYPES:
        raise ValueError(f"info gain type must be one of {GAIN_TYPES}, got {kind!r}")
    values = list(probs) if kind == "prob" else [math.log(p) if p > 0 else -math.inf
                                                 for p in probs]
    return [b - a for a, b in zip(values[:-1], values[1:])]


@dataclass
class TurnSignals:
    """One trajectory's answer probabilities and gains."""
    probs: list[float]
    """p_0 (before any turn), then p after turns 0..T-2."""
    gains: list[float] = field(default_factory=list)
    """Gain of turns 0..T-2 (``turn_gains(probs)``)."""

    @property
    def total(self) -> float:
        """Sum of the finite gains: p_{T-1} - p_0 when all are (the trajectory's ``info_gain``
        reward component)."""
        return math.fsum(g for g in self.gains if math.isfinite(g))

    @property
    def skipped(self) -> int:
        """Gains that are not finite (left out of the total and the credit)."""
        return sum(not math.isfinite(g) for g in self.gains)


def action_starts(traj: Trajectory) -> list[int]:
    """Position of the first action token of each turn (the context before it is what the
    policy acted from)."""
    starts: dict[int, int] = {}
    for pos, (role, turn) in enumerate(zip(traj.roles, traj.token_turn)):
        if role == "action" and turn >= 0 and turn not in starts:
            starts[turn] = pos
    return [starts[k] for k in sorted(starts)]


def has_gold(traj: Trajectory) -> bool:
    return bool(traj.task.golds) and bool(traj.turns)


def pack(history: Sequence[int], starts: Sequence[int], answer: Sequence[int]):
    """Every turn's context of one trajectory in one sequence: the history up to the last turn's
    action (n = starts[-1] tokens), then one copy of ``answer`` (m tokens) per turn k, placed at
    positions starts[k] .. starts[k]+m-1 and seeing only history[:starts[k]] and itself. Turn k's
    context history[:starts[k]] + answer is then read exactly as if it stood alone, but the
    history is run once instead of once per turn (the turn contexts are prefixes of each other).

    Returns (ids, positions, allowed): ``allowed[i, j]`` is True where token i attends to j.

    >>> ids, pos, allowed = pack([5, 6, 7], [1, 3], [9])
    >>> ids, pos
    ([5, 6, 7, 9, 9], [0, 1, 2, 1, 3])
    >>> allowed.int().tolist()[3:]
    [[1, 0, 0, 1, 0], [1, 1, 1, 0, 1]]
    """
    n, m = starts[-1], len(answer)
    size = n + len(starts) * m
    allowed = torch.zeros((size, size), dtype=torch.bool)
    allowed[:n, :n] = torch.ones((n, n), dtype=torch.bool).tril()
    ids, positions = list(history[:n]), list(range(n))
    block = torch.ones((m, m), dtype=torch.bool).tril()
    for k, start in enumerate(starts):
        b = n + k * m
        allowed[b:b + m, :start] = True
        allowed[b:b + m, b:b + m] = block
        ids += answer
        positions += range(start, start + m)
    return ids, positions, allowed


def packs_supported(policy) -> bool:
    """A packed sequence needs an attention that takes a custom (B, 1, T, T) mask."""
    return policy.base.config._attn_implementation in ("sdpa", "eager")


def measure(policy, trajs: Sequence[Trajectory], batch: int = BATCH,
            packed: bool | None = None, kind: str = "prob") -> dict[str, TurnSignals]:
    """Teacher-forced p_k before each turn's action, for every trajectory with a gold answer;
    trajectory id -> its ``TurnSignals``. Trajectories without golds (or turns) are left out.

    ``packed`` (default: where the attention allows it) reads all turns of a trajectory in one
    sequence (``pack``); otherwise each turn's context is its own row. Both give the same
    probabilities up to float rounding. ``kind``: how gains are differenced (``turn_gains``)."""
    tok = policy.tokenizer
    open_ids = tok.encode(ANSWER_OPEN, add_special_tokens=False)
    if packed is None:
        packed = packs_supported(policy)
    # one row per trajectory (packed) or per turn:
    # (traj id, ids, positions, allowed, scored positions, answer length L)
    rows: list[tuple] = []
    for t in trajs:
        # a turn without action tokens (none in rollouts) would shift gains off their turns
        if not has_gold(t) or len(action_starts(t)) != t.num_turns:
            continue
        gold = tok.encode(t.task.golds[0], add_special_tokens=False)
        if not gold:
            continue
        answer, starts = open_ids + gold, action_starts(t)
        if packed:
            ids, positions, allowed = pack(t.token_ids, starts, answer)
            n, m = starts[-1], len(answer)
            scored = [i for k in range(len(starts))
                      for i in range(n + k * m + m - len(gold), n + (k + 1) * m)]
            rows.append((t.traj_id, ids, positions, allowed, scored, len(gold)))
        else:
            for start in starts:
                ids = list(t.token_ids[:start]) + answer
                rows.append((t.traj_id, ids, None, None,
                             list(range(len(ids) - len(gold), len(ids))), len(gold)))
    # rows of like length batched together: a short row padded to a long one's length would
    # cost as much as the long one
    order = sorted(range(len(rows)), key=lambda j: len(rows[j][1]))
    lps: list[list[float]] = [[] for _ in rows]
    device = next(policy.base.parameters()).device
    with torch.no_grad():
        for i in range(0, len(order), batch):
            part = [rows[j] for j in order[i:i + batch]]
            ids, score, kwargs = _batch(part, policy, packed)
            out = token_logprobs(policy, ids.to(device), score.to(device),
                                 **{k: v.to(device) for k, v in kwargs.items()})["logprobs"].cpu()
            for r, j in enumerate(order[i:i + batch]):
                lps[j] = out[r][score[r]].tolist()
    probs: dict[str, list[float]] = {}
    for (traj_id, *_, size), lp in zip(rows, lps):  # rows in turn order, L scores per turn
        probs.setdefault(traj_id, []).extend(
            answer_probability(lp[k:k + size]) for k in range(0, len(lp), size))
    return {k: TurnSignals(p, turn_gains(p, kind)) for k, p in probs.items()}


def _batch(part, policy, packed: bool):
    """Padded (B, W) ids, the score mask, and the attention arguments of a batch of rows."""
    width = max(len(row[1]) for row in part)
    ids = torch.full((len(part), width), policy.pad_id, dtype=torch.long)
    score = torch.zeros((len(part), width), dtype=torch.bool)
    if not packed:
        attn = torch.zeros((len(part), width), dtype=torch.long)
        for r, (_, seq, _, _, scored, _) in enumerate(part):
            ids[r, :len(seq)] = torch.tensor(seq)
            attn[r, :len(seq)] = 1
            score[r, scored] = True
        return ids, score, {"attention_mask": attn}
    # padding attends to itself only (a row of nothing allowed would be NaN) and is not scored
    allowed = torch.eye(width, dtype=torch.bool).repeat(len(part), 1, 1)
    positions = torch.zeros((len(part), width), dtype=torch.long)
    for r, (_, seq, pos, mask, scored, _) in enumerate(part):
        ids[r, :len(seq)] = torch.tensor(seq)
        positions[r, :len(seq)] = torch.tensor(pos)
        allowed[r, :len(seq), :len(seq)] = mask
        score[r, scored] = True
    mask = allowed[:, None]
    if policy.base.config._attn_implementation == "eager":  # eager adds the mask to the scores
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    return ids, score, {"attention_mask": mask, "position_ids": positions}


def signal_rows(trajs: Sequence[Trajectory], signals: dict[str, TurnSignals]) -> list[dict]:
    """``turn_signals`` rows: answer_prob at turn -1 (p_0) and after each turn but the last,
    info_gain for each turn but the last."""
    rows = []
    for t in trajs:
        s = signals.get(t.traj_id)
        if s is None:
            continue
        for k, p in enumerate(s.probs):
            rows.append({"traj_id": t.traj_id, "turn": k - 1, "name": "answer_prob",
                         "value": float(p), "source": "train"})
        for k, g in enumerate(s.gains):
            rows.append({"traj_id": t.traj_id, "turn": k, "name": "info_gain",
                         "value": float(g), "source": "train"})
    return rows
