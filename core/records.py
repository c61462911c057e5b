"""Trajectories -> rows of the store's tables (trajectories, rewards, turns, tokens, test_results).

Rows come out as column dicts (one list per column), the cheapest shape for one bulk insert per
table per step. Per-token training values that only exist after the update (advantage, the new
and reference logprobs, the value estimate) are passed in ``token_values`` by trajectory id.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Mapping, Sequence

from core.diagnostics import COMPONENTS, success_of
from core.trajectory import Trajectory

TOKEN_VALUE_COLUMNS = ("advantage", "new_logprob", "ref_logprob", "value")
_PRIVATE_INFO = ("token_entropy", "turn_advantages", "returns")
"""Per-token / per-turn lists kept in Trajectory.info that have their own tables."""


def trajectory_rows(trajs: Sequence[Trajectory]) -> dict[str, list]:
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
        cols["grad_norm"].append(t.info.get("grad_norm"))
        cols["response_tokens"].append(t.response_tokens)
        cols["info"].append({k: v for k, v in t.info.items()
                             if k not in _PRIVATE_INFO and k != "grad_norm"})
    return dict(cols)


def reward_rows(trajs: Sequence[Trajectory]) -> dict[str, list]:
    cols: dict[str, list] = defaultdict(list)
    for t in trajs:
        for name in COMPONENTS:
            cols["traj_id"].append(t.traj_id)
            cols["component"].append(name)
            cols["value"].append(float(t.rewards.get(name, 0.0)))
    return dict(cols)


def turn_rows(trajs: Sequence[Trajectory]) -> dict[str, list]:
    cols: dict[str, list] = defaultdict(list)
    for t in trajs:
        turn_adv = t.info.get("turn_advantages")
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
            cols["step_reward"].append(float(turn.step_reward))
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


def step_tables(trajs: Sequence[Trajectory], token_values=None) -> dict[str, dict[str, list]]:
    """Every per-trajectory table of one step, ready for ``Recorder.record_step``."""
    return {"trajectories": trajectory_rows(trajs), "rewards": reward_rows(trajs),
            "turns": turn_rows(trajs), "tokens": token_rows(trajs, token_values),
            "test_results": test_rows(trajs)}
