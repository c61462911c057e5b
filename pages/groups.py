"""Groups: all rollouts of one task at one step side by side, with the credit each one got."""
from __future__ import annotations

import streamlit as st

from pages import _common as c
from pages import _terms
from pages import _branches, _credit, _grid
from storage import queries


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def _load_gains(store: str, run_id: str, traj_ids: tuple[str, ...]):
    """The group's stored information gains (traj_id, turn, value); empty when none was measured."""
    return queries.turn_signals(store, run_id, list(traj_ids), names=["info_gain"])


c.ensure_app()
pick = c.picked()
_terms.title("Groups", "groups")
if pick.step is None:
    c.stop("This run recorded no trajectories (metrics only): no groups to compare.")
groups = c.read_or_stop(c.load_groups, pick.store, pick.run_id, pick.version, pick.step)
if groups.empty:
    c.stop(f"Step {pick.step} recorded no groups.")

functions = c.trl_reward_functions(pick.store, pick.run_id)
if functions:
    # TRL logs each step's completions as a table (prompt, completion, each reward function)
    with st.expander(f"Every completion of step {pick.step}, as TRL logs them", expanded=True):
        everyone = c.load_trajectories(pick.store, pick.run_id, pick.version, pick.step)
        said = c.load_turns(pick.store, pick.run_id, tuple(everyone["traj_id"]))
        completion = said.groupby("traj_id")["action"].agg(
            lambda parts: "\n".join(str(p) for p in parts if p is not None))
        table = everyone.set_index("traj_id")[["group_id", "prompt"]].assign(
            completion=completion).join(c.reward_components(pick.store, pick.run_id,
                                                            everyone["traj_id"].tolist()))
        table = table.assign(reward=everyone.set_index("traj_id")["reward"],
                             advantage=everyone.set_index("traj_id")["advantage"])
        st.dataframe(table, key="groups_completions", column_config={
            "prompt": st.column_config.TextColumn("prompt", width="medium"),
            "completion": st.column_config.TextColumn("completion", width="large")})

info = groups.set_index("group_id")
group_id = c.url_select("Group (one task, its G rollouts)", groups["group_id"].tolist(),
                        key="group", param="group", format_func=str)
g = info.loc[group_id]
st.caption(f"task {c.safe_label(g['task_id'])} · {int(g['size'])} rollouts · "
           f"{int(g['successes'])} solved · reward mean {g['reward_mean']:.3f}, "
           f"std {g['reward_std']:.3f}")
summary = groups.assign(zero_variance=groups["reward_std"] == 0)
with st.expander(f"All {len(groups)} groups of step {pick.step}"):
    st.dataframe(summary, key="groups_all", hide_index=True)
if g["reward_std"] == 0:
    st.warning("Zero reward variance: every rollout got the same reward, so GRPO, Dr.GRPO and RLOO "
               "give all of them advantage 0 and this group teaches the policy nothing.")
if g["filtered"]:
    st.info("Filtered out by StarPO-S (or |A| too small): recorded, but dropped from the update.")

trajs = c.load_trajectories(pick.store, pick.run_id, pick.version, pick.step, group_id)
ids = trajs["traj_id"].tolist()
turns = c.load_turns(pick.store, pick.run_id, tuple(ids))

# -- actions per turn, aligned ---------------------------------------------------------------------
st.subheader("Actions per turn")
diverge = _credit.divergence_turn(turns, ids)
st.caption("Rollouts first diverge at turn " + (str(diverge) if diverge is not None else
                                                  "- (never: all took the same actions)"))
if turns.empty:
    st.info("These trajectories recorded no turns.")
else:
    # state_key: the state each turn acted from (GiGPO's anchor); NULL in older runs
    keyed = "state_key" in turns and turns["state_key"].notna().any()
    field = st.radio("Show", ["action", "observation"] + (["state_key"] if keyed else []),
                     key="groups_field", horizontal=True)
    # a row per rollout, a column per turn, wrapped: every rollout of the group is on screen
    # (a column per rollout made the grid ~4,000 px wide at G = 8)
    st.html(_grid.grid_html(_grid.turn_grid(turns, ids, field), mark=f"turn {diverge}"))

# -- credit ----------------------------------------------------------------------------------------
st.subheader("Credit: stored advantage vs. what each estimator would give")
table = _credit.outcome_table(trajs)
comps = c.reward_components(pick.store, pick.run_id, ids)
table = table.join(comps, how="left")
table["success"] = trajs.set_index("traj_id")["success"]
table["filtered"] = trajs.set_index("traj_id")["filtered"]
table["replay"] = [c.replay_url(pick, pick.step, t) for t in table.index]
st.dataframe(table, key="groups_credit", column_config={
    "replay": st.column_config.LinkColumn("replay", display_text="open"),
    "reward": st.column_config.NumberColumn("reward", help=_terms.help_for("reward")),
    "stored advantage": st.column_config.NumberColumn("stored advantage",
                                                      help=_terms.help_for("advantage"))})
imported = c.text_of(pick.run.get("source")) not in (None, "trainer")
st.caption("Stored advantage, from training: " + "; ".join(_credit.convention(pick.config, imported))
           + ". The other columns are computed here from the stored rewards with the trainer's "
           "own estimators: GRPO: (r - mean)/(std + 1e-6) · Dr.GRPO: r - mean · RLOO: r - mean "
           "of the others. An all-equal group gets 0 from each.")
if not _credit.finite_rewards(trajs):
    st.warning("A reward of this group is not finite (inf or NaN): its mean and std are not "
               "numbers, so no estimator gives it an advantage (TRL trains such a group on 0).")

if not turns.empty and _credit.finite_rewards(trajs):
    cfg = pick.config
    gamma, weight = float(cfg.get("gigpo_gamma", 0.95)), float(cfg.get("gigpo_weight", 1.0))
    norm = str(cfg.get("gigpo_norm", "std"))  # runs recorded before the field: std, then the only
    # runs recorded before gigpo_episode_stats existed took one entry per trajectory
    stats = str(cfg.get("gigpo_episode_stats", "trajectories"))
    steps = _credit.gigpo_steps(trajs, turns, gamma=gamma, weight=weight, norm=norm,
                                episode_stats=stats)
    st.markdown(f"**GiGPO step level** (γ = {gamma:g}, w = {weight:g}, normalisation {norm}: "
                + ("divided by the group's std, verl-agent's mean_std_norm" if norm == "std" else
                   "centred only, verl-agent's mean_norm")
                + (", this run's" if cfg.get("algo") == "gigpo" else ", as this run's config "
                   "would give")
                + "): turns that acted from the same state share an anchor and are compared with "
                "each other, whatever turn they reached it at (the env's state key; the "
                "observation in runs without one).")
    stored_adv = turns[["traj_id", "turn", "advantage"]].rename(
        columns={"advantage": "stored turn advantage"})
    stored = stored_adv.join(turns[["state_key"]]) if "state_key" in turns else stored_adv
    steps = steps.merge(stored, on=["traj_id", "turn"], how="left")
    shared = steps.groupby("anchor")["traj_id"].transform("size")
    st.dataframe(steps.assign(anchor_size=shared), key="groups_gigpo", hide_index=True)

    gains = _load_gains(pick.store, pick.run_id, tuple(ids))
    if not gains.empty:
        gain_weight = float(cfg.get("w_info_gain") or 1.0)
        st.markdown(f"**IGPO** (information gain x {gain_weight:g}), as its released trainer computes "
                    "it from this group's stored gains: gains and outcomes z-scored apart over "
                    "the group (population std), the outcome the last turn's reward, each turn "
                    "credited with its discounted return; γ = 1 is IGPO's scripts, γ = 0 each "
                    "turn's own reward. "
                    + ("This run trained on this form (γ = "
                       f"{float(cfg.get('info_gain_gamma', 1.0)):g})." if "info_gain_type" in cfg else
                       "Computed here: this run did not train on it (its stored advantage is "
                       "named above)."))
        table = _credit.igpo_table(trajs, gains, gain_weight).merge(
            stored_adv, on=["traj_id", "turn"], how="left")
        st.dataframe(table, key="groups_igpo", hide_index=True)

_branches.group_panel(pick, ids)

with st.expander("Open a rollout in Replay"):
    for tid in ids:
        c.replay_link(pick, pick.step, tid)
