"""Information gain (IGPO, core/credit/info_gain.py) on the pages: Replay's answer probability and gain
along one trajectory's turns, Dynamics' mean gain per turn index.

The trainer measures, before each turn's action, the policy's teacher-forced probability of the
gold answer (the geometric mean of its tokens' probabilities); a turn's gain is how much that
probability rose over the turn. Data come from ``turn_signals`` through storage/queries.py; runs
recorded before it was measured, evaluation trajectories and envs without gold answers have
none, and the panels say so.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from pages import _common as c
from storage import queries

NOT_YET = ("Information gain not computed yet for this {what}: it is measured while training "
           "on envs with gold answers (search), for training trajectories, in runs recorded "
           "since it was added.")


CREDIT_SIGNALS = {"progress": "SPA contribution", "q": "MC Q label", "prm": "PRM score"}
"""The other per-turn credit signals training records (core/credit/progress.py, core/credit/prm.py)."""


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def load_signals(store: str, run_id: str, traj_id: str) -> pd.DataFrame:
    return queries.turn_signals(store, run_id, [traj_id],
                                names=["answer_prob", "info_gain", *CREDIT_SIGNALS])


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def load_by_turn(store: str, run_id: str, version: str, name: str = "info_gain") -> pd.DataFrame:
    return queries.signal_by_turn(store, run_id, name)


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def load_names(store: str, run_id: str, version: str) -> list[str]:
    return queries.signal_names(store, run_id)


def per_turn(signals: pd.DataFrame, turns: pd.DataFrame) -> pd.DataFrame:
    """One row per turn: its action type, the answer probability before and after it and its
    gain (the last turn has none: its reward is the outcome)."""
    wide = signals.pivot_table(index="turn", columns="name", values="value", aggfunc="first")
    prob = wide["answer_prob"] if "answer_prob" in wide else pd.Series(dtype=float)
    gain = wide["info_gain"] if "info_gain" in wide else pd.Series(dtype=float)
    rows = []
    for t in turns.sort_values("turn").to_dict("records"):
        k = int(t["turn"])
        rows.append({"turn": k, "action": c.safe_label(c.text_of(t.get("action_type")) or ""),
                     "p before": prob.get(k - 1), "p after": prob.get(k),
                     "info gain": gain.get(k)})
    return pd.DataFrame(rows)


NEVER = ("**Information gain**: not available for a run recorded by {source}. It is measured "
         "by this trainer while it trains (it needs the policy and the gold answer), so an "
         "import never has it.")


NOT_RECORDED = ("**Information gain**: not recorded in this run, which has ended. The trainer "
                "measures it while training on envs with gold answers (search, apps), with "
                "record_info_gain on, in runs recorded since it was added; a grid or bandit run "
                "never has it.")
ENDED = ("finished", "stopped", "failed")


def never_measured(pick, names: list[str] | None = None) -> str | None:
    """Why a run can never have information gain (None: it can): only this trainer measures it,
    and only while it trains, so an ended run of its with no signal recorded (``names``, the
    run's turn-signal names, empty) will not get any."""
    source = c.text_of(pick.run.get("source"))
    if source not in (None, "trainer"):
        return NEVER.format(source=c.safe_label(source))
    if names is not None and not names and c.text_of(pick.run.get("status")) in ENDED:
        return NOT_RECORDED
    return None


def replay_panel(pick, traj_id: str, turns: pd.DataFrame) -> None:
    """Replay: the trajectory's answer probability along its turns and each turn's gain."""
    everything = c.read_or_stop(load_signals, pick.store, pick.run_id, traj_id)
    if everything.empty:
        names = c.read_or_stop(load_names, pick.store, pick.run_id, pick.version)
        if never_measured(pick, names):  # one line, not an empty panel
            st.caption(never_measured(pick, names))
            return
    st.subheader("Information gain")
    # training's signals only: branch-from-turn analyses record their own q (core/jobs/branch.py)
    everything = everything[everything["source"] == "train"]
    other = everything[everything["name"].isin(list(CREDIT_SIGNALS))]
    signals = everything[~everything["name"].isin(list(CREDIT_SIGNALS))]
    if not other.empty:
        wide = (other.pivot_table(index="turn", columns="name", values="value", aggfunc="first")
                .rename(columns=CREDIT_SIGNALS).reset_index())
        st.markdown("**Turn credit from SPA / the process reward model** (each turn's value: "
                    "SPA's contributions entered the advantage as their return-to-go, the PRM's "
                    "scores centred within the task group; runs recorded before those forms "
                    "centred both; Groups names the run's form)")
        st.dataframe(wide, key="replay_turn_credit", hide_index=True)
    if signals.empty:
        st.info(NOT_YET.format(what="trajectory"))
        return
    table = per_turn(signals, turns)
    probs = signals[signals["name"] == "answer_prob"].sort_values("turn")
    gains = table.dropna(subset=["info gain"])
    fig = go.Figure([
        go.Bar(x=gains["turn"], y=gains["info gain"], name="info gain (turn)"),
        go.Scatter(x=probs["turn"] + 1, y=probs["value"], mode="lines+markers",
                   name="p(gold) before the turn", yaxis="y2")])
    fig.update_layout(height=280, margin={"l": 50, "r": 50, "t": 10, "b": 40},
                      xaxis={"title": "turn", "dtick": 1},
                      yaxis={"title": "gain"},
                      yaxis2={"title": "p(gold)", "overlaying": "y", "side": "right",
                              "rangemode": "tozero"},
                      legend={"orientation": "h", "y": -0.25})
    st.plotly_chart(fig, key="replay_info_gain")
    # tiny probabilities (an untrained model's 2e-5) would read as 0.00002 / -0.0000004
    st.dataframe(table, key="replay_info_gain_table", hide_index=True, column_config={
        name: st.column_config.NumberColumn(format="%.4g")
        for name in ("p before", "p after", "info gain")})
    st.caption("p(gold): the policy's teacher-forced probability of the gold answer (geometric "
               "mean over its tokens) from the context it acted from; a turn's gain is p after "
               "it minus p before it. The last turn has no gain: its reward is the outcome.")


def dynamics_panel(pick) -> None:
    """Dynamics: mean information gain per turn index, over the run and step by step (and the
    same for SPA's contributions or the PRM's scores when the run recorded them)."""
    names = c.read_or_stop(load_names, pick.store, pick.run_id, pick.version)
    if not names and never_measured(pick, names):  # one line, not an empty panel
        st.caption(never_measured(pick, names))
        return
    st.subheader("Information gain per turn")
    if "info_gain" not in names:
        st.info(NOT_YET.format(what="run"))
    else:
        by_turn_charts(pick, "info_gain", "gain")
        st.caption("Gain of a turn: how much it raised the policy's probability of the gold "
                   "answer (training trajectories; the final turn has none). A search turn that "
                   "finds the evidence should gain; one that does not, not.")
    other = [n for n in CREDIT_SIGNALS if n in names]
    if other:
        name = st.selectbox("Other per-turn credit recorded in this run", other,
                            format_func=CREDIT_SIGNALS.get, key="dyn_turn_signal")
        by_turn_charts(pick, name, CREDIT_SIGNALS[name])


def by_turn_charts(pick, name: str, label: str) -> None:
    """Mean of ``name`` by turn index over the whole run, and per step one line per turn index."""
    by_turn = c.read_or_stop(load_by_turn, pick.store, pick.run_id, pick.version, name)
    overall = (by_turn.assign(total=by_turn["mean"] * by_turn["n"]).groupby("turn")
               .agg(total=("total", "sum"), n=("n", "sum")))
    overall["mean"] = overall["total"] / overall["n"]
    left, right = st.columns(2)
    with left:
        fig = go.Figure([go.Bar(x=overall.index, y=overall["mean"], name=f"mean {label}",
                                customdata=overall["n"],
                                hovertemplate="turn %{x}: %{y:.4g} (n=%{customdata})")])
        fig.update_layout(height=300, margin={"l": 50, "r": 10, "t": 30, "b": 40},
                          title=f"Mean {label} by turn index (whole run)",
                          xaxis={"title": "turn", "dtick": 1}, yaxis={"title": label})
        st.plotly_chart(fig, key=f"dyn_{name}_turn")
    with right:
        fig = go.Figure([go.Scatter(x=part["step"], y=part["mean"], mode="lines+markers",
                                    name=f"turn {int(k)}")
                         for k, part in by_turn.groupby("turn")])
        fig.update_layout(height=300, margin={"l": 50, "r": 10, "t": 30, "b": 40},
                          title=f"Mean {label} per step, one line per turn index",
                          xaxis={"title": "step"}, yaxis={"title": label},
                          legend={"orientation": "h", "y": -0.25})
        st.plotly_chart(fig, key=f"dyn_{name}_steps")
