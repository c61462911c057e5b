"""Pages on a store the OTLP receiver (storage/otlp/) is still writing, through Streamlit's AppTest:
every trajectory sits at step 0, so a cache keyed by the run's last step never moved and Failures
kept its first count; an agent that still runs read as a finished failure (reward 0, success no,
``no_answer``). Real OpenTelemetry SDK exporters post to a real Receiver writing the store.
"""
from __future__ import annotations

import json

import pandas as pd
import pytest
from opentelemetry import trace

from pages import _common
from storage.otlp import Bounds, Receiver
from tests.test_otlp_receiver import USER, chat, provider, rows, tool_agent, wait_for
from tests.test_pages import app, demo, shown_table  # noqa: F401  (fixtures)

RUN = "otlp-agent"


@pytest.fixture
def live(tmp_path):
    """(store directory, store path, receiver, tracer provider): a receiver that keeps a trace
    open while its root span has not ended."""
    stores = tmp_path / "stores"
    stores.mkdir()
    db = stores / "otel.duckdb"
    r = Receiver(db, port=0, bounds=Bounds(flush_s=0.05, grace_s=0.05, idle_s=120.0)).start()
    tp = provider(r.url)
    yield str(stores), str(db), r, tp
    tp.shutdown()
    r.stop()


def five_seconds_later() -> None:
    """What the app's short-lived caches (the run list, each run's data version) forget after
    RUN_TTL_S: the test does not sleep through it."""
    _common.run_table.clear()
    _common.run_version.clear()


def open_agent(tp):
    """An agent that asked its first question and still runs: (its trace id, a function that
    makes it take one more turn)."""
    tracer = tp.get_tracer("live-agent")
    root = tracer.start_span("invoke_agent", attributes={"agentrl.task_id": "add"})
    ctx = trace.set_span_in_context(root)
    chat(tracer, [{"type": "text", "content": "thinking"}], USER, context=ctx)
    return format(root.get_span_context().trace_id, "032x"), \
        lambda: chat(tracer, [{"type": "text", "content": "still thinking"}], USER, context=ctx)


def test_failures_and_replay_follow_an_otlp_store_as_it_fills(app, live):
    stores, db, _, tp = live
    done = tool_agent(tp, reward=0.0)
    wait_for(lambda: rows(db, "SELECT 1 FROM trajectories WHERE finish_reason IS NOT NULL"))
    at = app("failures", store_dir=stores, store=db, run=RUN)
    assert shown_table(at, "failure_class", "traj_id")["traj_id"].tolist() == [done]

    running, another_turn = open_agent(tp)
    (info,), = wait_for(lambda: rows(db, "SELECT info FROM trajectories WHERE traj_id = ?",
                                     running))
    assert json.loads(info)["otel"]["open"] is True
    (stored,), = rows(db, "SELECT failure_class FROM trajectories WHERE traj_id = ?", running)
    five_seconds_later()
    at.run()
    assert not at.exception
    table = shown_table(at, "failure_class", "traj_id").set_index("traj_id")
    assert sorted(table.index) == sorted([done, running])       # the new one is listed
    row = table.loc[running]
    # as it stands: open, with no outcome yet (the store holds the receiver's placeholder)
    assert stored == "no_answer" and row["failure_class"] == "open"
    assert pd.isna(row["reward"]) and pd.isna(row["success"])
    assert any("2 trajectories match" in c.value for c in at.caption)
    meanings = next(e for e in at.expander if e.label.startswith("What the"))
    assert any("still running" in m.value for m in meanings.markdown)
    at.session_state["fail_results"] = {"selection": {"rows": [
        shown_table(at, "failure_class", "traj_id")["traj_id"].tolist().index(running)],
        "columns": []}}
    at.run()
    panel = [c.value for c in at.caption if c.value.startswith("open · ")]
    assert panel and "reward - · still running · 1 turns" in panel[0], panel

    # the agent takes another turn: the panel's turns are read again (same step, same id)
    another_turn()
    wait_for(lambda: rows(db, "SELECT 1 FROM trajectories WHERE traj_id = ? AND num_turns = 2",
                          running))
    five_seconds_later()
    at.run()
    assert any(c.value.startswith("open · ") and "· 2 turns" in c.value for c in at.caption)

    # Replay's trajectory picker (step 0 all along) offers it, and reads it as open
    at = app("replay", store_dir=stores, store=db, run=RUN, step=0, traj=running)
    assert not at.exception
    assert running in at.selectbox(key="traj").options
    success = next(m for m in at.metric if m.label == "Success")
    assert success.value == "open"
    assert any("Live: this agent is still running" in i.value for i in at.info)


def test_the_sidebar_steps_and_trajectories_refresh_without_a_new_step(app, live):
    """An import or OTLP run stays at step 0: a new trajectory still reaches the pickers."""
    stores, db, _, tp = live
    first = tool_agent(tp)
    wait_for(lambda: rows(db, "SELECT 1 FROM trajectories WHERE finish_reason IS NOT NULL"))
    at = app("replay", store_dir=stores, store=db, run=RUN, step=0)
    assert at.selectbox(key="traj").options == [first]
    second = tool_agent(tp)
    wait_for(lambda: rows(db, "SELECT 1 FROM trajectories WHERE traj_id = ? AND "
                              "finish_reason IS NOT NULL", second))
    five_seconds_later()
    at.run()
    assert sorted(at.selectbox(key="traj").options) == sorted([first, second])
