"""Trajectories -> rows of the store's tables (trajectories, rewards, turns, tokens, test_results,
renders).

Rows come out as column dicts (one list per column), the cheapest shape for one bulk insert per
table per step. What the stages after the rollout computed (per-turn advantages, per-token
advantage / new and reference logprob / value, each trajectory's gradient norm) is not kept on the
trajectory: the stages return it and the trainer hands it over in a ``StageResults``.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from core.rollout.diagnostics import COMPONENTS, success_of
from core.rollout.trajectory import Trajectory

TOKEN_VALUE_COLUMNS = ("advantage", "new_logprob", "ref_logprob", "value", "train_logprob")
_PRIVATE_INFO = ("token_entropy",)
"""Per-token lists the rollout keeps in Trajectory.info that have their own column."""


@dataclass
class StageResults:
    """The credit and update stages' results for the record, by trajectory id."""
    turn_advantages: dict[str, list[float]] = field(default_factory=dict)
    """Per-turn advantages (GiGPO); a trajectory without has its advantage on every turn."""
    token_values: dict[str, dict[str, list]] = field(default_factory=dict)
    """``TOKEN_VALUE_COLUMNS`` per token, None where the token is untrained."""
    grad_norms: dict[str, float] = field(default_factory=dict)
    turn_signals: list[dict] = field(default_factory=list)
    """``turn_signals`` rows (traj_id, turn, name, value, source), e.g. core/credit/info_gain.py's."""

    def add_credit(self, trajs: Sequence[Trajectory], turn_advantages: Sequence) -> None:
        """Credit's per-turn advantages of ``trajs`` (``Credit.turn_advantages``, in order)."""
        self.turn_advantages.update({t.traj_id: list(a) for t, a in zip(trajs, turn_advantages)
                                     if a is not None})

    def add_update(self, samples: Sequence, grad_norms: Mapping[str, float]) -> None:
        """The updated samples' per-token values (core/learn/update.py ``Sample``) and the update's
        per-trajectory gradient norms (``UpdateResult.grad_norms``)."""
        for s in samples:
            mask = s.mask[0].tolist()

            def col(x):
                return None if x is None else [float(v) if m else None
                                               for v, m in zip(x[0].tolist(), mask)]
            self.token_values[s.traj.traj_id] = {
                "advantage": col(s.advantages), "new_logprob": col(s.new_logprobs),
                "ref_logprob": col(s.ref_logprobs), "value": col(s.values),
                "train_logprob": col(s.train_logprobs)}
        self.grad_norms.update(grad_norms)

    def merge(self, other: "StageResults") -> "StageResults":
        return StageResults({**self.turn_advantages, **other.turn_advantages},
                            {**self.token_values, **other.token_values},
                            {**self.grad_norms, **other.grad_norms},
                            self.turn_signals + other.turn_signals)


def trajectory_rows(trajs: Sequence[Trajectory], grad_norms: Mapping[str, float] | None = None,
                    ) -> dict[str, list]:
    grad_norms = grad_norms or {}
    cols: dict[str, list] = defaultdict(list)
    for t in trajs:
        cols["traj_id"].append(t.traj_id)
        cols["group_id"].append(t.group_id)
        cols["task_id"].append(t.task.task_id)
        cols["reward"].append(float(t.reward))
        cols["advantage"].append(float(t.advantage))
        cols["success"].append(success_of(t))
        cols["num_turns"].append(t.num_turns)
        cols["finish_reason"].append(t.finish_reason)
        cols["split"].append(t.split)
        cols["prompt"].append(t.task.prompt)
        cols["answer"].append(t.answer)
        cols["golds"].append(list(t.task.golds))
        cols["failure_class"].append(t.failure_class)
        cols["filtered"].append(bool(t.filtered))
        cols["grad_norm"].append(grad_norms.get(t.traj_id))
        cols["response_tokens"].append(t.response_tokens)
        cols["info"].append({k: v for k, v in t.info.items() if k not in _PRIVATE_INFO})
    return dict(cols)


def reward_rows(trajs: Sequence[Trajectory]) -> dict[str, list]:
    cols: dict[str, list] = defaultdict(list)
    for t in trajs:
        # the four fixed components, then any dense one measured for it (info_gain)
        for name in list(COMPONENTS) + [k for k in t.rewards if k not in COMPONENTS]:
            cols["traj_id"].append(t.traj_id)
            cols["component"].append(name)
            cols["value"].append(float(t.rewards.get(name, 0.0)))
    return dict(cols)


def turn_rows(trajs: Sequence[Trajectory],
              turn_advantages: Mapping[str, Sequence[float]] | None = None) -> dict[str, list]:
    turn_advantages = turn_advantages or {}
    cols: dict[str, list] = defaultdict(list)
    for t in trajs:
        turn_adv = turn_advantages.get(t.traj_id)
        for turn in t.turns:
            cols["traj_id"].append(t.traj_id)
            cols["turn"].append(turn.turn)
            cols["action"].append(turn.action)
            cols["observation"].append(turn.observation)
            cols["action_valid"].append(bool(turn.valid))
            cols["action_type"].append(turn.action_type)
            cols["parsed"].append(turn.parsed)
            cols["obs_truncated"].append(bool(turn.obs_truncated))
            cols["action_truncated"].append(bool(turn.action_truncated))
            cols["latency_s"].append(float(turn.latency_s))
            cols["error"].append(turn.error)
            cols["state_diff"].append(turn.state_diff)
            cols["advantage"].append(float(turn_adv[turn.turn]) if turn_adv is not None
                                     and turn.turn < len(turn_adv) else float(t.advantage))
            cols["step_reward"].append(None if turn.env_failed
                                       else float(turn.step_reward))
            cols["state_key"].append(turn.state_key)
            cols["info"].append(turn.info or None)
    return dict(cols)


def token_rows(trajs: Sequence[Trajectory],
               token_values: Mapping[str, Mapping[str, Sequence[float | None]]] | None = None,
               ) -> dict[str, list]:
    """One row per context token; ``''.join(text ordered by pos)`` is the context the model saw."""
    token_values = token_values or {}
    cols: dict[str, list] = defaultdict(list)
    for t in trajs:
        n = len(t.token_ids)
        extra = token_values.get(t.traj_id, {})
        entropy = t.info.get("token_entropy") or [None] * n
        cols["traj_id"].extend([t.traj_id] * n)
        cols["pos"].extend(range(n))
        cols["token_id"].extend(t.token_ids)
        cols["text"].extend(t.token_text)
        cols["role"].extend(t.roles)
        # The loss mask as the optimiser applied it: held-out evaluations and trajectories
        # filtered out of the update (StarPO-S, LOOP's |A| filter) trained nothing.
        applied = not t.filtered and t.split != "eval"
        cols["trained"].extend([m and applied for m in t.trained])
        cols["logprob"].extend(t.logprobs)
        cols["turn"].extend(t.token_turn)
        cols["entropy"].extend(list(entropy) + [None] * (n - len(entropy)))
        for name in TOKEN_VALUE_COLUMNS:
            values = extra.get(name)
            cols[name].extend(list(values) if values is not None else [None] * n)
    return dict(cols)


def test_rows(trajs: Sequence[Trajectory]) -> dict[str, list]:
    cols: dict[str, list] = defaultdict(list)
    for t in trajs:
        for name, passed, detail in (t.outcome.tests if t.outcome is not None else []):
            cols["traj_id"].append(t.traj_id)
            cols["name"].append(name)
            cols["passed"].append(bool(passed))
            cols["detail"].append(detail)
    return dict(cols)


def render_rows(trajs: Sequence[Trajectory]) -> dict[str, list]:
    """The episodes' own pictures (``Trajectory.renders``), one row per kept picture."""
    cols: dict[str, list] = defaultdict(list)
    for t in trajs:
        for r in t.renders:
            cols["traj_id"].append(t.traj_id)
            cols["turn"].append(int(r["turn"]))
            cols["kind"].append(r["kind"])
            cols["body"].append(r["body"])
    return dict(cols)


def step_tables(trajs: Sequence[Trajectory], results: StageResults | None = None,
                ) -> dict[str, dict[str, list]]:
    """Every per-trajectory table of one step, ready for ``Recorder.record_step``: the
    trajectories as the rollout and rewards left them, with the stages' ``results``."""
    results = results or StageResults()
    return {"trajectories": trajectory_rows(trajs, results.grad_norms),
            "rewards": reward_rows(trajs),
            "turns": turn_rows(trajs, results.turn_advantages),
            "tokens": token_rows(trajs, results.token_values),
            "test_results": test_rows(trajs),
            "renders": render_rows(trajs),
            "turn_signals": _signal_columns(results.turn_signals)}


def _signal_columns(rows: Sequence[dict]) -> dict[str, list]:
    names = ("traj_id", "turn", "name", "value", "source")
    return {n: [r[n] for r in rows] for n in names} if rows else {}
