"""Replay of an OpenTelemetry trajectory while its agent still runs, in a real headless Chromium:
the real OpenTelemetry SDK exports a GenAI-convention agent's spans to a Receiver (storage/otlp/)
writing the store the app serves; its root span is still open. Replay shows the first turn's
action and observation (hostile text escaped) and says the agent is live; after another turn a
reload shows it too (the trajectory is read fresh while open: its step, the cached reads' key,
never moves); once the root ends the live line goes.

Run alone: ``.venv/bin/python -m pytest -q tests/test_browser_otlp_live.py``.
"""
from __future__ import annotations

import json
import time
import urllib.parse

import pytest
from opentelemetry import trace

from storage.otlp import Bounds, Receiver
from tests.browser_harness import ROOT, launched_browser, new_page, scratch_dir, served_app
from tests.test_browser import no_exception, settle
from tests.test_otlp_receiver import CALL, USER, chat, provider, rows, wait_for

pytestmark = pytest.mark.browser
RUN = "otlp-live-agent"
HOSTILE = "<b>5</b><img src=x onerror=alert(1)>"
LIVE = "Live: this agent is still running"


def test_replay_follows_an_otel_agent_while_it_runs():
    base = scratch_dir("browser-otlp-live")
    stores = base / "stores"
    (ROOT / stores).mkdir(parents=True)
    store = stores / "otel.duckdb"
    with served_app(base, [stores], base / "runs") as url:
        receiver = Receiver(ROOT / store, port=0,
                            bounds=Bounds(flush_s=0.05, grace_s=0.05, idle_s=120.0)).start()
        tp = provider(receiver.url, service="live-agent")
        try:
            with launched_browser() as browser, new_page(browser, 1280, 900) as page:
                follow(page, url, tp, ROOT / store, store)
        finally:  # before served_app removes the store
            tp.shutdown()
            receiver.stop()


def codes_showing(page, text: str, timeout_s: float = 30.0) -> list[str]:
    """The page's code blocks' texts (stripped) once one of them is ``text``, or as they are at
    the deadline. The page is live: its follow fragment (app.py) reruns the whole script when the
    run's version moves (an open trajectory's ``info`` is part of it), and such a rerun can start
    just after ``settle`` saw the page still. One read of the blocks came back empty in CI."""
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [t.strip() for t in page.locator("[data-testid=stCode]").all_inner_texts()]
        if text in codes or time.monotonic() > deadline:
            return codes
        page.wait_for_timeout(200)


def follow(page, url: str, tp, db, store) -> None:
    """The agent's turns as it goes, and Replay on them at each point."""
    tracer = tp.get_tracer("test-agent")
    root = tracer.start_span("invoke_agent", attributes={"agentrl.task_id": "add"})
    ctx = trace.set_span_in_context(root)
    tid = format(root.get_span_context().trace_id, "032x")
    chat(tracer, CALL, USER, context=ctx, finish="tool_calls")
    tracer.start_span("execute_tool add", context=ctx, attributes={
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "add",
        "gen_ai.tool.call.id": "c1", "gen_ai.tool.call.result": HOSTILE}).end()
    first = wait_for(lambda: rows(db, "SELECT action, observation FROM turns WHERE "
                                      "traj_id = ? AND observation <> ''", tid))
    (action, observation), = first
    assert observation == f"add -> {HOSTILE}\n"
    (info,), = rows(db, "SELECT info FROM trajectories WHERE traj_id = ?", tid)
    assert json.loads(info)["otel"]["open"] is True

    query = urllib.parse.urlencode({"store": str(store), "run": RUN, "step": 0,
                                    "traj": tid, "turn": 0})
    page.goto(f"{url}/replay?{query}")
    page.get_by_role("heading", name="Replay", exact=True).first.wait_for(timeout=60_000)
    main = page.locator("[data-testid=stMain]")
    main.get_by_text(LIVE).first.wait_for(timeout=30_000)
    settle(page)
    codes = codes_showing(page, observation.strip())
    # the action, a tool call: shown as a call (its name, its arguments in a grid)
    assert action == "add(x=2, y=3)"
    assert "Tool call · add" in main.inner_text()
    assert observation.strip() in codes, codes  # escaped: text
    assert main.locator("img[src=x]").count() == 0
    no_exception(page)

    # the agent goes on: a second LLM turn, then a reload shows it
    after = USER + [{"role": "assistant", "parts": CALL},
                    {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1",
                                                "response": HOSTILE}]}]
    chat(tracer, [{"type": "text", "content": "The answer is 5"}], after, context=ctx)
    wait_for(lambda: rows(db, "SELECT count(*) FROM turns WHERE traj_id = ?",
                          tid)[0][0] == 2)
    page.reload()
    main.get_by_text("Turn 0 of 2").first.wait_for(timeout=30_000)
    assert LIVE in main.inner_text()
    page.goto(f"{url}/replay?{query.replace('turn=0', 'turn=1')}")
    main.get_by_text("Turn 1 of 2").first.wait_for(timeout=30_000)
    settle(page)
    assert "The answer is 5" in codes_showing(page, "The answer is 5")
    no_exception(page)

    # the root ends: the trajectory closes and the page stops calling it live
    root.end()
    wait_for(lambda: not json.loads(rows(db, "SELECT info FROM trajectories WHERE "
                                             "traj_id = ?", tid)[0][0])["otel"]["open"])
    page.reload()
    main.get_by_text("Turn 1 of 2").first.wait_for(timeout=30_000)
    settle(page)
    assert LIVE not in main.inner_text()
    no_exception(page)
