"""Train: a form with presets that starts `python -m core.train` as its own process, then
follows it: progress, live curves, log tail, and a stop button."""
from __future__ import annotations

import re
import time
from dataclasses import fields
from pathlib import Path

import plotly.graph_objects as go
import streamlit as st

from core.config import ALGOS, ENVS as ENVS_BUILTIN, MODELS, PRESETS, ConfigError, TrainConfig
from core.config import describe_options
from pages import _common as c
from pages import _terms
from pages import _jobs
from storage import db, queries

c.ensure_app()
_terms.title("Train", "train")
# Drawn last (after a launch has been handled) but shown first: the job is what a user watches.
job_area = st.container()
st.subheader("New job")
# Models and environments: the built-in ones and the allow-list the server's environment sets
# (pages/_jobs.py), never a path or module typed into the form.
MODEL_LABELS = {**{m: m for m in MODELS}, **_jobs.allowed_models()}
HAS_DEVICE = "device" in {f.name for f in fields(TrainConfig)}  # the trainer's --device flag
FIELDS = {  # form field -> (label, kind)
    "env": ("Environment", tuple(_jobs.allowed_envs())),
    "model": ("Model", tuple(MODEL_LABELS)), "algo": ("Algorithm", ALGOS),
    "group_size": ("Group size G", int), "tasks_per_step": ("Tasks per step", int),
    "max_turns": ("Max turns", int), "temperature": ("Temperature", float),
    "lr": ("Learning rate", float), "lora_rank": ("LoRA rank", int), "steps": ("RL steps", int),
    "sft_steps": ("SFT steps", int), "seed": ("Seed", int),
    "env_options": ("Environment options", str),
    **({"device": ("Device", ("auto", "cpu", "cuda"))} if HAS_DEVICE else {}),
}


def default_name(preset: str) -> str:
    """A run name no earlier launch has: the preset and the time (UTC, like run ids). Runs that
    share a name are told apart only by their time and id; a fixed default made every run 'demo'."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "", preset) or "run"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


def options_help(env: str | None) -> str:
    """The environment options field's help: the format and what ``env`` declares (names,
    kinds, bounds, defaults), the same declarations the launch is checked against."""
    head = ("key=value,key=value, passed to the environment; a launch with an unknown option "
            "or a value out of bounds is refused.")
    if not env:
        return head
    lines = describe_options(env).replace("<", "\\<").splitlines()
    return head + f"\n\nOptions of {env}:\n" + "".join(f"\n- {line}" for line in lines)


def apply_preset() -> None:
    values = {**TrainConfig().to_dict(), **PRESETS.get(st.session_state["train_preset"], {})}
    for name in FIELDS:
        st.session_state[f"train_{name}"] = values[name]
    st.session_state["train_name"] = default_name(st.session_state["train_preset"])


presets = ["workshop-demo"] + [p for p in PRESETS if p != "workshop-demo"] + ["(defaults)"]
preset = st.selectbox("Preset", presets, key="train_preset", on_change=apply_preset)
if "train_env" not in st.session_state:
    apply_preset()
if st.session_state.pop("_train_name_used", False) or "train_name" not in st.session_state:
    st.session_state["train_name"] = default_name(preset)  # the next launch gets a new name
st.caption("A preset fills in the form; workshop-demo trains the bandit task on the tiny model, "
           "small enough to finish in minutes on a laptop CPU. Runs are recorded in "
           + str(_jobs.store_path()) + ".")

with st.form("train_form"):
    cols = st.columns(5)  # three rows: the launch button stays in a laptop's window
    values = {}
    for i, (name, (label, kind)) in enumerate(FIELDS.items()):
        box = cols[i % 5]
        if name == "model":
            values[name] = box.selectbox(label, kind, key=f"train_{name}",
                                         format_func=lambda m: MODEL_LABELS.get(m, m))
        elif isinstance(kind, tuple):
            values[name] = box.selectbox(label, kind, key=f"train_{name}")
        elif kind is str:
            values[name] = box.text_input(label, key=f"train_{name}",
                                          help=options_help(st.session_state.get("train_env")))
        elif kind is int:
            values[name] = box.number_input(label, step=1, key=f"train_{name}")
        else:
            values[name] = box.number_input(label, format="%g", step=None, key=f"train_{name}")
    name_box, launch_box = st.columns([3, 1], vertical_alignment="bottom")
    run_name = name_box.text_input("Run name", key="train_name",
                                   help="letters, digits, '.', '_' and '-'")
    submitted = launch_box.form_submit_button("Launch training", key="train_launch")

requested = values.get("device", "auto")
device, why = _jobs.job_device(requested)
st.caption(f"The job will train on **{device}** (device {requested}: {c.safe_label(why, 200)})"
           + ("" if HAS_DEVICE else " · this trainer has no --device flag: it trains on the CPU"))
allow_note = []
if len(MODEL_LABELS) > len(MODELS):
    allow_note.append(f"{len(MODEL_LABELS) - len(MODELS)} model(s) from {_jobs.MODEL_DIRS_ENV}")
if len(FIELDS["env"][1]) > len(ENVS_BUILTIN):
    allow_note.append(f"{len(FIELDS['env'][1]) - len(ENVS_BUILTIN)} plugin environment(s)")
st.caption("Offered besides the built-in ones: " + (", ".join(allow_note) or "nothing")
           + f". Set `{_jobs.MODEL_DIRS_ENV}` and `{_jobs.ENV_MODULES_ENV}` before starting the "
           "app to offer more (docs/environments.md).")
for bad in _jobs.ignored_envs():
    st.warning(f"`{_jobs.ENV_MODULES_ENV}`: ignored {c.safe_label(bad, 80)}, which is not "
               "package.module:Factory")

if submitted:
    try:
        cfg = TrainConfig.from_dict({**PRESETS.get(preset, {}), **values})
        job = _jobs.launch(cfg, run_name)
    except (ConfigError, _jobs.JobError) as exc:
        st.error("Not launched:")
        st.code(str(exc), language=None)
    else:
        st.success(f"Started job {job['pid']}.")
        st.session_state["_train_name_used"] = True


def run_row(job: dict) -> dict | None:
    """The job's run in its store (the newest one with its name), if recorded yet."""
    try:
        runs = queries.runs(job["db"])
    except db.StoreError:
        return None
    runs = runs[runs["name"] == job["name"]]
    return None if runs.empty else runs.iloc[0].to_dict()


# (comments, not docstrings: Streamlit draws a page script's bare strings on the page)
CURVES = ("eval/success", "success/rate", "reward/mean")
# left axis: held-out success (what a demo is about), train success and reward
LOSSES = ("sft/loss", "policy/pg_loss")
# right axis: losses, whose scale (an SFT loss starts near 10) would flatten the rest


def curves(long) -> go.Figure:
    fig = go.Figure()
    for name, part in long.groupby("name"):
        loss = name in LOSSES
        fig.add_trace(go.Scatter(
            x=part["step"], y=part["value"], mode="lines+markers", name=c.plot_text(name),
            yaxis="y2" if loss else "y",
            line={"dash": "dot", "width": 1.5} if loss else
            {"width": 3.5 if name == "eval/success" else 1.5}))
    fig.update_layout(height=300, xaxis_title="step", margin={"t": 10, "b": 30},
                      yaxis={"title": "success, reward"},
                      yaxis2={"title": "loss", "overlaying": "y", "side": "right",
                              "showgrid": False},
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"})
    return fig


def listed_store(job: dict) -> str | None:
    """The job's store as the app lists it (the sidebar's spelling of its path), or None."""
    return next((s for s in queries.discover_stores()
                 if Path(s).resolve() == Path(job["db"]).resolve()), None)


def follow_in_sidebar(job: dict, run: dict) -> None:
    """The sidebar picks the job's run when it is first recorded and again when the job ends, so
    every page opens on it (app.py adopts ``_follow_run`` before drawing its picker). A few
    reruns at most per event: the run list is cached for seconds and may not list it yet."""
    store = listed_store(job)
    if store is None:
        return
    event = (job["pid"], run["run_id"], bool(job["alive"]))
    tries = st.session_state.setdefault("_train_follow_tries", {})
    if st.session_state.get("pick_run") == (store, run["run_id"]) or tries.get(event, 0) >= 3:
        tries[event] = 3
        return
    tries[event] = tries.get(event, 0) + 1
    st.session_state["_follow_run"] = (store, run["run_id"])
    c.run_table.clear()
    st.rerun(scope="app")


def run_links(job: dict, run: dict) -> None:
    """Links to the job's run on Dynamics and Replay (when its store is one the app lists)."""
    store = listed_store(job)
    if store is None:
        st.caption(f"The app lists no store at {c.safe_label(job['db'], 120)}: add its "
                   f"directory to {queries.STORE_DIRS_ENV} to open the run.")
        return
    link = {"store": store, "run": run["run_id"]}
    left, right = st.columns(2)
    left.page_link("pages/dynamics.py", label="Open the run on Dynamics", query_params=link)
    right.page_link("pages/replay.py", label="Open the run on Replay", query_params=link)


def job_panel() -> None:
    job = _jobs.current()
    if job is None:
        st.info("No training job started yet.")
        return
    state = "running" if job["alive"] else "ended"
    code = _jobs.exit_code(job)
    st.markdown(f"**Job** `{c.safe_label(job['name'])}` · pid {job['pid']} · {state}"
                + (f" · exit code {code}" if code is not None else "")
                + (f" · configuration {c.safe_label(job['config'], 120)}"
                   if job.get("config") else ""))
    run = run_row(job)
    total = max(int(job.get("total_steps") or 1), 1)
    done = c.int_of(run["last_step"], 0) if run else 0
    st.progress(min(done / total, 1.0), text=f"step {done} of {total}"
                + (f" · run {run['shown_status']}" if run else " · starting (loading the model)"))
    if run:
        follow_in_sidebar(job, run)
        run_links(job, run)
        wide = queries.metrics(job["db"], run["run_id"], [*CURVES, *LOSSES])
        if not wide.empty:
            st.plotly_chart(curves(wide), key="train_live")
            st.caption(_terms.reward_beside_success(queries.run_config(run.get("config"))))
    if job["alive"] and st.button("Stop after the current step", key="train_stop"):
        try:
            _jobs.stop(job)
            st.info("Stop requested: the trainer records the current step, then exits.")
        except _jobs.JobError as exc:  # it ended between the page's check and the click
            st.info(str(exc))
    st.markdown("**Log**")
    st.code(_jobs.log_tail(job) or "(empty)", language=None)
    if not job["alive"] and st.session_state.get("_train_was_alive"):
        st.session_state["_train_was_alive"] = False
        st.rerun()  # the job ended: redraw once without the auto-refresh
    st.session_state["_train_was_alive"] = job["alive"]


with job_area:
    st.subheader("Current job")
    current = _jobs.current()
    st.fragment(job_panel, run_every=2.0 if current and current["alive"] else None)()
