"""An RL step's per-turn credit beside the outcome reward: information gain (IGPO,
core/credit/info_gain.py), SPA's progress contributions (core/credit/progress.py) and the process reward
model's scores (AgentPRM, core/credit/prm.py). Each is measured on this rank's trajectories (the
heads are fitted on every rank's), recorded as ``turn_signals`` rows and handed to credit
assignment (core/credit/assign.py), which turns it into each turn's action tokens' advantage as
its source does: IGPO's turn returns, SPA's return-to-go, the PRM's score centred in the group.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from core.credit import info_gain

from core.credit import prm
from core.credit import progress as spa
from core.config import TrainConfig


@dataclass
class TurnValues:
    """One step's per-turn credit, a list per trajectory in the order given (None where it has
    none, or the signal is off), its ``turn_signals`` rows and the heads' fit metrics."""
    gains: list
    contributions: list
    prm_scores: list
    rows: list[dict] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    info_gain_totals: dict[str, float] = field(default_factory=dict)
    """Trajectory id -> its sum of gains: the ``info_gain`` reward component the run records
    (outside the weighted total)."""


@dataclass
class _Signal:
    """One signal's values per trajectory, its ``turn_signals`` rows and metrics."""
    values: list
    rows: list[dict] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)


class TurnCredit:
    """The signals' state across steps: SPA's progress head and the PRM head, each built at the
    first RL step that uses it (w_spa > 0, w_prm > 0) and refitted every step on the whole
    batch: under torchrun every rank fits on every rank's trajectories (``ranks``, an object
    with core/learn/distributed.py ``Ranks.everyone``; None: one process), so the heads stay
    identical across ranks, as the checkpoint (saved by rank 0) assumes."""

    def __init__(self, cfg: TrainConfig, policy, ranks=None):
        self.cfg, self.policy, self.ranks = cfg, policy, ranks
        self.spa_model = None
        """SPA's progress head (core/credit/progress.py)."""
        self.prm_model = None
        """AgentPRM's process reward head (core/credit/prm.py)."""

    def _everyone(self, mine: list) -> list:
        """Every rank's items in rank order (this rank's alone without ranks)."""
        return list(mine) if self.ranks is None else self.ranks.everyone(mine)[0]

    def state(self) -> dict:
        """The heads' weights, for the checkpoint (None: that head is not built yet)."""
        return {"spa": self.spa_model.w.clone() if self.spa_model is not None else None,
                "prm": self.prm_model.w.clone() if self.prm_model is not None else None}

    def load_state(self, heads: dict | None) -> None:
        """Put a checkpoint's head weights back (a checkpoint without them leaves the heads to
        be built at the next step, as before they were saved)."""
        size, heads = self.policy.base.config.hidden_size, heads or {}
        if heads.get("spa") is not None:
            self.spa_model = spa.ProgressModel(size, l2=self.cfg.spa_l2)
            self.spa_model.w = heads["spa"].clone()
        if heads.get("prm") is not None:
            self.prm_model = prm.PrmModel(size, l2=self.cfg.spa_l2)
            self.prm_model.w = heads["prm"].clone()

    def measure(self, own: list) -> TurnValues:
        """Every signal of this rank's scored trajectories ``own``."""
        cfg = self.cfg
        gains, totals = self._info_gain(own)
        # SPA's progress head and the PRM read the same hidden states at each action's end
        feats = spa.features(self.policy, own) if cfg.w_spa > 0 or cfg.w_prm > 0 else None
        progress, scores = self._progress(own, feats), self._prm(own, feats)
        signals = (gains, progress, scores)
        return TurnValues(gains.values, progress.values, scores.values,
                          [row for sig in signals for row in sig.rows],
                          {k: v for sig in signals for k, v in sig.metrics.items()}, totals)

    def _info_gain(self, own: list) -> tuple[_Signal, dict[str, float]]:
        """Each trajectory's per-turn information gains (core/credit/info_gain.py; None where its
        task has no gold answer or it is off), every turn's answer_prob / info_gain as
        ``turn_signals`` rows, and each trajectory's sum of gains (its ``info_gain`` reward
        component)."""
        cfg = self.cfg
        if not (cfg.record_info_gain or cfg.w_info_gain > 0):
            return _Signal([None] * len(own)), {}
        signals = info_gain.measure(self.policy, own, kind=cfg.info_gain_type)
        skipped = sum(s.skipped for s in signals.values())
        # a NaN read skips its turn, not the step; the count says it happened
        metrics = {"info_gain/skipped_turns": float(skipped)} if skipped else {}
        gains = [signals[t.traj_id].gains if t.traj_id in signals else None for t in own]
        totals = {traj_id: s.total for traj_id, s in signals.items()}
        return _Signal(gains, info_gain.signal_rows(own, signals), metrics), totals

    def _progress(self, own: list, feats: list | None) -> _Signal:
        """SPA: fit the progress head on every rank's trajectories and outcomes, then each own
        trajectory's per-turn contributions (core/credit/progress.py; None where it has none or
        w_spa is 0), recorded in ``turn_signals`` as ``progress``; and the fit's metrics
        (``spa/sum_gap_max``: the largest |sum_t c_t - R| over the fitted batch)."""
        cfg = self.cfg
        if cfg.w_spa <= 0:
            return _Signal([None] * len(own))
        if self.spa_model is None:
            self.spa_model = spa.ProgressModel(self.policy.base.config.hidden_size, l2=cfg.spa_l2)
        all_feats = self._everyone(feats)
        outcomes = self._everyone([t.rewards.get("outcome", 0.0) for t in own])
        fit = self.spa_model.fit(all_feats, outcomes)
        gaps = [abs(sum(c) - r) for c, r in zip(self.spa_model.predict(all_feats), outcomes)
                if c is not None]
        contributions = self.spa_model.predict(feats)
        return _Signal(contributions, spa.signal_rows(own, contributions),
                       {"spa/loss_before": fit.loss_before, "spa/loss_after": fit.loss_after,
                        "spa/sum_gap_max": max(gaps, default=0.0)})

    def _prm(self, own: list, feats: list | None) -> _Signal:
        """AgentPRM: Monte-Carlo labels of this rank's groups (whole on each rank), the head
        fitted on every rank's labels, then its score of every own turn (core/credit/prm.py;
        None where none or w_prm is 0), recorded in ``turn_signals`` as ``q`` and ``prm``; and
        the fit's and the labels' pooling metrics (``prm.pooling``, over every rank's labels)."""
        cfg = self.cfg
        if cfg.w_prm <= 0:
            return _Signal([None] * len(own))
        if self.prm_model is None:
            self.prm_model = prm.PrmModel(self.policy.base.config.hidden_size, l2=cfg.spa_l2)
        labels = prm.labels_for(own, gamma=cfg.prm_gamma)
        fit = self.prm_model.fit(self._everyone(feats), self._everyone(labels.values))
        scores = self.prm_model.predict(feats)
        return _Signal(scores, prm.signal_rows(own, labels.values, scores),
                       {"prm/loss_before": fit.loss_before, "prm/loss_after": fit.loss_after,
                        **prm.pooling(self._everyone(labels.counts))})
