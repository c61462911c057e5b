"""Replay's "Branches" panel and Groups' "where values fell": branch-from-turn analyses
(core/jobs/branch.py) of recorded trajectories, and branch jobs launched from the page.

A job is its own process (``python -m core.branch``, an argument list, no shell), like the Train
page's training jobs (pages/_jobs.py): its output goes to a log under ``<runs dir>/logs/`` and it
is remembered in ``<runs dir>/branch_job.json``, so a reload or another tab still sees it. Stop
kills it: the job writes everything in one transaction at its end, so a stopped job leaves nothing.
The store, run and trajectory come from the sidebar's pick and the recorded list, never typed.
"""
from __future__ import annotations

import re
import sys
import time

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from pages import _common as c
from pages import _jobs
from storage import queries

MAX_K = 64  # core/jobs/branch.py's MAX_K (pages do not import it: it pulls in numpy and the model code)
TURNS_RE = re.compile(r"all|\d{1,4}(,\d{1,4})*")


# -- jobs ------------------------------------------------------------------------------------------
def job_file():
    return _jobs.runs_dir() / "branch_job.json"


def current() -> dict | None:
    """The last branch job with ``alive`` and ``exit`` (None unless this server started it)."""
    job = _jobs.read_job(job_file(), "core.branch")
    if job is not None:
        job["exit"] = _jobs.exit_code({"pid": job.get("pid", -1)})
    return job


def launch(store: str, run_id: str, traj_id: str, turns: str, k: int, seed: int) -> dict:
    """Start one branch job; refuse while another runs or for malformed turns / K."""
    running = current()
    if running and running["alive"]:
        raise _jobs.JobError(f"a branch job is already running (trajectory "
                             f"{running['traj_id']!r}); stop it or wait for it to finish")
    turns = turns.replace(" ", "") or "all"
    if not TURNS_RE.fullmatch(turns):
        raise _jobs.JobError(f"turns {turns!r}: 'all' or comma-separated turn numbers")
    if not 1 <= int(k) <= MAX_K:
        raise _jobs.JobError(f"K must be between 1 and {MAX_K}")
    args = [sys.executable, "-m", "core.branch", "--db", str(store), "--run", str(run_id),
            "--traj", str(traj_id), "--turns", turns, "--k", str(int(k)), "--seed", str(int(seed))]
    logs = _jobs.runs_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"branch-{time.strftime('%Y%m%d-%H%M%S')}.log"
    child = _jobs.spawn(args, log_path)
    job = {"pid": child.pid, "store": str(store), "run_id": run_id, "traj_id": traj_id,
           "log": str(log_path), "args": args[1:], "started_at": time.strftime("%H:%M:%S")}
    _jobs.write_job(job_file(), job)
    return {**job, "alive": True, "exit": None}


def stop(job: dict) -> None:
    _jobs.kill(job, "core.branch", "branch")


# Cached so that the turn player and colour-by reruns read nothing; a job launched here clears
# them when it ends, one run from the command line shows within BRANCH_TTL_S.
BRANCH_TTL_S = 30


@st.cache_data(ttl=BRANCH_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def load_estimates(store: str, run_id: str, traj_id: str) -> pd.DataFrame:
    return queries.branch_estimates(store, run_id, traj_id)


@st.cache_data(ttl=BRANCH_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def load_children(store: str, run_id: str, traj_id: str) -> pd.DataFrame:
    return queries.branch_children(store, run_id, traj_id)


@st.cache_data(ttl=BRANCH_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def load_worst_turns(store: str, run_id: str, traj_ids: tuple[str, ...]) -> pd.DataFrame:
    return queries.branch_worst_turns(store, run_id, list(traj_ids))


def fresh_trajectories(pick: c.Pick) -> pd.DataFrame:
    """The picked step's trajectories read now (not cached): continuations recorded since."""
    return queries.trajectories(pick.store, pick.run_id, pick.step)


# -- the Replay panel ------------------------------------------------------------------------------
def chart(est: pd.DataFrame) -> go.Figure:
    """V and Q along the turns with their 95% intervals; the worst turn shaded."""
    fig = go.Figure()
    for name, colour in (("v", "#1f77b4"), ("q", "#d62728")):
        fig.add_trace(go.Scatter(
            x=est["turn"], y=est[name], mode="lines+markers", name=name.upper(),
            line={"color": colour},
            error_y={"type": "data", "symmetric": False, "array": est[f"{name}_hi"] - est[name],
                     "arrayminus": est[name] - est[f"{name}_lo"]}))
    worst = est[(est["worst"] == 1.0) & (est["a_hi"] < 0)]["turn"].tolist()
    for t in worst:
        fig.add_vrect(x0=t - 0.4, x1=t + 0.4, fillcolor="#ff7f0e", opacity=0.2, line_width=0,
                      annotation_text="lost the most", annotation_position="top left")
    fig.update_layout(height=320, margin={"l": 50, "r": 20, "t": 30, "b": 40},
                      xaxis={"title": "turn", "dtick": 1}, yaxis={"title": "mean return"},
                      legend={"orientation": "h", "y": -0.25})
    return fig


def panel(pick: c.Pick, traj_id: str, row: dict, n_turns: int) -> None:
    """The Branches panel of one trajectory in Replay (one line where it can never fill)."""
    if row.get("split") != "branch" and cannot_branch(pick) and \
            c.read_or_stop(load_estimates, pick.store, pick.run_id, traj_id).empty:
        st.caption("**Branches** (V and Q per turn): none for this trajectory. "
                   + cannot_branch(pick))
        return
    st.subheader("Branches: which turn lost the reward?")
    if row.get("split") == "branch":
        parent = c.read_or_stop(queries.branch_parent, pick.store, pick.run_id, traj_id)
        if parent:
            how = ("a new action sampled there" if parent["kind"] == "resample" else
                   "the recorded action kept, new samples after it")
            st.caption(f"A continuation of {c.safe_label(parent['traj_id'])} from turn "
                       f"{parent['turn']} ({how}); nothing of it was trained.")
            if parent["step"] is not None:
                c.replay_link(pick, parent["step"], parent["traj_id"], "Back to the trajectory "
                              "it branched from")
        return
    st.caption("For each turn t: K continuations that sample a new action at t give V(s_t); K "
               "that keep the recorded action and sample after it give Q(s_t, a_t); A = Q - V. "
               "The turn with the lowest A < 0 is the one whose action lost the most.")
    est = c.read_or_stop(load_estimates, pick.store, pick.run_id, traj_id)
    why_not = cannot_branch(pick)
    if why_not and est.empty:  # say so before any form: the job would only fail
        st.info(why_not)
    elif not why_not:
        job_controls(pick, traj_id, n_turns, *next_job(est))
    if est.empty:
        st.info("Branch values not computed yet for this trajectory.")
        return
    st.plotly_chart(chart(est), key="branch_chart")
    verdict(est)
    st.dataframe(est.drop(columns="worst"), key="branch_table", hide_index=True)
    kids = c.read_or_stop(load_children, pick.store, pick.run_id, traj_id)
    if not kids.empty:
        snap = kids["checkpoint_step"].iloc[0]
        st.caption(f"{len(kids)} continuations, sampled with the adapter of step {int(snap)} "
                   f"(job {c.safe_label(kids['job_id'].iloc[0])}, seed {int(kids['seed'].iloc[0])}).")
        kids = kids.assign(replay=[c.replay_url(pick, int(s), t) for s, t in
                                   zip(kids["step"], kids["child_traj_id"])])
        with st.expander("Continuations (open one in Replay)"):
            st.dataframe(kids.drop(columns=["job_id", "seed", "step"]), key="branch_kids",
                         hide_index=True, column_config={
                             "replay": st.column_config.LinkColumn("replay", display_text="open")})
    if why_not:  # under the values it does not concern, not a box above them
        why = why_not.removeprefix("No branch job here: ")
        st.caption("These values were computed by an earlier branch job; no new one can run "
                   "here: " + why)


def cannot_branch(pick: c.Pick) -> str | None:
    """Why no branch job can run on this run's trajectories (None: one can): continuations
    sample with the policy as it was, so they need the trainer's adapter snapshots."""
    source = c.text_of(pick.run.get("source"))
    if source not in (None, "trainer"):
        return (f"No branch job here: this run was recorded by {source}, not by this trainer, "
                "so there is no adapter to continue its trajectories with. Branch jobs run on "
                "runs trained here with adapter snapshots (adapter_every > 0).")
    if not queries.adapter_steps(pick.store, pick.run_id, pick.config or {}):
        return ("No branch job here: this run kept no adapter snapshots (its checkpoint folder "
                "is not next to this store, or it trained with adapter_every = 0), and "
                "continuations must sample with the policy as it was. Train with "
                "adapter_every > 0 to branch its trajectories.")
    return None


def verdict(est: pd.DataFrame) -> None:
    """Name the turn that lost the reward only when its interval for A lies below 0; else say,
    from the intervals themselves, which turns are candidates (A < 0, interval reaching 0) and
    which did better than the policy's average (interval above 0), with how many continuations
    would tell the candidates apart."""
    worst = est[(est["worst"] == 1.0) & (est["a_hi"] < 0)]["turn"].tolist()
    if worst:
        st.markdown(f"**The turn that lost the reward: {int(worst[0])}** (its interval for A "
                    "lies below 0)")
        return
    maybe = est[(est["a"] < 0) & ~(est["a_hi"] < 0)].sort_values("a")
    st.markdown(interval_sentence(est))
    if maybe.empty:
        return
    with st.expander(f"Candidates: {len(maybe)} turn(s) with A < 0, and how many "
                     "continuations would tell them apart"):
        shown = maybe[["turn", "a", "a_lo", "a_hi", "n", "k_needed"]].rename(
            columns={"n": "K now", "k_needed": "K to tell (per kind, about)"})
        st.dataframe(shown, key="branch_candidates", hide_index=True)
        st.caption("K to tell: the continuations per kind at which this A's interval would "
                   "exclude 0 (half-widths shrink as 1/sqrt(K)); blank for jobs recorded before "
                   "it was computed. The branch form above is set to run them; beyond "
                   f"{MAX_K} per kind one job cannot tell.")


def _turns(rows: pd.DataFrame) -> str:
    """"turn 2 ([0.028, 0.257])" / "turns 1 ([...]) and 3 ([...])": each with its interval."""
    each = [f"{int(r.turn)} ([{r.a_lo:.3f}, {r.a_hi:.3f}])" for r in rows.itertuples()]
    words = each[0] if len(each) == 1 else ", ".join(each[:-1]) + " and " + each[-1]
    return ("turn " if len(each) == 1 else "turns ") + words


def interval_sentence(est: pd.DataFrame) -> str:
    """What the intervals for A say when no turn is named, computed from them: the turns with
    A < 0 whose interval reaches 0, any whose interval lies below 0 without being the lowest A,
    and the turns whose interval lies above 0 (their recorded action did better)."""
    est = est.sort_values("turn")
    maybe = est[(est["a"] < 0) & ~(est["a_hi"] < 0)]
    below = est[est["a_hi"] < 0]
    above = est[est["a_lo"] > 0]
    if maybe.empty and below.empty:
        said = "No recorded action lost value (every A >= 0)."
    else:
        said = "No turn is shown to have lost the reward: "
        if not maybe.empty:
            said += (f"the interval for A of {_turns(maybe)}, where A < 0, still reaches 0"
                     if len(maybe) == 1 else
                     f"the intervals for A of {_turns(maybe)}, where A < 0, still reach 0")
        if not below.empty:
            said += ("; " if not maybe.empty else "") + (
                f"{_turns(below)} lies below 0 but is not the turn with the lowest A"
                if len(below) == 1 else f"{_turns(below)} lie below 0 but neither is the turn "
                "with the lowest A")
        said += "."
    if not above.empty:
        said += (f" The interval of {_turns(above)} lies above 0: the recorded action there "
                 "did better than the policy's average." if len(above) == 1 else
                 f" The intervals of {_turns(above)} lie above 0: the recorded actions there "
                 "did better than the policy's average.")
    return said


def next_job(est: pd.DataFrame) -> tuple[int, str]:
    """The branch form's K and turns: 8 and all; but where candidate turns (A < 0, interval
    still reaching 0) wait for more continuations, the K that would tell them apart (the largest
    of theirs, at most MAX_K) and those turns, so the next job is one click away."""
    if est.empty or ((est["worst"] == 1.0) & (est["a_hi"] < 0)).any():
        return 8, "all"
    maybe = est[(est["a"] < 0) & ~(est["a_hi"] < 0) & est["k_needed"].notna()]
    if maybe.empty:
        return 8, "all"
    k = int(min(MAX_K, maybe["k_needed"].max()))
    if k <= int(maybe["n"].max()):  # already at the most one job runs: the same job again
        return 8, "all"             # would only repeat its numbers
    return k, ",".join(str(int(t)) for t in sorted(maybe["turn"]))


def job_controls(pick: c.Pick, traj_id: str, n_turns: int, k_default: int = 8,
                 turns_default: str = "all") -> None:
    job = current()
    mine = job is not None and job.get("traj_id") == traj_id and job.get("store") == pick.store \
        and job.get("run_id") == pick.run_id
    if job and job["alive"]:
        if mine:
            st.fragment(_running, run_every=1.0)()
        else:
            st.info(f"A branch job is running on {c.safe_label(job['traj_id'])}; one at a time.")
        return
    with st.form("branch_form"):
        a, b, d = st.columns(3)
        k = a.number_input("K (continuations per turn and kind)", 1, MAX_K, k_default,
                           key="branch_k")
        turns = b.text_input("Turns to branch from", turns_default, key="branch_turns",
                             help=f"all, or turn numbers 0..{max(n_turns - 1, 0)} with commas")
        seed = d.number_input("Seed", 0, 2 ** 31 - 1, 0, key="branch_seed")
        go_ = st.form_submit_button("Start the branch job")
    if go_:
        try:
            launch(pick.store, pick.run_id, traj_id, turns, int(k), int(seed))
            st.rerun()
        except _jobs.JobError as exc:
            st.error(str(exc))
    if mine and not job["alive"]:
        tail = _jobs.log_tail(job, lines=12)
        if "recorded job" in tail:
            st.success("The last branch job on this trajectory finished.")
        elif tail.strip():
            st.error("The last branch job on this trajectory did not record anything:")
            st.code(tail, language=None, wrap_lines=True)


def _running() -> None:
    job = current()
    if job is None or not job["alive"]:
        c.load_trajectories.clear()  # its continuations are new trajectories of this step
        for loader in (load_estimates, load_children, load_worst_turns):
            loader.clear()
        st.rerun()
        return
    c.job_progress(job, stop, "loading the model and replaying", "continuations",
                   "Stop the branch job", "branch_stop")


# -- Groups ----------------------------------------------------------------------------------------
def group_panel(pick: c.Pick, ids: list[str]) -> None:
    """Per turn, how many of the group's analysed rollouts lost the most value at that turn."""
    worst = c.read_or_stop(load_worst_turns, pick.store, pick.run_id, tuple(ids))
    if worst.empty and cannot_branch(pick):  # one line, not an empty panel
        st.caption("**Where values fell** (branch analyses): none in this group. "
                   + cannot_branch(pick))
        return
    st.subheader("Where values fell (branch analyses)")
    if worst.empty:
        st.info("No rollout of this group has branch values yet (Replay's Branches panel "
                "computes them).")
        return
    counts = worst["worst_turn"].dropna().astype(int).value_counts().sort_index()
    table = pd.DataFrame({"turn": counts.index, "rollouts whose value fell most here":
                          counts.values})
    st.caption(f"{len(worst)} of {len(ids)} rollouts analysed; "
               f"{int(worst['worst_turn'].isna().sum())} lost value at no turn.")
    st.dataframe(table, key="groups_branch_worst", hide_index=True)
