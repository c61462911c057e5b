"""One step's trajectories -> rows of the store's tables (trajectories, rewards, turns, tokens,
test_results, renders, turn_signals), for ``Recorder.record_step`` (storage/recorder.py).

Rows come out as column dicts (one list per column), the cheapest shape for one bulk insert per
table per step. What the stages after the rollout computed comes with them in a
``StageResults`` (core/run/stage_results.py).
"""
from __future__ import annotations

import json
from collections import defaultdict
from typing import Mapping, Sequence

from core.rollout.diagnostics import COMPONENTS, success_of
from core.rollout.trajectory import Trajectory
from core.run.stage_results import TOKEN_VALUE_COLUMNS, StageResults
from storage.recorder import JSON_COLUMNS, clean_column, clean_json

_PRIVATE_INFO = ("token_entropy",)
"""Per-token lists the rollout keeps in Trajectory.info that have their own column."""


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
    tables = {"trajectories": trajectory_rows(trajs, results.grad_norms),
              "rewards": reward_rows(trajs),
              "turns": turn_rows(trajs, results.turn_advantages),
              "tokens": token_rows(trajs, results.token_values),
              "test_results": test_rows(trajs),
              "renders": render_rows(trajs),
              "turn_signals": _signal_columns(results.turn_signals)}
    return {name: clean_columns(name, cols) for name, cols in tables.items()}


def clean_columns(table: str, cols: dict[str, list]) -> dict[str, list]:
    """``cols`` under the recorder's rule for text (storage/recorder.py: a lone surrogate becomes
    U+FFFD, NUL U+2400), applied here, before any consumer of the step's rows: the behaviours
    step builds DataFrames from them before the recorder sees them, and a lone surrogate in an
    action's error text (``raise ValueError(chr(55296))``) failed that and the run with it.
    JSON columns keep their structure (the behaviours read ``parsed`` as a mapping)."""
    json_names = JSON_COLUMNS.get(table, ())
    out = {}
    for name, values in cols.items():
        if name in json_names:
            out[name] = [v if v is None or _clean_json_text(v) else clean_json(v) for v in values]
        else:
            cleaned = clean_column(values)
            out[name] = values if cleaned is values else list(cleaned)
    return out


def _clean_json_text(value) -> bool:
    """Whether every string inside ``value`` is already storable text (one C-speed dump: most
    cells are, and walking each in Python cost more than the behaviours step itself)."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
        text.encode("utf-8")
    except (ValueError, TypeError, RecursionError):  # UnicodeEncodeError is a ValueError
        return False
    return "\x00" not in text and "\\u0000" not in text


def _signal_columns(rows: Sequence[dict]) -> dict[str, list]:
    names = ("traj_id", "turn", "name", "value", "source")
    return {n: [r[n] for r in rows] for n in names} if rows else {}
