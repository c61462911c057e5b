"""A task id on the resource (storage/otlp/conventions.py ``trace_facts``) names each trajectory of
the agent process, never keys it, and an unusable one (301 characters, a list) is read as absent:
a resource is shared by every trajectory of its process, and such a value made each of them fail
validation (none derived) or named them all by a list's Python repr. Real SDK exporters post to
a real receiver writing a real store.
"""
from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from storage.ingest.messages import task_of
from storage.otlp import Bounds, Receiver
from tests.test_otlp_receiver import USER, chat, rows, wait_for

PROMPT_TASK = task_of("user: What is 2+3?\n")


@pytest.mark.parametrize("given,named", [("add", "add"), ("t" * 301, PROMPT_TASK),
                                         (["a", "b"], PROMPT_TASK)])
def test_a_resource_task_names_each_trajectory_or_is_read_as_absent(tmp_path, given, named):
    db = tmp_path / "o.duckdb"
    r = Receiver(db, port=0, bounds=Bounds(flush_s=0.05, grace_s=0.05, idle_s=120.0)).start()
    try:
        tp = TracerProvider(resource=Resource.create({"service.name": "agent",
                                                      "agentrl.task_id": given}))
        tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=r.url + "/v1/traces")))
        tracer = tp.get_tracer("agent")
        for k in range(3):  # three trajectories of one process: one resource
            root = tracer.start_span("invoke_agent", attributes={"agentrl.reward": 1.0})
            chat(tracer, [{"type": "text", "content": f"answer {k}"}], USER,
                 context=trace.set_span_in_context(root))
            root.end()
        tp.shutdown()
        got = wait_for(lambda: (lambda x: x if len(x) == 3 else None)(
            rows(db, "SELECT task_id FROM trajectories WHERE finish_reason IS NOT NULL")), 10)
    finally:
        r.stop()
    assert got is not None and sorted(t for (t,) in got) == [named] * 3
