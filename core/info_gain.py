"""Information gain per turn (IGPO): how much each turn raised the policy's belief in the gold answer.

After turn t the policy's probability of the gold answer a (L tokens) is read teacher-forced, as
the geometric mean of the answer tokens' probabilities:

    p_t = exp( (1/L) * sum_{j=1..L} log pi(a_j | q, o_<=t, a_<j) )

with ``<answer>`` appended to the context the policy would act from next (the history up to and
including turn t's observation, ending with the assistant header), so a is read where the policy
would write its answer. p_0 is read before any turn (the prompt alone). Turn t's signal is

    info_gain_t = p_t - p_{t-1}          (turns 1..T-1 in IGPO's numbering; the final turn
                                          keeps the outcome reward and gets no gain)

In this code's 0-based turns: turn k's gain is p(after turn k) - p(before turn k), for every turn
but the last. All (trajectory, turn) contexts of a step are scored in padded batches, one forward
pass each, without gradients. The first gold answer is the one read (golds are aliases).

Recorded per turn in ``turn_signals`` (source 'train'): ``answer_prob`` (p after turn k; turn -1
holds p_0) and ``info_gain``; the trajectory's sum of gains (p_{T-1} - p_0, the sum telescopes)
is its ``info_gain`` reward component. With ``w_info_gain`` > 0 the gains become a dense
turn-level advantage on each turn's action tokens (core/algorithms.py
``info_gain_turn_advantages``, applied by core/credit.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from core.trajectory import Trajectory

ANSWER_OPEN = "<answer>"
"""What the policy writes before an answer (Search-R1's tag): the gold is read right after it."""
BATCH = 8
"""Contexts per forward pass."""


def answer_probability(token_logprobs: Sequence[float]) -> float:
    """p = exp((1/L) * sum_j log pi(a_j | ...)): the geometric mean of the L answer tokens'
    probabilities.

    >>> round(answer_probability([math.log(0.5), math.log(0.125)]), 6)
    0.25
    """
    if len(token_logprobs) == 0:
        raise ValueError("an answer needs at least one token")
    return math.exp(math.fsum(token_logprobs) / len(token_logprobs))


def turn_gains(probs: Sequence[float]) -> list[float]:
    """[p_1 - p_0, p_2 - p_1, ...] for probs = [p_0, p_1, ..., p_{T-1}] (p_0 before any turn, p_k
    after turn k-1): one gain per turn but the last, whose reward is the outcome.

    >>> [round(g, 6) for g in turn_gains([0.1, 0.4, 0.3])]
    [0.3, -0.1]
    """
    return [b - a for a, b in zip(probs[:-1], probs[1:])]


@dataclass
class TurnSignals:
    """One trajectory's answer probabilities and gains."""
    probs: list[float]
    """p_0 (before any turn), then p after turns 0..T-2."""
    gains: list[float] = field(default_factory=list)
    """Gain of turns 0..T-2 (``turn_gains(probs)``)."""

    @property
    def total(self) -> float:
        """Sum of the gains: p_{T-1} - p_0 (the trajectory's ``info_gain`` reward component)."""
        return math.fsum(self.gains)


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


def measure(policy, trajs: Sequence[Trajectory], batch: int = BATCH) -> dict[str, TurnSignals]:
    """Teacher-forced p_k before each turn's action, for every trajectory with a gold answer;
    trajectory id -> its ``TurnSignals``. Trajectories without golds (or turns) are left out."""
    from core.policy import token_logprobs  # torch-heavy; imported where used

    tok = policy.tokenizer
    open_ids = tok.encode(ANSWER_OPEN, add_special_tokens=False)
    jobs: list[tuple[str, list[int], int]] = []  # (traj id, ids, number of answer tokens)
    for t in trajs:
        # a turn without action tokens (none in rollouts) would shift gains off their turns
        if not has_gold(t) or len(action_starts(t)) != t.num_turns:
            continue
        gold = tok.encode(t.task.golds[0], add_special_tokens=False)
        if not gold:
            continue
        for start in action_starts(t):
            jobs.append((t.traj_id, list(t.token_ids[:start]) + open_ids + gold, len(gold)))
    # contexts of like length batched together: a turn-0 context padded to a last turn's
    # length would cost as much as the last turn
    order = sorted(range(len(jobs)), key=lambda j: len(jobs[j][1]))
    lps: list[list[float]] = [[] for _ in jobs]
    device = next(policy.base.parameters()).device
    with torch.no_grad():
        for i in range(0, len(order), batch):
            part = [jobs[j] for j in order[i:i + batch]]
            width = max(len(ids) for _, ids, _ in part)
            pad = policy.pad_id
            ids = torch.full((len(part), width), pad, dtype=torch.long)
            attn = torch.zeros((len(part), width), dtype=torch.long)
            score = torch.zeros((len(part), width), dtype=torch.bool)
            for r, (_, seq, n) in enumerate(part):
                ids[r, :len(seq)] = torch.tensor(seq)
                attn[r, :len(seq)] = 1
                score[r, len(seq) - n:len(seq)] = True
            out = token_logprobs(policy, ids.to(device), score.to(device),
                                 attention_mask=attn.to(device))["logprobs"].cpu()
            for r, j in enumerate(order[i:i + batch]):
                lps[j] = out[r][score[r]].tolist()
    probs: dict[str, list[float]] = {}
    for (traj_id, _, _), lp in zip(jobs, lps):
        probs.setdefault(traj_id, []).append(answer_probability(lp))
    return {k: TurnSignals(p, turn_gains(p)) for k, p in probs.items()}


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
