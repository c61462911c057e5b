"""storage/otlp/carry.py copies only what can name a task onto the spans below the root: a task
id of 10 MB (which the receiver refuses anyway: an id is at most 256 characters) or a list set
on the root stays on the root, instead of riding on every span the agent makes (each export
that many times larger); ordinary ids, steps and baggage are still copied.
"""
from __future__ import annotations

from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from storage.otlp.carry import CarryIdentity


def _spans(root_attributes: dict, children: int = 3, bag: dict | None = None) -> dict:
    exported = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(CarryIdentity())
    tp.add_span_processor(SimpleSpanProcessor(exported))
    tracer = tp.get_tracer("agent")
    token = None
    if bag:
        ctx = context.get_current()
        for k, v in bag.items():
            ctx = baggage.set_baggage(k, v, ctx)
        token = context.attach(ctx)
    try:
        root = tracer.start_span("invoke_agent", attributes=root_attributes)
        for i in range(children):
            tracer.start_span(f"chat {i}", context=trace.set_span_in_context(root)).end()
        root.end()
    finally:
        if token is not None:
            context.detach(token)
    tp.shutdown()
    return {s.name: dict(s.attributes) for s in exported.get_finished_spans()}


def test_a_huge_or_listed_identity_is_not_copied_onto_every_span():
    huge = "t" * (10 << 20)
    spans = _spans({"agentrl.task_id": huge, "agentrl.group_id": ["a", "b"],
                    "agentrl.split": "eval", "agentrl.step": 3})
    assert spans["invoke_agent"]["agentrl.task_id"] == huge  # the root keeps what it was given
    for i in range(3):
        child = spans[f"chat {i}"]
        assert "agentrl.task_id" not in child
        assert "agentrl.group_id" not in child
        assert (child["agentrl.split"], child["agentrl.step"]) == ("eval", 3)
    assert sum(len(str(v)) for a in spans.values() for v in a.values()) < len(huge) + 1000


def test_ordinary_ids_and_baggage_are_still_copied():
    spans = _spans({"agentrl.task_id": "add-2-3"}, bag={"agentrl.group_id": "g" * 256,
                                                         "agentrl.split": "x" * 257})
    for i in range(3):
        child = spans[f"chat {i}"]
        assert child["agentrl.task_id"] == "add-2-3"
        assert child["agentrl.group_id"] == "g" * 256
        assert "agentrl.split" not in child
