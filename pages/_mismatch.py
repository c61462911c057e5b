"""Dynamics' training-inference mismatch panel: at one step, the distribution of
|lp_train - lp_sampler| over the trained tokens (TRL issue 6789's table) and the trajectories
carrying the most, each one click from Replay at its worst token's turn (core/learn/mismatch.py)."""
from __future__ import annotations

import streamlit as st

from pages import _common as c
from storage import queries


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def load(store: str, run_id: str, version: str, step: int):
    return (queries.mismatch_distribution(store, run_id, step),
            queries.mismatch_ranking(store, run_id, step))


NONFINITE = "mismatch/nonfinite_tokens"


def measured_steps(wide):
    """Steps with a mismatch: a finite one (``mismatch/abs_mean``) or trained tokens whose
    logprob or trainer's logprob was not finite, counted (``mismatch/nonfinite_tokens``)."""
    steps = set(wide["mismatch/abs_mean"].dropna().index) if "mismatch/abs_mean" in wide else set()
    if NONFINITE in wide:
        steps |= set(wide[NONFINITE][wide[NONFINITE] > 0].index)
    return sorted(int(s) for s in steps)


def nonfinite_note(wide) -> str | None:
    """A sentence on the trained tokens left out of the mismatch curves for a logprob that is
    not finite (NaN, +-inf): how many, at how many steps. None when there are none."""
    if NONFINITE not in wide:
        return None
    counts = wide[NONFINITE].fillna(0)
    if not (counts > 0).any():
        return None
    steps = [int(s) for s in counts[counts > 0].index]
    where = ", ".join(map(str, steps[:8])) + (" ..." if len(steps) > 8 else "")
    return (f"{int(counts.sum()):,} trained tokens had a logprob (the sampler's or the "
            f"trainer's) that is not finite, at {len(steps)} step(s) ({where}): they are left "
            f"out of these curves and counted in {NONFINITE}.")


def dynamics_panel(pick: c.Pick, wide) -> None:
    steps = measured_steps(wide)
    if not steps:
        return  # runs recorded before the trainer's logprob was, and imports without it
    st.subheader("Training-inference mismatch")
    default = pick.step if pick.step in steps else steps[-1]
    step = c.url_select("Step", steps, key="mismatch_step", param="mismatch_step",
                        default=default, cast=int, format_func=str)
    table, ranked = c.read_or_stop(load, pick.store, pick.run_id, pick.version, step)
    if table.empty:
        st.info(f"Step {step} recorded no token with both logprobs.")
        return
    st.caption("|d| = |lp_train - lp_sampler| over the step's trained tokens whose d is finite; "
               "out of band: the share whose ratio exp(d) lies outside [0.9, 1.1]; nonfinite: "
               "the tokens left out, a logprob or the trainer's being NaN or infinite.")
    left_out = int(table["nonfinite"].iloc[0])
    if left_out:
        st.warning(f"Step {step}: {left_out:,} trained token(s) with a logprob that is not "
                   f"finite, left out of the figures (the trajectories holding them are listed "
                   "first below).")
    st.dataframe(table, key="mismatch_table", hide_index=True)
    ranked = ranked.assign(replay=[c.replay_url(pick, step, t) + "&colour=mismatch"
                                   + (f"&turn={int(k)}" if k == k and k >= 0 else "")
                                   for t, k in zip(ranked["traj_id"], ranked["turn"])])
    st.markdown("**The trajectories and tokens carrying the most mismatch**")
    st.dataframe(ranked, key="mismatch_ranked", hide_index=True,
                 column_order=["replay", "traj_id", "nonfinite", "max_abs", "pos", "turn", "d",
                               "mean_abs", "out_of_band", "tokens"],
                 column_config={"replay": st.column_config.LinkColumn("replay",
                                                                      display_text="open")})
    st.caption("Open opens Replay with the tokens coloured by mismatch, at the turn of the token "
               "with the largest |d| (pos), or of the first token left out (nonfinite).")
