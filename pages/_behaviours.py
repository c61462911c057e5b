"""Dynamics' behaviours panel: per step, how common each behaviour was, the covariance of the
advantage with it (what the update paid for), the shallow-strategy alarms, and the trajectories
behind a step's covariance, each one click from Replay (storage/behaviours/, docs/behaviours.md).
"""
from __future__ import annotations

import shlex
from pathlib import Path

import pandas as pd
import plotly
import plotly.graph_objects as go
from plotly.subplots import make_subplots
import streamlit as st

from pages import _common as c
from storage import queries

SHOWN_ALARMS = 5
MARKERS_UP_TO = 300  # longer series as lines only: each marker is an SVG element (dynamics.py)


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def contributors(store: str, run_id: str, version: str, step: int, name: str, n: int = 5):
    return queries.behaviour_contributors(store, run_id, step, name, n)


def behaviours_command(store: str, run_id: str, committed: bool) -> str:
    """The shell command that computes a run's behaviours, its arguments quoted; for a store
    committed under sample_runs/, on a copy under runs/ (the job writes into the store it is
    given, and a committed sample store stays as it was recorded)."""
    if not committed:
        return f"agentrl behaviours --db {shlex.quote(store)} --run {shlex.quote(run_id)}"
    copy = str(Path(queries.STORE_DIRS[1]) / Path(store).name)
    return (f"mkdir -p {queries.STORE_DIRS[1]} && cp -n {shlex.quote(store)} {shlex.quote(copy)}\n"
            f"agentrl behaviours --db {shlex.quote(copy)} --run {shlex.quote(run_id)}")


def recorded(wide: pd.DataFrame) -> list[str]:
    """Behaviour names with a rate curve in this run."""
    return sorted(n.split("/")[1] for n in wide.columns
                  if n.startswith("behaviour/") and n.endswith("/rate"))


def alarm_list(wide: pd.DataFrame) -> list[tuple[int, str]]:
    """(step, behaviour) of every alarm/behaviour/<name> = 1 in the run, by step."""
    out = [(int(s), n.split("/", 2)[2]) for n in wide.columns if n.startswith("alarm/behaviour/")
           for s in wide.index[wide[n].fillna(0) > 0]]
    return sorted(out)


REWARD = ["reward/mean", "reward/std", "reward/group_std_mean"]
COLOURS = plotly.colors.qualitative.Plotly + plotly.colors.qualitative.D3


def chart(wide: pd.DataFrame, picked: list[str], marks: list[tuple[int, str]]) -> None:
    """One figure on one step axis: the picked behaviours' rates (alarms as red crosses) over
    their Cov(A, b), each behaviour one colour in both, then reward beside its variance where
    recorded. One chart, not three: each plotly chart costs the browser a layout of its own,
    and Dynamics already draws many."""
    reward = [n for n in REWARD if n in wide.columns]
    titles = ["Rate (mean over the step)", "Cov(A, b): > 0 was reinforced"]
    titles += ["Reward and its variance"] if reward else []
    fig = make_subplots(rows=len(titles), cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=titles)

    def line(n: str, row: int, **style) -> None:
        s = wide[n].dropna()
        fig.add_trace(go.Scatter(x=s.index, y=s.values, mode="lines+markers"
                                 if len(s) <= MARKERS_UP_TO else "lines", **style), row=row, col=1)

    for i, name in enumerate(picked):
        colour = COLOURS[i % len(COLOURS)]
        for row, metric in ((1, "rate"), (2, "adv_cov")):
            if f"behaviour/{name}/{metric}" in wide.columns:
                line(f"behaviour/{name}/{metric}", row, line={"color": colour},
                     legendgroup=name, showlegend=row == 1,
                     name=c.plot_text(f"behaviour/{name}/rate, adv_cov"),
                     hovertemplate=c.plot_text(f"behaviour/{name}/{metric}")
                     + " %{y:.3g} at step %{x}<extra></extra>")
    for n in reward:
        line(n, 3, name=c.plot_text(n), line={"dash": "dot"})
    alarmed = [(step, name) for step, name in marks if name in picked]
    if alarmed:
        fig.add_trace(go.Scatter(
            x=[s for s, _ in alarmed],
            y=[wide.loc[s, f"behaviour/{n}/rate"] for s, n in alarmed], mode="markers",
            marker={"symbol": "x", "size": 12, "color": "red"}, name="shallow-strategy alarm",
            text=[c.plot_text(n) for _, n in alarmed],
            hovertemplate="alarm: %{text} at step %{x}<extra></extra>"), row=1, col=1)
    fig.update_layout(height=260 * len(titles), margin={"t": 40, "b": 10, "l": 60, "r": 20},
                      legend={"orientation": "h", "y": -0.12, "yanchor": "top"})
    fig.update_xaxes(title_text="step", row=len(titles), col=1)
    st.plotly_chart(fig, key="beh_chart")


def dynamics_panel(pick: c.Pick, wide: pd.DataFrame) -> None:
    names = recorded(wide)
    st.subheader("Behaviours: what the update paid for")
    if not names:
        committed = Path(pick.store).parent.name == queries.STORE_DIRS[0]
        st.caption("No behaviours computed for this run (the trainer records them at each "
                   "step). " + ("This store is a committed sample run: these commands compute "
                                "them on a copy under runs/, which the app lists too."
                                if committed else "This command computes them into its store:"))
        st.code(behaviours_command(pick.store, pick.run_id, committed), language="bash")
        return
    alarms = alarm_list(wide)
    for step, name in alarms[:SHOWN_ALARMS]:
        st.warning(f"Shallow-strategy alarm at step {step}: **{c.safe_label(name, 80)}** "
                   "reinforced (Cov(A, b) > 0, p < 0.05) for consecutive steps while its rate "
                   "rose.")
        top = contributors(pick.store, pick.run_id, pick.version, step, name, 1)
        if len(top):
            c.replay_link(pick, step, top["traj_id"].iloc[0],
                          label=f"Replay {top['traj_id'].iloc[0]} (top contributor)",
                          key=f"beh_alarm_{step}_{name}")
    if len(alarms) > SHOWN_ALARMS:
        st.caption(f"{len(alarms) - SHOWN_ALARMS:,} more alarms: pick their step and behaviour "
                   "below.")
    shares = [n for n in names if wide[f"behaviour/{n}/rate"].max() <= 1.0]
    alarmed = [n for _, n in alarms]
    picked = st.multiselect("Behaviours", names, default=sorted(set(shares) | set(alarmed)),
                            key="beh_pick", help="Shares in [0, 1] are picked first; tokens, "
                            "turns, tool calls and query entropy have their own scales.")
    chart(wide, picked, alarms)
    st.caption("Cov(A, b) over the step's training trajectories is, to first order, the "
               "direction the policy-gradient step moved the behaviour's frequency "
               "(docs/behaviours.md says when it misleads). A is the advantage the loss "
               "applied: the mean over a trajectory's trained tokens (per-turn credit such as "
               "GiGPO's or IGPO's included), not the stored episode advantage. An alarm: a "
               "behaviour of the shallow list reinforced for k steps in a row (one-sided "
               "t-test, p < 0.05) while "
               "its rate rose.")
    steps = sorted(int(s) for s in wide[f"behaviour/{names[0]}/rate"].dropna().index)
    default_step, default_name = alarms[0] if alarms else (steps[-1] if steps else 0, names[0])
    one, two = st.columns(2)
    name = one.selectbox("Behaviour", names, index=names.index(default_name), key="beh_name")
    step = two.selectbox("Step", steps, index=steps.index(default_step)
                         if default_step in steps else 0, key="beh_step")
    ranked = contributors(pick.store, pick.run_id, pick.version, step, name, 10)
    if ranked.empty:
        st.info(f"Step {step}: no trajectory with both {name} and an advantage.")
        return
    ranked = ranked.assign(replay=[c.replay_url(pick, step, t) for t in ranked["traj_id"]])
    st.dataframe(ranked, key="beh_ranked", hide_index=True,
                 column_order=["replay", "traj_id", "value", "advantage", "reward",
                               "contribution"],
                 column_config={"replay": st.column_config.LinkColumn("replay",
                                                                      display_text="open")})
    st.caption("Contribution = (A - mean A)(b - mean b): the trajectories that pushed the "
               "covariance up the most, first; equal contributions (a group's rollouts with one "
               "reward share one advantage) by traj_id.")
