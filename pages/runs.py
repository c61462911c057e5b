"""Runs: every run of every store with status, key metrics and sparklines; overlay and diff runs."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from pages import _common as c
from pages import _terms
from pages import _runlist
from storage import queries

c.ensure_app()
SPARK_METRICS = ("reward/mean", "success/rate")


# Keyed on the runs' last steps and last writes (``moved``): a live run's entries change as it
# writes (an OTLP or followed import at step 0 too), a finished run's are read once (they
# expired after 5 s before, so nearly every visit re-read every run).
@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def series(store: str, run_ids: tuple[str, ...], moved: tuple[str, ...],
           names: tuple[str, ...]) -> pd.DataFrame:
    return queries.metric_series(store, list(run_ids), list(names))


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def metric_names(store: str, run_id: str, moved: str) -> list[str]:
    return queries.metric_names(store, run_id)


def moved(run: dict) -> str:
    """What changes when a run of the run list writes: its last step and last write."""
    return f"{c.int_of(run.get('last_step'), -1)}:{run.get('updated_at')}"


SPARK_POINTS = 100


def spark(values: np.ndarray, points: int = SPARK_POINTS) -> list[float]:
    """A sparkline's values: a long run's series as the means of ``points`` equal runs of
    steps. The table formats every value it is given (3,125 steps x 4 sparklines took ~0.7 s of
    browser time on the bench store) and a small column shows ~100 anyway."""
    if len(values) <= points:
        return values.tolist()
    return [float(np.nanmean(part)) if np.isfinite(part).any() else float("nan")
            for part in np.array_split(values, points)]


def run_frame(table: pd.DataFrame) -> pd.DataFrame:
    """The runs table with config columns, last metric values and sparkline lists."""
    rows = []
    for store, part in table.groupby("store", sort=False):
        long = series(store, tuple(part["run_id"]), tuple(map(moved, part.to_dict("records"))),
                      SPARK_METRICS)
        for run in part.to_dict("records"):
            cfg = queries.run_config(run["config"])
            row = {"run": f"{run['name']}", "status": run["shown_status"],
                   "env": cfg.get("env"), "model": cfg.get("model"), "algo": c.algo_label(cfg),
                   "source": run.get("source"), "last step": run["last_step"],
                   "created": run["created_at"], "store": store, "run_id": run["run_id"],
                   "moved": moved(run)}
            for name in SPARK_METRICS:
                vals = long[(long["run_id"] == run["run_id"]) & (long["name"] == name)]["value"]
                row[name] = spark(vals.to_numpy(dtype=float))
                row[f"last {name}"] = vals.iloc[-1] if len(vals) else None
            rows.append(row)
    return pd.DataFrame(rows)


_terms.title("Runs", "runs")
table = c.run_table()
for bad in table[table["run_id"].isna()].to_dict("records") if not table.empty else []:
    st.warning("A store could not be read:")
    st.code(str(bad.get("error")), language=None)
table = table[table["run_id"].notna()] if not table.empty else table
if table.empty:
    c.stop("No runs yet. Every DuckDB store under " + ", ".join(queries.store_dirs())
           + " is listed here; start a run on the Train page or with `agentrl train`.")

frame = run_frame(table)
experiments = {(r["store"], r["run_id"]): _runlist.experiment_of(
    r["name"], r["run_id"], queries.run_config(r["config"])) for r in table.to_dict("records")}
frame["experiment"] = [experiments[key] for key in zip(frame["store"], frame["run_id"])]
# One folding section per store, the sidebar's run's open (every one when there are few); in
# it a table per experiment (cross-evaluations last). The tables are HTML that fits the window:
# a 27-run store no longer crowds the top, and long names wrap instead of being cut.
picked = st.session_state.get("pick_run")
grouped = _runlist.groups(frame)
for store, experiments in grouped:
    n = sum(len(rows) for _, rows in experiments)
    envs = sorted({str(e) for _, rows in experiments for e in rows["env"].dropna()})
    label = (f"{c.safe_label(store, 80)} · {n} run{'s' * (n != 1)}"
             + (f" · {c.safe_label(', '.join(envs), 60)}" if envs else ""))
    open_ = len(grouped) <= 2 or (picked is not None and picked[0] == store)
    with st.expander(label, expanded=open_):
        for experiment, rows in experiments:
            if len(experiments) > 1:
                st.markdown(f"**{c.safe_label(experiment)}** · {len(rows)} run"
                            f"{'s' * (len(rows) != 1)}")
            st.html(_runlist.table_html(rows, picked))
st.caption("Stores fold open and shut; a run's name opens it on Dynamics. A 'running' run whose "
           f"trainer has not written for {queries.STALE_AFTER_S // 60} minutes is shown as "
           "'interrupted'.")
if "bandit" in set(frame["env"].dropna().astype(str)):  # the workshop demo: reward 0.15, success 1
    st.caption("Bandit runs: " + _terms.reward_beside_success({"env": "bandit"}))

st.subheader("Compare runs")
labels = {i: f"{r['run']} ({r['run_id']})" for i, r in frame.iterrows()}
in_sidebar = [i for i, r in frame.iterrows()
              if (r["store"], r["run_id"]) == st.session_state.get("pick_run")]
chosen = st.multiselect("Runs to overlay", list(labels), format_func=labels.get,
                        key="runs_compare", default=in_sidebar or list(labels)[:1])
if not chosen:
    c.stop("Pick one or more runs to overlay their curves and compare their configs.")
picked = frame.loc[chosen]
last_of = picked["moved"].to_dict()
names = sorted({n for i, r in picked.iterrows()
                for n in metric_names(r.store, r.run_id, last_of[i])})
if names:
    metric = st.selectbox("Metric", names, key="runs_metric",
                          index=names.index("reward/mean") if "reward/mean" in names else 0)
    fig = go.Figure()
    for i, r in picked.iterrows():
        long = series(r.store, (r.run_id,), (last_of[i],), (metric,))
        fig.add_trace(go.Scatter(x=long["step"], y=long["value"],
                                 mode="lines+markers" if len(long) <= 300 else "lines",
                                 name=c.plot_text(labels[i])))
    fig.update_layout(title=c.plot_text(metric), xaxis_title="step", height=360)
    st.plotly_chart(fig, key="runs_overlay")
else:
    st.info("The chosen runs recorded no metrics.")

configs = {labels[i]: queries.run_config(table.set_index(["store", "run_id"]).loc[
    (frame.at[i, "store"], frame.at[i, "run_id"]), "config"]) for i in chosen}
if len(configs) == 1:
    st.markdown("**Config**")
    st.json(next(iter(configs.values())), expanded=False)
else:
    keys = sorted(set().union(*configs.values()))
    diff = pd.DataFrame({name: [json.dumps(cfg.get(k), default=str) for k in keys]
                         for name, cfg in configs.items()}, index=keys)
    differing = diff[diff.nunique(axis=1) > 1]
    st.markdown("**Config keys that differ**")
    if differing.empty:
        st.success("The chosen runs have identical configs.")
    else:
        st.dataframe(differing, key="runs_diff")
