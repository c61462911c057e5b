"""Credit assignment: trajectory rewards -> one advantage per trained token, by algorithm.

Each credit step registers itself by name (``@register_credit_step``, core/algorithms/registry.py; an
algorithm names its step there) and takes the step's scored trajectories, the config and the
resolved ``Algorithm``, and returns a ``Credit``: per-token
advantages (one float tensor (T_i,) per trajectory, 0 on untrained tokens), per-turn advantages
for turn-level methods and PPO's returns, parallel to the trajectories; the trainer hands them on
to the update and the record, with each trajectory's scalar advantage and whether it is
filtered out of the update. Credit only returns values: it writes nothing on the trajectories.

    outcome                 the algorithm's outcome estimator (grpo, dr_grpo, rloo, loop):
                            the trajectory's advantage on every one of its tokens
    starpo_s                GRPO + RAGEN's filter: only the top ``starpo_keep`` groups by in-group
                            reward std are trained (whole groups kept or dropped)
    gigpo                   A = A_episode + w * A_step per turn (anchor-state step groups)
    gae (ppo)               GAE over trained tokens with the value head's estimates, reward on
                            each trajectory's last trained token, whitened over the batch (verl)
After any of them, with
``w_info_gain`` > 0 the trajectories with measured gains (IGPO, core/credit/info_gain.py) take IGPO's
turn returns instead: gains and outcomes z-scored apart within the task group, the outcome as the
last turn's reward, accumulated backwards with ``info_gain_gamma`` (core/algorithms/estimators.py
``igpo_turn_advantages``). With ``w_spa`` > 0 SPA's progress contributions
(core/credit/progress.py) are turn rewards: under PPO they enter GAE on each turn's last token,
as in SPA's PPO; without a critic each turn gets its return-to-go less its group's mean
return-to-go at that turn (core/algorithms/estimators.py ``spa_turn_advantages``). With ``w_prm`` > 0
each turn's process reward model score (core/credit/prm.py), centred within the group, is added
to that turn's action tokens. Last, LOOP's filter drops the trajectories none of whose trained
tokens has |A| >= ``min_abs_advantage`` (for the outcome estimators: |A| of the trajectory), so
the dense credit is not filtered away, and keeps at least one rollout per rank as LOOP does.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import torch

from core.credit.advantages import anchor_key, drop_small, gae, gigpo_step_advantages, starpo_s_keep
from core.algorithms import estimators
from core.algorithms.catalog import resolve
from core.algorithms.estimators import (discounted_turn_sums, gigpo_episode_advantages,
                                    info_gain_turn_advantages, spa_turn_advantages)
from core.algorithms.registry import Algorithm, register_credit_step
from core.rollout.trajectory import Trajectory


@dataclass
class Credit:
    """What credit assignment returns, one entry per trajectory of the batch, in its order."""
    per_token: list[torch.Tensor]
    """Advantage of every token (T_i,), 0 where untrained."""
    turn_advantages: list[list[float] | None]
    """Per-turn advantages (GiGPO); None where the method has one advantage per trajectory."""
    returns: list[torch.Tensor | None]
    """Per-token returns (T_i,), the value head's target (PPO); None otherwise."""
    values: list[torch.Tensor | None] | None = None
    """Per-token value estimates (T_i,) before the update, GAE's (PPO): the anchor of the
    optional value clip (``value_clip``); None otherwise."""
    advantage: list[float] = field(default_factory=list)
    """Each trajectory's scalar advantage (the outcome estimator's; PPO's mean over its trained
    tokens), recorded as ``trajectories.advantage``."""
    filtered: list[bool] = field(default_factory=list)
    """Whether each trajectory is left out of the update (StarPO-S, LOOP's |A| filter)."""

    @classmethod
    def outcome(cls, per_token: list[torch.Tensor], advantage: Sequence[float],
                filtered: Sequence[bool]) -> "Credit":
        n = len(per_token)
        return cls(per_token, [None] * n, [None] * n, advantage=list(advantage),
                   filtered=list(filtered))

    def part(self, start: int, stop: int) -> "Credit":
        """The entries of trajectories ``start:stop`` (one rank's share of the batch)."""
        return Credit(self.per_token[start:stop], self.turn_advantages[start:stop],
                      self.returns[start:stop],
                      self.values[start:stop] if self.values is not None else None,
                      self.advantage[start:stop], self.filtered[start:stop])


def _mask(traj: Trajectory) -> torch.Tensor:
    return torch.tensor(traj.trained, dtype=torch.bool)


def _rewards(trajs: Sequence[Trajectory]) -> tuple[torch.Tensor, list[str]]:
    return (torch.tensor([t.reward for t in trajs], dtype=torch.float32),
            [t.group_id for t in trajs])


@register_credit_step("outcome")
def outcome(trajs: Sequence[Trajectory], cfg, algo: Algorithm, values=None) -> Credit:
    """Group-relative outcome advantage (the algorithm's registered estimator) spread over the
    trajectory's tokens."""
    adv = algo.estimate([t.reward for t in trajs], [t.group_id for t in trajs]).tolist()  # (B,)
    return Credit.outcome([a * _mask(t).float() for t, a in zip(trajs, adv)], adv,
                          [t.filtered for t in trajs])


@register_credit_step("starpo_s")
def starpo_s(trajs: Sequence[Trajectory], cfg, algo: Algorithm, values=None) -> Credit:
    """GRPO advantages; groups outside the top ``starpo_keep`` by reward std are filtered."""
    credit = outcome(trajs, cfg, algo)
    rewards, gids = _rewards(trajs)
    keep = starpo_s_keep(rewards, gids, cfg.starpo_keep)
    return replace(credit, filtered=[f or not k for f, k in zip(credit.filtered, keep.tolist())])


def step_rewards(traj: Trajectory) -> list[float]:
    """Per-turn rewards whose sum is the trajectory's reward: the env's step rewards, with the
    part of the scored reward they do not pay out (outcome, format, costs) paid on the last turn."""
    rs = [float(turn.step_reward) for turn in traj.turns]
    if rs:
        rs[-1] += traj.reward - sum(rs)
    return rs


def anchor_keys(traj: Trajectory) -> list[str]:
    """The state each turn acted from, as GiGPO's anchor: the env's ``state_key`` stored on the
    turn, so one state reached at different turns is one anchor. A turn without one (an env that
    offers none) falls back to the state as text: the task at the start, then the previous
    observation."""
    seen = ["task:" + traj.task.task_id] + [turn.observation for turn in traj.turns[:-1]]
    return [anchor_key("state:" + turn.state_key) if turn.state_key is not None
            else anchor_key(text) for turn, text in zip(traj.turns, seen)]


@register_credit_step("gigpo")
def gigpo(trajs: Sequence[Trajectory], cfg, algo: Algorithm | None = None, values=None) -> Credit:
    """GiGPO: episode advantage plus ``gigpo_weight`` x the anchor-state step advantage, both
    normalised as ``gigpo_norm`` says, as verl-agent's ``mode`` does for both (core_gigpo.py):
    "std" (its mean_std_norm) or "none" (its mean_norm: centred only); the episode term's
    statistics over turns or trajectories as ``gigpo_episode_stats`` says."""
    norm = getattr(cfg, "gigpo_norm", "std")
    episode = gigpo_episode_advantages(
        [t.reward for t in trajs], [len(t.turns) for t in trajs], [t.group_id for t in trajs],
        cross_steps=getattr(cfg, "gigpo_episode_stats", "steps") == "steps",
        normalize="std" if norm == "std" else "mean")
    steps = gigpo_step_advantages([step_rewards(t) for t in trajs], [anchor_keys(t) for t in trajs],
                                  [t.group_id for t in trajs], gamma=cfg.gigpo_gamma,
                                  normalize="std" if norm == "std" else "mean")
    out, turns = [], []
    for t, e, st in zip(trajs, episode, steps):
        per_turn = [e + cfg.gigpo_weight * a for a in st]
        turns.append(per_turn)
        turn_of = torch.tensor(t.token_turn)
        adv = torch.zeros(len(t.token_ids))
        for k, a in enumerate(per_turn):
            adv[(turn_of == k) & _mask(t)] = a
        out.append(adv)
    return Credit(out, turns, [None] * len(out), advantage=episode,
                  filtered=[t.filtered for t in trajs])


@register_credit_step("gae")
def ppo(trajs: Sequence[Trajectory], cfg, algo: Algorithm | None = None,
        values: Sequence[torch.Tensor] | None = None, turn_rewards: Sequence[Sequence[float] | None] | None = None) -> Credit:
    """GAE per trajectory, whitened over all trained tokens. The reward is the trajectory's on its
    last trained token, plus ``turn_rewards[i][k]`` (SPA's weighted progress rewards) on turn k's
    last trained token, as SPA's PPO places each step's reward on that step's last token."""
    if values is None:
        raise ValueError("ppo credit needs the value head's estimates")
    turn_rewards = turn_rewards if turn_rewards is not None else [None] * len(trajs)
    advs, rets = [], []
    for t, v, extra in zip(trajs, values, turn_rewards):
        mask = _mask(t)
        r = _token_rewards(t, mask, extra)
        a, ret = gae(r[None], v.detach().float()[None], mask[None], cfg.gamma, cfg.lam)
        advs.append(a[0])
        rets.append(ret[0])
    trained = torch.cat([a[_mask(t)] for a, t in zip(advs, trajs)]) if trajs else torch.zeros(0)
    if trained.numel() > 1:
        mean, std = trained.mean(), trained.std()
        advs = [torch.where(_mask(t), (a - mean) / (std + 1e-8), torch.zeros_like(a))
                for a, t in zip(advs, trajs)]
    scalar = [float(a[_mask(t)].mean()) if any(t.trained) else 0.0 for t, a in zip(trajs, advs)]
    return Credit(advs, [None] * len(advs), rets, [v.detach().float() for v in values],
                  advantage=scalar, filtered=[t.filtered for t in trajs])


def _token_rewards(t: Trajectory, mask: torch.Tensor, per_turn: Sequence[float] | None
                   ) -> torch.Tensor:
    """(T,) rewards for GAE: the trajectory's reward on its last trained token and each of
    ``per_turn`` on its turn's last trained token (a turn without one drops its reward)."""
    r = torch.zeros(len(t.token_ids))
    if not mask.any():
        return r
    r[int(mask.nonzero()[-1])] = t.reward
    turn_of = torch.tensor(t.token_turn)
    for k, x in enumerate(per_turn or []):
        mine = (mask & (turn_of == k)).nonzero()
        if len(mine):
            r[int(mine[-1])] += float(x)
    return r


def assign(trajs: Sequence[Trajectory], cfg, values=None,
           info_gains: Sequence[Sequence[float] | None] | None = None,
           progress: Sequence[Sequence[float] | None] | None = None,
           prm: Sequence[Sequence[float] | None] | None = None,
           ranks_of: Sequence[int] | None = None, algo: Algorithm | None = None) -> Credit:
    """Credit for ``algo`` (the run's resolved algorithm; resolved here from ``cfg.algo`` for a
    caller that has none); then the dense information-gain credit (``w_info_gain``;
    ``info_gains``: each trajectory's per-turn gains, None where none was measured) and SPA's
    progress credit (``w_spa``; ``progress``: each trajectory's per-turn contributions,
    core/credit/progress.py: into PPO's GAE as turn rewards, else ``add_spa_credit``) and the
    process reward model's scores (``w_prm``; ``prm``, core/credit/prm.py); then LOOP's |A|
    filter (``min_abs_advantage``) on the tokens' final advantages, which keeps at least one
    rollout of each rank (``ranks_of``: each trajectory's rank; None: one process)."""
    spa = getattr(cfg, "w_spa", 0.0) > 0 and progress is not None
    algo = algo if algo is not None else resolve(cfg.algo)
    critic = algo.credit == "gae"
    if spa and critic:
        credit = ppo(trajs, cfg, algo, values, turn_rewards=[
            [cfg.w_spa * c for c in cs] if cs is not None else None for cs in progress])
    else:
        credit = algo.credit_step(trajs, cfg, algo, values)
    if getattr(cfg, "w_info_gain", 0.0) > 0 and info_gains is not None:
        credit = add_info_gain(credit, trajs, info_gains, cfg.w_info_gain,
                               gamma=cfg.info_gain_gamma)
    if spa and not critic:
        credit = add_spa_credit(credit, trajs, progress, cfg.w_spa)
    if getattr(cfg, "w_prm", 0.0) > 0 and prm is not None:
        credit = add_turn_credit(credit, trajs, prm, cfg.w_prm, scale=False)
    if cfg.min_abs_advantage > 0 and trajs:
        # after the dense credit: a rollout whose group outcomes were all equal (A = 0) still
        # trains where a turn signal gave its turns credit (IGPO's answer to zero-variance groups)
        largest = [float(adv[_mask(t)].abs().max()) if any(t.trained) else 0.0
                   for t, adv in zip(trajs, credit.per_token)]
        credit = replace(credit, filtered=drop_small_but_one(
            credit.filtered, [any(t.trained) for t in trajs], largest, cfg.min_abs_advantage,
            ranks_of))
    return credit


def drop_small_but_one(filtered: Sequence[bool], trained: Sequence[bool],
                       largest: Sequence[float], threshold: float,
                       ranks_of: Sequence[int] | None = None) -> list[bool]:
    """LOOP's |A| filter (apple/ml-loop ``_filter_rollouts``): a rollout whose largest |A| is
    below ``threshold`` is filtered; but every rank keeps at least one rollout, as LOOP rounds
    the kept count up to a multiple of the world size: where the filter would leave a rank's
    update empty, that rank's rollout of the largest |A| (with trained tokens, not filtered
    before) is kept. Returns each rollout's new filtered flag (``filtered`` stays filtered;
    ``trained``: whether it has trained tokens)."""
    keep = drop_small(torch.tensor(largest, dtype=torch.float64), threshold).tolist()
    ranks_of = list(ranks_of) if ranks_of is not None else [0] * len(filtered)
    for rank in dict.fromkeys(ranks_of):
        mine = [i for i, r in enumerate(ranks_of) if r == rank and not filtered[i] and trained[i]]
        if mine and not any(keep[i] for i in mine):
            keep[max(mine, key=lambda i: largest[i])] = True
    return [f or not k for f, k in zip(filtered, keep)]


def add_info_gain(credit: Credit, trajs: Sequence[Trajectory],
                  info_gains: Sequence[Sequence[float] | None], weight: float, *,
                  gamma: float) -> Credit:
    """IGPO's credit for every trajectory with measured gains: turn k's action tokens get
    A_{i,k} = sum_{j >= k} gamma^(j-k) r_{i,j}, with r the group-z-scored gains (x ``weight``)
    and, on the last turn, the group-z-scored outcome reward (core/algorithms/estimators.py
    ``igpo_turn_advantages``, its released trainer's form). This replaces the algorithm's own
    per-token credit of those trajectories, as IGPO's advantage is built from these turn returns
    alone; trajectories without gains (no gold answer) keep theirs. A gain that is not finite
    gives its turn no gain reward (TurnCredit counts those turns as ``info_gain/skipped_turns``)."""
    if len(info_gains) != len(trajs):
        raise ValueError(f"{len(info_gains)} gain lists for {len(trajs)} trajectories")
    measured = [i for i, g in enumerate(info_gains) if g is not None]
    dense, _ = estimators.igpo_turn_advantages(
        [list(info_gains[i]) for i in measured], [trajs[i].reward for i in measured],
        [trajs[i].group_id for i in measured], gamma, gain_weight=weight)
    per_token, turns = list(credit.per_token), list(credit.turn_advantages)
    for i, d in zip(measured, dense):
        t = trajs[i]
        per_turn = d[:t.num_turns] + [d[-1]] * (t.num_turns - len(d))
        adv, turn_of, mask = torch.zeros(len(t.token_ids)), torch.tensor(t.token_turn), _mask(t)
        for k, a in enumerate(per_turn):
            adv[(turn_of == k) & mask] = a
        per_token[i], turns[i] = adv, per_turn
    return replace(credit, per_token=per_token, turn_advantages=turns)


def add_turn_credit(credit: Credit, trajs: Sequence[Trajectory],
                    info_gains: Sequence[Sequence[float] | None], weight: float,
                    scale: bool = True, gamma: float = 0.0) -> Credit:
    """A_token += weight x A_{i,k} on turn k's action tokens, A_{i,k} turn k's value (an
    information gain, a process reward model's score) z-scored over every value of its task
    group (only centred with ``scale=False``), then accumulated over later turns with ``gamma``
    (``discounted_turn_sums``; 0: none); turns without a value keep their credit."""
    if len(info_gains) != len(trajs):
        raise ValueError(f"{len(info_gains)} gain lists for {len(trajs)} trajectories")
    dense = discounted_turn_sums(
        info_gain_turn_advantages([list(g or []) for g in info_gains],
                                  [t.group_id for t in trajs], scale=scale), gamma)
    return _add_per_turn(credit, trajs, dense, weight)


def add_spa_credit(credit: Credit, trajs: Sequence[Trajectory],
                   contributions: Sequence[Sequence[float] | None], weight: float) -> Credit:
    """SPA for the algorithms without a critic: A_token += weight x A_{i,k} on turn k's action
    tokens, A_{i,k} turn k's return-to-go of the progress contributions less its group's mean
    return-to-go at turn k (core/algorithms/estimators.py ``spa_turn_advantages``); trajectories
    without contributions keep their credit."""
    if len(contributions) != len(trajs):
        raise ValueError(f"{len(contributions)} contribution lists for {len(trajs)} trajectories")
    dense = spa_turn_advantages([list(c or []) for c in contributions], [t.group_id for t in trajs])
    return _add_per_turn(credit, trajs, dense, weight)


def _add_per_turn(credit: Credit, trajs: Sequence[Trajectory], dense: list[list[float]],
                  weight: float) -> Credit:
    """``credit`` with weight x dense[i][k] added to turn k's trained tokens of trajectory i
    and to its recorded turn advantage."""
    per_token, turns = [], []
    for t, adv, base, d, scalar in zip(trajs, credit.per_token, credit.turn_advantages, dense,
                                       credit.advantage):
        adv = adv.clone()
        per_turn = list(base) if base is not None else [scalar] * t.num_turns
        turn_of, mask = torch.tensor(t.token_turn), _mask(t)
        for k, a in enumerate(d[:len(per_turn)]):
            adv[(turn_of == k) & mask] += weight * a
            per_turn[k] += weight * a
        per_token.append(adv)
        turns.append(per_turn if d or base is not None else None)
    return replace(credit, per_token=per_token, turn_advantages=turns)
