"""Dynamics' training-inference mismatch panel: at one step, the distribution of
|lp_train - lp_sampler| over the trained tokens (TRL issue 6789's table) and the trajectories
carrying the most, each one click from Replay at its worst token's turn (core/learn/mismatch.py)."""
from __future__ import annotations

import streamlit as st

from pages import _common as c
from storage import queries


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def load(store: str, run_id: str, last_step: int, step: int):
    return (queries.mismatch_distribution(store, run_id, step),
            queries.mismatch_ranking(store, run_id, step))


def dynamics_panel(pick: c.Pick, wide) -> None:
    if "mismatch/abs_mean" not in wide.columns:
        return  # runs recorded before the trainer's logprob was, and imports without it
    st.subheader("Training-inference mismatch")
    steps = [int(s) for s in wide["mismatch/abs_mean"].dropna().index]
    default = pick.step if pick.step in steps else steps[-1]
    step = c.url_select("Step", steps, key="mismatch_step", param="mismatch_step",
                        default=default, cast=int, format_func=str)
    table, ranked = c.read_or_stop(load, pick.store, pick.run_id, pick.last_step, step)
    if table.empty:
        st.info(f"Step {step} recorded no token with both logprobs.")
        return
    st.caption("|d| = |lp_train - lp_sampler| over the step's trained tokens; out of band: the "
               "share whose ratio exp(d) lies outside [0.9, 1.1].")
    st.dataframe(table, key="mismatch_table", hide_index=True)
    ranked = ranked.assign(replay=[c.replay_url(pick, step, t) + "&colour=mismatch"
                                   + (f"&turn={int(k)}" if k == k and k >= 0 else "")
                                   for t, k in zip(ranked["traj_id"], ranked["turn"])])
    st.markdown("**The trajectories and tokens carrying the most mismatch**")
    st.dataframe(ranked, key="mismatch_ranked", hide_index=True,
                 column_order=["replay", "traj_id", "max_abs", "pos", "turn", "d", "mean_abs",
                               "out_of_band", "tokens"],
                 column_config={"replay": st.column_config.LinkColumn("replay",
                                                                      display_text="open")})
    st.caption("Open opens Replay with the tokens coloured by mismatch, at the turn of the token "
               "with the largest |d| (pos).")
