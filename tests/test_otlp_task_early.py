"""An agent whose spans are still arriving is named by its own task from its first span on (issue
58 item 8), not by its prompt's hash until its root span (the one carrying ``agentrl.task_id``,
which an SDK exports when it ends, last) arrives: storage/otlp/carry.py puts the identity on every
span as it starts, the receiver reads it from any span or from the resource, and the name that
arrives later replaces the provisional one everywhere, one trajectory all along. Real
OpenTelemetry SDK exporters post to a real Receiver writing a real store.
"""
from __future__ import annotations

import json

import pytest
from opentelemetry import baggage, context, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from storage.ingest.messages import task_of
from storage.otlp import Bounds, Receiver
from storage.otlp.carry import CarryIdentity
from tests.test_otlp_receiver import USER, chat, rows, wait_for

OPEN = "SELECT traj_id, task_id, group_id, step, split, info FROM trajectories"


@pytest.fixture
def receiver(tmp_path):
    """A receiver that keeps a trace open while its root span has not ended."""
    r = Receiver(tmp_path / "otel.duckdb", port=0,
                 bounds=Bounds(flush_s=0.05, grace_s=0.05, idle_s=120.0)).start()
    r.db = tmp_path / "otel.duckdb"
    yield r
    r.stop()


def provider(url: str, carry: bool, **resource) -> TracerProvider:
    tp = TracerProvider(resource=Resource.create({"service.name": "agent", **resource}))
    if carry:
        tp.add_span_processor(CarryIdentity())
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=url + "/v1/traces")))
    return tp


def first_turn(db) -> tuple:
    """The open trajectory's row once its first turn is stored."""
    (row,) = wait_for(lambda: rows(db, OPEN + " WHERE num_turns = 1"))
    assert json.loads(row[5])["otel"]["open"] is True
    return row


def test_the_task_set_on_the_root_reaches_the_receiver_with_the_first_span(receiver):
    tp = provider(receiver.url, carry=True)
    tracer = tp.get_tracer("agent")
    root = tracer.start_span("invoke_agent", attributes={
        "agentrl.task_id": "add", "agentrl.group_id": "add@3", "agentrl.step": 3,
        "agentrl.split": "eval"})
    chat(tracer, [{"type": "text", "content": "thinking"}], USER,
         context=trace.set_span_in_context(root))
    traj, task, group, step, split, _ = first_turn(receiver.db)
    assert (task, group, step, split) == ("add", "add@3", 3, "eval")  # the root is not there yet
    root.set_attribute("agentrl.reward", 1.0)
    root.end()
    wait_for(lambda: rows(receiver.db, "SELECT 1 FROM trajectories WHERE finish_reason "
                                            "IS NOT NULL"))
    assert [r[:5] for r in rows(receiver.db, OPEN)] == [(traj, "add", "add@3", 3, "eval")]
    tp.shutdown()


def test_the_task_in_the_baggage_reaches_the_receiver_with_the_first_span(receiver):
    """Spans an instrumentation makes: the agent's code only sets the baggage."""
    tp = provider(receiver.url, carry=True)
    tracer = tp.get_tracer("agent")
    token = context.attach(baggage.set_baggage("agentrl.task_id", "add"))
    try:
        root = tracer.start_span("invoke_agent")  # made by a framework, no attributes of ours
        chat(tracer, [{"type": "text", "content": "thinking"}], USER,
             context=trace.set_span_in_context(root))
    finally:
        context.detach(token)
    assert first_turn(receiver.db)[1] == "add"
    root.end()
    tp.shutdown()


def test_a_task_on_the_resource_names_an_open_trajectory(receiver):
    """An agent process that runs one trajectory, no processor installed."""
    tp = provider(receiver.url, carry=False, **{"agentrl.task_id": "add"})
    tracer = tp.get_tracer("agent")
    root = tracer.start_span("invoke_agent")
    chat(tracer, [{"type": "text", "content": "thinking"}], USER,
         context=trace.set_span_in_context(root))
    assert first_turn(receiver.db)[1] == "add"
    root.set_attribute("agentrl.task_id", "add-2-3")  # a span's value wins over the resource's
    root.end()
    wait_for(lambda: rows(receiver.db, "SELECT 1 FROM trajectories WHERE task_id = "
                                            "'add-2-3' AND finish_reason IS NOT NULL"))
    tp.shutdown()


def test_a_name_that_arrives_later_replaces_the_provisional_one_everywhere(receiver):
    """Without the processor the root alone names the task: until it arrives the trajectory is
    named by its prompt's hash, then by its task, in one row, in every column that held it."""
    tp = provider(receiver.url, carry=False)
    tracer = tp.get_tracer("agent")
    root = tracer.start_span("invoke_agent", attributes={"agentrl.task_id": "add"})
    ctx = trace.set_span_in_context(root)
    chat(tracer, [{"type": "text", "content": "thinking"}], USER, context=ctx)
    traj, provisional, group, *_ = first_turn(receiver.db)
    assert provisional == task_of("user: What is 2+3?\n") and group == f"0:{provisional}"
    chat(tracer, [{"type": "text", "content": "The answer is 5"}], USER, context=ctx)
    root.set_attribute("agentrl.reward", 1.0)
    root.end()
    wait_for(lambda: rows(receiver.db, "SELECT 1 FROM trajectories WHERE finish_reason "
                                            "IS NOT NULL"))
    assert [r[:3] for r in rows(receiver.db, OPEN)] == [(traj, "add", "0:add")]
    late = tracer.start_span("execute_tool add", context=ctx, attributes={
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "add"})
    late.end()  # a late span re-derives the closed trajectory: still one row, still "add"
    wait_for(lambda: rows(receiver.db, "SELECT 1 FROM trajectories WHERE "
                                            "json_extract(info, '$.otel.spans')::INT = 4"))
    assert [r[:3] for r in rows(receiver.db, OPEN)] == [(traj, "add", "0:add")]
    assert rows(receiver.db, "SELECT count(*) FROM trajectories WHERE task_id = ? OR "
                                  "group_id LIKE ?", provisional, f"%{provisional}%") == [(0,)]
    tp.shutdown()
