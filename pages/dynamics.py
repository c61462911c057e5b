"""Dynamics: the run's curves, gradient spikes linked to their trajectories, collapse alarms."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from pages import _common as c
from pages import _terms
from pages import _behaviours, _info_gain, _mismatch, _params, _signals
from storage import queries

c.ensure_app()


# Cached per (store, run, version): a finished run is read and scanned once, a live one once per
# change of its data (pages/_common.py), and a rerun (a click, a widget) reads nothing.
@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def spike_table(store: str, run_id: str, version: str) -> pd.DataFrame:
    """The spike detector over the whole run (a Python loop over its steps)."""
    return _signals.spike_threshold(c.load_metrics(store, run_id, version)["grad/norm"])


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def step_gradients(store: str, run_id: str, version: str, step: int
                   ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(top trajectories by gradient norm, per-module norms) of one step, in one store open."""
    return queries.step_gradients(store, run_id, step)


pick = c.picked()
_terms.title("Dynamics", "dynamics")
wide = c.read_or_stop(c.load_metrics, pick.store, pick.run_id, pick.version)
if wide.empty:
    c.stop("This run recorded no metrics yet.")
alarms = sorted(_signals.collapse_alarms(wide, single_turn=_signals.single_turn(pick.config))
                + _signals.mismatch_alarms(wide), key=lambda a: a["step"])
SHOWN_ALARMS = 5  # listed one by one; a signal that flickers can start thousands of alarms
ALARM_LINES = {"std+entropy": ("red", "dot"), "repeats": ("darkorange", "dash"),  # kind: style
               "mismatch": ("purple", "dashdot")}
for a in alarms[:SHOWN_ALARMS]:
    what = "Mismatch alarm" if a["kind"] == "mismatch" else "Collapse alarm"
    st.warning(f"{what} at step {a['step']} ({a['kind']}): {a['message']}.")
if len(alarms) > SHOWN_ALARMS:
    with st.expander(f"{len(alarms) - SHOWN_ALARMS:,} more collapse alarms"):
        st.dataframe(pd.DataFrame(alarms[SHOWN_ALARMS:]), hide_index=True)


# Longer series are drawn as lines only: the browser draws each marker as an SVG element of its
# own, and 12 charts x 3,125 markers took seconds to render on the 100k bench store. (A comment:
# a string here would be drawn on the page by Streamlit's magic.)
MARKERS_UP_TO = 300


def line_mode(points: int) -> str:
    return "lines+markers" if points <= MARKERS_UP_TO else "lines"


ALARM_LINES_DRAWN = 60


def spaced(steps: list[int], span: float, most: int = ALARM_LINES_DRAWN) -> list[int]:
    """The alarm steps worth a line: each gap in a line trace is an SVG path of its own, and the
    bench run's 1,155 alarms made ~1,150 paths per chart (seconds of browser time). A line
    closer than ``span / most`` steps to the previous drawn one would share its pixels anyway;
    every alarm stays listed above the charts."""
    kept: list[int] = []
    for s in sorted(steps):
        if not kept or s - kept[-1] >= span / most:
            kept.append(s)
    return kept


# Every step-axis chart ends at the run's last step, and starts where its own data starts: a
# run's SFT steps (1..50) before its RL steps (51..80) left the reward chart's first half empty
# when all charts started at the run's first step.
FIRST, LAST = int(wide.index.min()), int(wide.index.max())


def x_range(first: int, last: int) -> list[float]:
    """[first - pad, last + pad], pad = max(0.5, 2% of the span): bars at the ends stay whole."""
    pad = max(0.5, 0.02 * (last - first))
    return [first - pad, last + pad]


def framed(fig: go.Figure, title: str | None, height: int = 300, first: int = FIRST) -> go.Figure:
    """The layout every step-axis chart shares: x from ``first`` (its data's first step) to the
    run's last, fixed side margins (so plot areas in a column are equally wide), the legend in
    rows under the plot (a legend on the right took up to a third of a half-width chart, and its
    long names ran into the edge), and a dashed line at the sidebar's step."""
    fig.update_layout(title=title, height=height, margin={"t": 40 if title else 20, "b": 10,
                                                          "l": 60, "r": 20},
                      showlegend=True,  # also for one trace: the metric's name, as stored
                      legend={"orientation": "h", "x": 0, "xanchor": "left", "y": -0.25,
                              "yanchor": "top"})
    fig.update_xaxes(title_text="step", range=x_range(first, LAST), autorange=False)
    if pick.step is not None:
        fig.add_vline(x=pick.step, line={"color": "grey", "dash": "dash", "width": 1})
    return fig


def chart(names: list[str], title: str, key: str, band: tuple[str, str] | None = None,
          note: str | None = None) -> None:
    """Lines for the ``names`` this run recorded; alarms drawn as vertical lines; ``note`` as a
    caption under the chart."""
    present = [n for n in names if n in wide.columns]
    if not present:
        st.caption(f"{title}: not recorded in this run ({', '.join(names)}).")
        return
    st.plotly_chart(figure(pick.store, pick.run_id, pick.version, pick.step, tuple(present),
                           title, band), key=key)
    if note:
        st.caption(note)


# Built once per (store, run, version, step, curves): building a plotly figure (its property
# validation, the alarm lines, the layout) was about half of a warm rerun's server time, and a
# click or a widget change reruns the page with the same figures. The same object is served to
# every session: st.plotly_chart only reads it (it serialises a copy).
@st.cache_resource(ttl=c.LIVE_TTL_S, max_entries=4 * c.MAX_ENTRIES, show_spinner=False)
def figure(store: str, run_id: str, version: str, step: int | None, present: tuple[str, ...],
           title: str, band: tuple[str, str] | None) -> go.Figure:
    """The chart of the recorded metrics ``present`` of the page's run (``wide``, ``alarms``:
    what the key's store, run and version give), framed at ``step``."""
    fig = go.Figure()
    if band and set(band) <= set(wide.columns):
        mean, std = wide[band[0]], wide[band[1]]
        fig.add_trace(go.Scatter(x=list(wide.index) + list(wide.index[::-1]),
                                 y=list(mean + std) + list((mean - std)[::-1]), fill="toself",
                                 line={"width": 0}, opacity=0.2, name=f"{band[0]} ± {band[1]}"))
    for n in present:
        s = wide[n].dropna()
        fig.add_trace(go.Scatter(x=s.index, y=s.values, mode=line_mode(len(s)),
                                 name=c.plot_text(n)))
    if alarms:
        # One trace of vertical segments: a shape per alarm (add_vline) costs O(shapes) each,
        # which took minutes on a long run whose signal flickers.
        values = pd.Series(wide[list(present)].to_numpy(dtype=float).ravel())
        lo, hi = float(values.min()), float(values.max())
        span = float(wide.index.max() - wide.index.min())
        for kind in dict.fromkeys(a["kind"] for a in alarms):  # one labelled trace per kind
            steps = spaced([a["step"] for a in alarms if a["kind"] == kind], span)
            colour, dash = ALARM_LINES.get(kind, ("grey", "dot"))
            fig.add_trace(go.Scatter(
                x=[v for s in steps for v in (s, s, None)],
                y=[v for _ in steps for v in (lo, hi, None)], mode="lines",
                name=f"{kind} alarm", line={"dash": dash, "color": colour, "width": 1},
                hovertemplate=f"{kind} alarm at step %{{x}}<extra></extra>"))
    first = int(min(wide[n].first_valid_index() for n in present))
    return framed(fig, title, first=first)


if pick.step is not None:
    st.caption(f"The grey dashed line on each chart marks step {pick.step}, the step picked in "
               "the sidebar (the one Replay and Groups show).")
imported = c.text_of(pick.run.get("source")) not in (None, "trainer")
# The curves in order of interest. A full page load's browser time grows with each plotly chart
# (bench/pages.py --walkthrough: about 40 ms of browser CPU per chart; 12-17 charts made Dynamics
# the slowest walkthrough page at load 4), so the first paint draws the core curves, those of a
# trainer that logs others (TRL: W&B's default panels), every curve an alarm points at and the
# mismatch curves of a run whose sampler and trainer disagree; the rest wait behind "All curves"
# (a link parameter, curves=all) when there are more than six.
trl = (pick.config or {}).get("trainer") == "trl.GRPOTrainer"
# sampled and trained apart: some token's ratio left [0.9, 1.1] (an fp32 run's stays at zero)
out_of_band = wide.get("mismatch/ratio_out_frac", pd.Series(dtype=float))
mismatched = bool((out_of_band.fillna(0) > 0).any())
nonfinite = _mismatch.nonfinite_note(wide)  # tokens left out of the curves for a NaN/inf logprob
reward_functions = sorted(n for n in wide.columns
                          if n.startswith("trl/rewards/") and n.endswith("/mean"))
CURVES = [
    dict(names=["reward/mean"], title="Reward (mean ± std)", key="dyn_reward",
         band=("reward/mean", "reward/std")),
    dict(names=reward_functions, title="Mean reward per reward function", key="dyn_trl_rewards",
         core=trl),
    dict(names=["reward/group_std_mean", "reward/frac_zero_std"],
         title="In-group reward std, zero-std groups", key="dyn_groupstd"),
    dict(names=["success/rate", "eval/success", "success/pass@G", "success/pass@g"],
         title="Success", key="dyn_success", core=not trl),  # a TRL run has no success signal
    dict(names=["policy/kl", "policy/approx_kl"], key="dyn_kl",
         title="KL (to the reference; approx. to the sampler)",
         note=_signals.kl_reference_note(pick.config, imported=imported)),
    dict(names=["policy/loss"], title="Loss", key="dyn_trl_loss", core=trl),
    dict(names=["optim/lr"], title="Learning rate", key="dyn_trl_lr", core=trl),
    dict(names=["policy/entropy"], title="Entropy", key="dyn_entropy", alarm="std+entropy"),
    dict(names=["response/length_mean"], title="Response length (tokens)", key="dyn_length",
         core=trl),
    dict(names=["policy/clipfrac", "policy/clipfrac_low", "policy/clipfrac_high"],
         title="Clip fraction", key="dyn_clip"),
    dict(names=["collapse/repeat_frac", "collapse/repeat_fail_frac"],
         title="Repeated action sequences (all; failed only)", key="dyn_repeat", alarm="repeats"),
    dict(names=["env/turns_mean", "env/valid_action_ratio"], title="Turns and valid actions",
         key="dyn_turns"),
    dict(names=["sft/loss", "value/loss"], title="SFT and value loss", key="dyn_losses"),
    dict(names=["update/delta_rms"], title="Step size: RMS weight change per update",
         key="dyn_delta",
         note="A fresh AdamW's first step moves every weight by the learning rate; a step far "
              "below the lr means the updates barely move the policy."
              + (f" This run's RL lr: {pick.config['lr']:g}."
                 if isinstance((pick.config or {}).get("lr"), (int, float)) else "")),
    dict(names=["update/delta_rel"], title="Step size relative to the adapter's norm",
         key="dyn_delta_rel"),
    dict(names=["time/step_s"], title="Step time (s)", key="dyn_trl_time", core=trl),
    dict(names=["mismatch/abs_mean", "mismatch/abs_p95"], key="dyn_mismatch",
         title="Training-inference mismatch |lp_train - lp_sampler|", alarm="mismatch",
         core=mismatched or bool(nonfinite),
         note="The trainer's own logprob of each trained token against the sampler's, under "
              "the same weights, before the update: both should agree."
              + (f" {nonfinite}" if nonfinite else "")),
    dict(names=["mismatch/ratio_out_frac", "mismatch/kl_k3"], key="dyn_mismatch_ratio",
         title="Ratio outside [0.9, 1.1]; k3 KL(sampler || trainer)", alarm="mismatch",
         core=mismatched),
    dict(names=["training/rollout_probs_diff_mean", "training/rollout_probs_diff_max",
                "training/rollout_probs_diff_std"], key="dyn_mismatch_verl",
         title="verl's names: |p_train - p_sampler| in probability space", alarm="mismatch",
         core=mismatched, note="The same comparison as verl's training/rollout_probs_diff_*, "
         "so the numbers read as on a verl dashboard."),
    dict(names=["training/rollout_actor_probs_pearson_corr"], key="dyn_mismatch_pearson",
         title="verl's Pearson r of p_train and p_sampler (1 = they agree)", alarm="mismatch",
         core=mismatched),
    dict(names=[_mismatch.NONFINITE], key="dyn_mismatch_nonfinite",
         title="Trained tokens left out of the mismatch (a logprob not finite)",
         alarm="mismatch", core=bool(nonfinite)),
]
CORE = {"dyn_reward", "dyn_groupstd", "dyn_success", "dyn_kl"}
alarmed = {a["kind"] for a in alarms}
recorded = [spec for spec in CURVES if any(n in wide.columns for n in spec["names"])]
unrecorded = [spec for spec in CURVES if spec not in recorded and spec["names"]
              and not spec["key"].startswith(("dyn_trl", "dyn_mismatch_nonfinite",
                                              "dyn_mismatch_verl", "dyn_mismatch_pearson"))]
FIRST_PAINT = 6  # charts: a run with few curves shows them all at once
first = [spec for spec in recorded if len(recorded) <= FIRST_PAINT
         or spec.get("core", spec["key"] in CORE) or spec.get("alarm") in alarmed]
later = [spec for spec in recorded if spec not in first]
c.adopt_url("curves", "dyn_all", cast={"all": True, "core": False}.__getitem__)
_params.refuse("curves", what="the curves toggle")
show_all = st.toggle(f"All curves ({len(later)} more)" if later else "All curves", key="dyn_all",
                     disabled=not later,
                     help="The first view draws the core curves and any an alarm points at; "
                          "this adds every other curve the run recorded.")
c.publish_url("curves", "all" if show_all else "core")
if later and not show_all:
    st.caption("Also recorded: " + "; ".join(spec["title"] for spec in later) + ".")
shown = first + (later if show_all else [])
# Row by row, not column by column: a caption under one chart keeps its neighbour level with it.
for i in range(0, len(shown), 2):
    for column, spec in zip(st.columns(2), shown[i:i + 2]):
        with column:
            chart(**{k: v for k, v in spec.items() if k not in ("alarm", "core")})


def unrecorded_text(spec: dict) -> str:
    if nonfinite and spec["key"] in ("dyn_mismatch", "dyn_mismatch_ratio"):  # measured, but no
        return f"{spec['title']}: no trained token whose logprobs are both finite ({nonfinite})"
    return f"{spec['title']}: not recorded ({', '.join(spec['names'])})"


if unrecorded:
    st.caption("Not recorded in this run: " + "; ".join(map(unrecorded_text, unrecorded)) + ".")
timings = [n for n in wide.columns if n.startswith("time/") and n != "time/step_s"]
if timings and show_all:
    fig = go.Figure([go.Bar(x=wide.index, y=wide[n], name=c.plot_text(n)) for n in timings])
    fig.update_layout(barmode="stack")
    st.plotly_chart(framed(fig, "Phase timings (s)"), key="dyn_timings")
others = st.multiselect("Any other recorded metric", sorted(wide.columns), key="dyn_more")
if others:
    chart(others, "Chosen metrics", "dyn_more_chart")

# -- information gain (IGPO) -----------------------------------------------------------------------
_info_gain.dynamics_panel(pick)

# -- the process reward model's Monte-Carlo labels (AgentPRM, core/credit/prm.py) --------------------
if {"prm/rollouts_per_label", "prm/single_rollout_frac"} & set(wide.columns):
    st.subheader("PRM labels: how many rollouts each pools")
    for column, spec in zip(st.columns(2), [
            dict(names=["prm/rollouts_per_label"], title="Rollouts per label (mean)",
                 key="dyn_prm_pool"),
            dict(names=["prm/single_rollout_frac"], title="Labels from a single rollout",
                 key="dyn_prm_single")]):
        with column:
            chart(**spec)
    st.caption("Mean rollouts per label: a turn's Q label is the mean discounted outcome of the "
               "group's rollouts that took the same parsed action from the same state after the "
               "same history (AgentPRM). A label from a single rollout is that rollout's outcome "
               "alone: the larger that share, the noisier the targets the PRM head regresses.")

# -- training-inference mismatch -------------------------------------------------------------------
_mismatch.dynamics_panel(pick, wide)

# -- behaviours and what the advantage paid for (storage/behaviours/) -----------------------------
_behaviours.dynamics_panel(pick, wide)

# -- gradient spikes -------------------------------------------------------------------------------
st.subheader("Gradient norm and spikes")
if "grad/norm" not in wide.columns:
    c.stop("No gradient norms recorded in this run (imported runs carry none).")
sp = spike_table(pick.store, pick.run_id, pick.version)
spikes = [int(s) for s in sp.index[sp["spike"]]]


@st.cache_resource(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def grad_figure(store: str, run_id: str, version: str, step: int | None) -> go.Figure:
    """The gradient norm, its rolling median, the spike threshold and the spikes (cached as
    ``figure``)."""
    fig = go.Figure([
        go.Scatter(x=sp.index, y=sp["value"], mode=line_mode(len(sp)), name="grad/norm"),
        go.Scatter(x=sp.index, y=sp["median"], mode="lines", name="rolling median",
                   line={"dash": "dash"}),
        go.Scatter(x=sp.index, y=sp["threshold"], mode="lines", name="spike threshold",
                   line={"dash": "dot"})])
    fig.add_trace(go.Scatter(x=spikes, y=sp.loc[spikes, "value"], mode="markers", name="spike",
                             marker={"size": 14, "color": "red", "symbol": "x"}))
    grad_first = int(wide["grad/norm"].first_valid_index())
    return framed(fig, None, height=320, first=grad_first)


event = st.plotly_chart(grad_figure(pick.store, pick.run_id, pick.version, pick.step),
                        key="dyn_grad", on_select="rerun", selection_mode="points")
st.caption(f"Spike: norm above the median of the previous {_signals.SPIKE_WINDOW} steps + "
           f"{_signals.SPIKE_K:g} × 1.4826 × {_terms.link('mad', 'MAD')} (a robust "
           "five-sigma), and above "
           f"{_signals.SPIKE_FLOOR:g} (norms near 0 are never spikes). "
           "Click a point to inspect it.")

points = (event.selection or {}).get("points", []) if event else []
clicked = int(points[0]["x"]) if points else None
if clicked is not None and clicked != st.session_state.get("_dyn_clicked"):
    st.session_state["_dyn_clicked"] = clicked
    st.session_state["spike"] = clicked
    _params.forget("spike")        # a click on the chart picks the step, as the selectbox does
options = spikes + [int(s) for s in sp.index if int(s) not in spikes]
chosen = c.url_select("Step to inspect", options, key="spike", param="spike", cast=int,
                      format_func=str)
threshold = sp.loc[chosen, "threshold"]
st.caption(f"{'Spike' if chosen in spikes else 'Step'} {chosen}: grad/norm "
           f"{sp.loc[chosen, 'value']:.3g}"
           + (f", threshold {threshold:.3g}" if threshold == threshold else ""))
ranked, modules = step_gradients(pick.store, pick.run_id, pick.version, chosen)
if ranked.empty:
    st.info(f"Step {chosen} recorded no per-trajectory gradient norms.")
else:
    ranked["replay"] = [c.replay_url(pick, chosen, t) for t in ranked["traj_id"]]
    st.dataframe(ranked, key="dyn_ranked", hide_index=True, column_config={
        "replay": st.column_config.LinkColumn("replay", display_text="open")})
    for r in ranked.head(5).to_dict("records"):
        c.replay_link(pick, chosen, r["traj_id"],
                      label=f"Replay {r['traj_id']} (grad norm {r['grad_norm']:.3g})")
if not modules.empty:
    with st.expander(f"Per-module gradient norms at step {chosen}"):
        st.dataframe(modules.sort_values("norm", ascending=False), key="dyn_modules",
                     hide_index=True)
