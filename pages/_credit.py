"""Advantages the other estimators *would* have given one group, from its stored rewards.

The estimators are the trainer's own (core/algorithms/estimators.py: NumPy, torch-free), not a copy; the
page passes one group, so every row shares one group id:

    grpo     A_i = (r_i - mean) / (std + 1e-6), std unbiased         all-equal group -> 0
    dr_grpo  A_i = r_i - mean                                         all-equal group -> 0
    rloo     A_k = r_k - (sum_j r_j - r_k) / (K - 1)                  K < 2 or all equal -> 0
    gigpo    step level: turns acting from an identical observation (the previous turn's
             observation; the prompt for turn 0) form an anchor group; G_t = r_t + gamma G_{t+1};
             A_step = (G_t - mean_anchor) / (std_anchor + 1e-6); singleton or all-equal -> 0.
             A_turn = A_episode + w * A_step, A_episode = (R_i - mean) / (std + 1e-6) over
             one entry per turn (gigpo_episode_stats "steps", verl-agent's default) or per
             trajectory ("trajectories", the paper's; runs recorded before the key). With the
             run's gigpo_norm "none" (verl-agent's mean_norm) both are only centred.

    igpo     the group's stored information gains g_{i,k} (turns 0..T_i-2) and outcomes R_i,
             each z-scored over the group with the population std; turn rewards w*zg, the last
             turn's zo; A_{i,k} = r_{i,k} + gamma A_{i,k+1} (IGPO's released trainer).

``convention`` says which convention produced the stored advantages the page shows beside them.

Step rewards r_t are the turns' ``step_reward``; the trajectory's reward not accounted for by
them (the outcome, for sparse-reward environments) is added to its last turn, so sum_t r_t is the
trajectory's reward.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

# the registry and the trainer's own credit math (core/algorithms/), through the one core
# package pages import
from core.config import REGISTRY, estimators


def _one_group(name: str):
    def run(rewards) -> np.ndarray:
        r = np.asarray(rewards, dtype=float)
        return getattr(estimators, name)(r, [0] * len(r))
    run.__doc__ = f"core.algorithms.estimators.{name} of one group of rewards."
    return run


grpo = _one_group("grpo")
dr_grpo = _one_group("dr_grpo")
rloo = _one_group("rloo")


def outcome_table(trajs: pd.DataFrame) -> pd.DataFrame:
    """One group's trajectories with the stored advantage and each estimator's, by traj_id. A
    group holding a reward that is not finite (a TRL run's inf reward) has no estimator value:
    those columns are NaN, as the group's mean and std are (``finite_rewards`` says so)."""
    r = trajs["reward"].fillna(0.0).to_numpy(dtype=float)
    estimates = ({"GRPO": grpo(r), "Dr.GRPO": dr_grpo(r), "RLOO": rloo(r)} if finite_rewards(trajs)
                 else {name: np.full(len(r), np.nan) for name in ("GRPO", "Dr.GRPO", "RLOO")})
    return pd.DataFrame({"reward": r, "stored advantage": trajs["advantage"].to_numpy(),
                         **estimates}, index=pd.Index(trajs["traj_id"], name="traj_id"))


def finite_rewards(trajs: pd.DataFrame) -> bool:
    """Whether every reward of the group is finite (NULL counts as 0, as the estimators read it)."""
    return bool(np.isfinite(trajs["reward"].fillna(0.0).to_numpy(dtype=float)).all())


def _anchor(text) -> str:
    return hashlib.sha1(str(text if text is not None else "").encode("utf-8")).hexdigest()


def step_rewards(turns: pd.DataFrame, reward: float) -> list[float]:
    """Per-turn rewards of one trajectory; the unaccounted part of ``reward`` goes to the last."""
    if "step_reward" in turns:
        rs = turns["step_reward"].fillna(0.0).astype(float).tolist()
    else:
        rs = [0.0] * len(turns)
    if rs:
        rs[-1] += float(reward) - sum(rs)
    return rs


def gigpo_steps(trajs: pd.DataFrame, turns: pd.DataFrame, gamma: float = 0.95,
                weight: float = 1.0, norm: str = "std",
                episode_stats: str = "trajectories") -> pd.DataFrame:
    """Per (traj_id, turn): anchor, return G_t, A_step and A_turn = A_episode + weight * A_step,
    both normalised as the run's ``gigpo_norm`` (std: std-scaled; none: centred only,
    verl-agent's mean_norm), the episode term over the run's ``gigpo_episode_stats``."""
    n_turns = turns.groupby("traj_id")["turn"].count() if not turns.empty else pd.Series(dtype=int)
    rewards = trajs["reward"].fillna(0.0).tolist()
    episode = dict(zip(trajs["traj_id"], estimators.gigpo_episode_advantages(
        rewards, [int(n_turns.get(t, 0)) for t in trajs["traj_id"]], [0] * len(rewards),
        cross_steps=episode_stats == "steps", normalize="std" if norm == "std" else "mean")))
    prompts = trajs["prompt"] if "prompt" in trajs else [None] * len(trajs)
    prompt = dict(zip(trajs["traj_id"], prompts))
    rows = []
    for tid, reward in zip(trajs["traj_id"], trajs["reward"].fillna(0.0)):
        mine = turns[turns["traj_id"] == tid].sort_values("turn")
        rs = step_rewards(mine, reward)
        g, returns = 0.0, [0.0] * len(rs)
        for t in range(len(rs) - 1, -1, -1):
            g = rs[t] + gamma * g
            returns[t] = g
        seen = [prompt.get(tid)] + mine["observation"].tolist()[:-1]
        # the env's state key when recorded (core/credit/assign.py anchor_keys), else the observation
        keys = mine["state_key"].tolist() if "state_key" in mine else [None] * len(mine)
        for t, obs_before, key, ret, r in zip(mine["turn"], seen, keys, returns, rs):
            state = "state:" + key if isinstance(key, str) else obs_before
            rows.append({"traj_id": tid, "turn": int(t), "anchor": _anchor(state)[:8],
                         "return": ret, "reward": r})
    out = pd.DataFrame(rows, columns=["traj_id", "turn", "anchor", "return", "reward"])
    # the trainer's step advantages (core/algorithms/estimators.py), over this one group's turns
    per_traj = [mine for _, mine in out.groupby("traj_id", sort=False)]
    steps = estimators.gigpo_step_advantages([m["reward"].tolist() for m in per_traj],
                                             [m["anchor"].tolist() for m in per_traj],
                                             [0] * len(per_traj), gamma=gamma,
                                             normalize="std" if norm == "std" else "mean")
    out["A_step"] = pd.Series([a for m, st in zip(per_traj, steps) for a in st],
                              index=[i for m in per_traj for i in m.index], dtype=float)
    out = out.drop(columns="reward")
    out["A_episode"] = out["traj_id"].map(episode)
    out["A_turn"] = out["A_episode"] + weight * out["A_step"]
    return out


def divergence_turn(turns: pd.DataFrame, traj_ids: list[str]) -> int | None:
    """First turn at which the rollouts' actions differ (or some rollout has ended); None when
    every rollout took exactly the same actions."""
    by = {tid: turns[turns["traj_id"] == tid].sort_values("turn")["action"].tolist()
          for tid in traj_ids}
    longest = max((len(a) for a in by.values()), default=0)
    for t in range(longest):
        actions = {tuple(a[t:t + 1]) for a in by.values()}
        if len(actions) > 1:
            return t
    return None


def convention(config: dict | None, imported: bool = False) -> list[str]:
    """What produced a run's stored advantages, one line per part, read from its recorded config:
    the algorithm (core/algorithms/catalog.py: its summary and source) and each turn credit added
    to it, in the form the run used. A run recorded before a form existed lacks that form's
    config key (info_gain_type, prm_gamma, gigpo_norm), so its older convention is named."""
    config = config or {}
    if imported:
        return ["as the source trainer recorded them (not recomputed here)"]
    name = str(config.get("algo") or "grpo")
    algo = REGISTRY.algorithms.get(name)
    lines = [f"{name}: {algo.summary} ({algo.source})" if algo else name]
    if name == "gigpo":
        norm = config.get("gigpo_norm", "std")
        lines.append(f"GiGPO normalisation {norm} ("
                     + ("mean_std_norm: divided by the group's std" if norm == "std" else
                        "mean_norm: centred only") + ", verl-agent's names)")
        stats = config.get("gigpo_episode_stats", "trajectories")
        lines.append(f"GiGPO episode term over {stats} ("
                     + ("one entry per turn, verl-agent's compute_mean_std_cross_steps"
                        if stats == "steps" else "one entry per trajectory, the paper's Eq. 3")
                     + ")")
    lines += _turn_credit_lines(config)
    if float(config.get("min_abs_advantage") or 0) > 0:
        lines.append(f"LOOP's filter: rollouts with every |A| < {config['min_abs_advantage']:g} "
                     "dropped" + (", one kept per rank" if "prm_gamma" in config else ""))
    return lines


def _turn_credit_lines(config: dict) -> list[str]:
    """The turn credits a run's config switched on, each in the convention it was recorded with."""
    lines = []
    if float(config.get("w_info_gain") or 0) > 0:
        lines.append(f"information gain x {config['w_info_gain']:g}: "
                     + ("IGPO's turn returns (gains and outcome z-scored apart, "
                        f"gamma {config.get('info_gain_gamma', 1.0):g}, "
                        f"{config['info_gain_type']}), replacing the algorithm's"
                        if "info_gain_type" in config else
                        "z-scored gains added to the algorithm's (the form before IGPO's)"))
    if float(config.get("w_spa") or 0) > 0:
        lines.append(f"SPA x {config['w_spa']:g}: "
                     + ("each turn's return-to-go of the progress contributions less the group's "
                        "mean at that turn (PPO: through GAE)" if "prm_gamma" in config else
                        "each turn's contribution less the group's mean over all turns (the form "
                        "before the return-to-go)"))
    if float(config.get("w_prm") or 0) > 0:
        lines.append(f"PRM x {config['w_prm']:g}: the head's score centred in the group; labels "
                     + (f"keyed on state with history and parsed action, gamma "
                        f"{config['prm_gamma']:g}" if "prm_gamma" in config else
                        "keyed on state and action text, the plain mean outcome (the form before "
                        "AgentPRM's)"))
    return lines


IGPO_GAMMAS = (1.0, 0.0)
"""IGPO's released scripts accumulate with gamma 1; gamma 0 leaves each turn its own reward."""


def igpo_table(trajs: pd.DataFrame, gains: pd.DataFrame, weight: float = 1.0) -> pd.DataFrame:
    """One group's turn advantages as IGPO's released trainer computes them
    (``estimators.igpo_turn_advantages``) from its stored gains (turn_signals ``info_gain``:
    traj_id, turn, value) and rewards, for each gamma of ``IGPO_GAMMAS``; a row per turn
    (traj_id, turn, gain, one "A, γ = ..." column per gamma). A gain not recorded (NaN) gets no
    gain reward, as IGPO's code does; the last turn has no gain (its reward is the outcome)."""
    by = {(str(r.traj_id), int(r.turn)): float(r.value) for r in gains.itertuples()}
    rows, lists = [], []
    for t in trajs.itertuples():
        n = int(t.num_turns or 0)
        g = [by.get((str(t.traj_id), k), float("nan")) for k in range(max(n - 1, 0))]
        lists.append(g)
        rows += [{"traj_id": t.traj_id, "turn": k, "gain": g[k] if k < len(g) else None}
                 for k in range(n)]
    out = pd.DataFrame(rows, columns=["traj_id", "turn", "gain"])
    rewards = trajs["reward"].fillna(0.0).astype(float).tolist()
    for gamma in IGPO_GAMMAS:
        adv, _ = estimators.igpo_turn_advantages(lists, rewards, [0] * len(lists), gamma,
                                                 gain_weight=weight)
        out[f"A, γ = {gamma:g}"] = [a for row, t in zip(adv, trajs.itertuples())
                                    for a in row[:int(t.num_turns or 0)]]
    return out

