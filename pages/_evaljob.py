"""Compare's cross-evaluation job: when two evaluations did not use the same tasks and seeds,
evaluate one side's checkpoint on the other side's task set (core/jobs/evaluation.py), then compare.

The job is its own process (``python -m core.evaluation``, an argument list, no shell) started
and remembered with pages/_jobs.py's machinery (``<runs dir>/eval_job.json``, a log under
``<runs dir>/logs/``), one at a time. Stop kills it: the job writes its result in one transaction
at its very end, so a stopped job leaves nothing. The store, runs and steps come from the two
evaluations picked on the page (the recorded list), never typed.
"""
from __future__ import annotations

import re
import sys
import time

import streamlit as st

from pages import _common as c
from pages import _jobs
from storage import queries

MODULE = "core.evaluation"
COMPARE = "pages/compare.py"
RESULT_RE = re.compile(r"compare: a=(\S+) b=(\S+)")


def job_file():
    return _jobs.runs_dir() / "eval_job.json"


def current() -> dict | None:
    """The last cross-evaluation job with ``alive`` and ``exit`` (None unless started here)."""
    job = _jobs.read_job(job_file(), MODULE)
    if job is not None:
        job["exit"] = _jobs.exit_code({"pid": job.get("pid", -1)})
    return job


def launch(store: str, run_id: str, step: int, tasks: tuple[str, int]) -> dict:
    """Evaluate ``run_id``'s checkpoint at ``step`` on the tasks of evaluation ``tasks``."""
    running = current()
    if running and running["alive"]:
        raise _jobs.JobError("a cross-evaluation job is already running; stop it or wait for it "
                             "to finish")
    args = [sys.executable, "-m", MODULE, "--db", str(store), "--run", str(run_id),
            "--step", str(int(step)), "--tasks-from", f"{tasks[0]}:{int(tasks[1])}"]
    logs = _jobs.runs_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"evaluation-{time.strftime('%Y%m%d-%H%M%S')}.log"
    child = _jobs.spawn(args, log_path)
    job = {"pid": child.pid, "store": str(store), "run_id": str(run_id), "step": int(step),
           "tasks": [str(tasks[0]), int(tasks[1])], "log": str(log_path), "args": args[1:],
           "started_at": time.strftime("%H:%M:%S")}
    _jobs.write_job(job_file(), job)
    return {**job, "alive": True, "exit": None}


def stop(job: dict) -> None:
    _jobs.kill(job, MODULE, "cross-evaluation")


# -- the panel -------------------------------------------------------------------------------------
def _directions(a: tuple[str, int], b: tuple[str, int]):
    """(label, checkpoint side, task side, how the result pairs: (a, b) option strings)."""
    yield "A's checkpoint on B's tasks", a, b, lambda new: (new, f"{b[0]}:{b[1]}")
    yield "B's checkpoint on A's tasks", b, a, lambda new: (f"{a[0]}:{a[1]}", new)


def panel(store: str, run_id: str, a: tuple[str, int], b: tuple[str, int], on_done) -> None:
    """Under Compare's warning: for each direction, the existing cross-evaluation (a deep link
    to its pairing), or a button that starts the job, or why none can run. ``on_done`` clears
    the page's cached reads when a job started here ends; ``run_id`` (the sidebar's) stays
    picked in the links."""
    done = c.read_or_stop(queries.cross_evaluations, store)
    runs = c.run_table()
    runs = runs[runs["store"] == store].set_index("run_id")
    job = current()
    ours = job is not None and job.get("store") == store and \
        {(job.get("run_id"), job.get("step"))} <= {a, b} and tuple(job.get("tasks", ())) in (a, b)
    if job and job["alive"]:
        if ours:
            def running():
                _running(on_done)
            st.fragment(running, run_every=1.0)()
        else:
            st.info("A cross-evaluation job is running on other evaluations; one at a time.")
    for label, (run, step), (trun, tstep), pairing in _directions(a, b):
        match = done[(done["checkpoint_run"] == run) & (done["checkpoint_step"] == step)
                     & (done["tasks_run"] == trun) & (done["tasks_step"] == tstep)] \
            if not done.empty else done
        if not match.empty:
            new = match.iloc[-1]
            pa, pb = pairing(f"{new['run_id']}:{int(new['step'])}")
            st.page_link(COMPARE, query_params={"store": store, "run": run_id, "a": pa, "b": pb},
                         label=f"Compare on one task set: {label} (adapter of step "
                               f"{int(new['step'])})")  # our own words: nothing to escape
            continue
        why = _cannot(store, runs, run, step)
        if why:
            st.caption(f"{label}: {why}")
        elif not (job and job["alive"]) and st.button(
                f"Evaluate {label}", key=f"xeval_{label[0]}",
                help=f"Runs python -m {MODULE} as its own process: the checkpoint of "
                     f"{c.safe_label(run)}@{step} on the tasks and episode seeds of "
                     f"{c.safe_label(trun)}@{tstep}, recorded as a new run of this store."):
            try:
                launch(store, run, step, (trun, tstep))
                st.rerun()
            except _jobs.JobError as exc:
                st.error(str(exc))
    if ours and not job["alive"]:
        seen = f"xeval_ended_{job['pid']}"
        if not st.session_state.get(seen):  # ended between two runs of the page: read anew once
            st.session_state[seen] = True
            on_done()
            st.rerun()
        tail = _jobs.log_tail(job, lines=12)
        if RESULT_RE.search(tail) is None and tail.strip():
            st.error("The last cross-evaluation job recorded nothing:")
            st.code(tail, language=None, wrap_lines=True)


def _cannot(store: str, runs, run_id: str, step: int) -> str | None:
    """Why the checkpoint of (run_id, step) cannot be evaluated, or None."""
    if run_id not in runs.index:
        return "its run is not in the store list."
    row = runs.loc[run_id]
    if c.text_of(row.get("source")) not in (None, "trainer"):
        return "its run was imported: no checkpoint to load."
    config = queries.run_config(row.get("config"))
    kept = [s for s in queries.adapter_steps(store, run_id, config) if s <= step]
    if not kept:
        return (f"its run kept no adapter snapshot at or before step {step} (train with "
                "adapter_every > 0 to keep them): nothing to evaluate.")
    return None


def _running(on_done) -> None:
    job = current()
    if job is None or not job["alive"]:
        st.session_state[f"xeval_ended_{job['pid']}" if job else "xeval_ended"] = True
        on_done()
        st.rerun()
        return
    c.job_progress(job, stop, "loading the model and the tasks", "tasks",
                   "Stop the cross-evaluation", "xeval_stop")
