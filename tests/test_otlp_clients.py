"""Real clients into the OTLP receiver: the ``openai`` client instrumented by
``opentelemetry-instrumentation-openai-v2`` (span mode and event mode) and by
``openinference-instrumentation-openai``, exporting through the SDK's OTLP/HTTP exporters
(protobuf, gzip, JSON), drives a three-turn tool-using agent against the project's own
OpenAI-compatible server (core/serve/server.py, the tiny model). The first two replies are
scripted tool calls (the server's ``reply`` rule; the tiny model emits no tool calls of its
own), the third is the tiny model's; the tools run in the agent, in ``execute_tool`` spans.
"""
from __future__ import annotations

import json
import re

import openai
import pytest
from opentelemetry.exporter.otlp.json.http._log_exporter import OTLPLogExporter as JsonLogs
from opentelemetry.exporter.otlp.json.http.trace_exporter import OTLPSpanExporter as JsonSpans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as ProtoLogs
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as ProtoSpans
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from core.serve.server import ChatModel, serve
from storage import db as store
from storage.otlp import Bounds, Receiver

KEY = "sk-otlp-clients-5e1"
QUESTION = "What is (2+3)*4? Use the tools."
TOOLS = {"add": lambda x, y: x + y, "mul": lambda x, y: x * y}


@pytest.fixture(scope="module")
def endpoint():
    srv = serve(ChatModel("tiny"), api_key=KEY)
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1", srv
    srv.shutdown()
    srv.server_close()


def agent(client: openai.OpenAI, tracer) -> str:
    """Call the model until it stops calling tools (at most 4 turns); returns the trace id."""
    with tracer.start_as_current_span("invoke_agent", attributes={
            "agentrl.task_id": "arith-20", "agentrl.group_id": "arith@0"}) as root:
        messages = [{"role": "user", "content": QUESTION}]
        for turn in range(4):
            reply = client.chat.completions.create(model="tiny", messages=messages,
                                                   max_tokens=24, temperature=0)
            text = reply.choices[0].message.content or ""
            match = re.match(r"CALL (\w+) (\{.*\})$", text)
            if not match:
                root.set_attribute("agentrl.reward", 0.0)
                break
            name, args, call_id = match[1], json.loads(match[2]), f"call_{turn}"
            with tracer.start_as_current_span(f"execute_tool {name}", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                    "gen_ai.tool.call.id": call_id}) as span:
                result = TOOLS[name](**args)
                span.set_attribute("gen_ai.tool.call.result", str(result))
            messages += [{"role": "assistant", "content": None, "tool_calls": [
                             {"id": call_id, "type": "function",
                              "function": {"name": name, "arguments": json.dumps(args)}}]},
                         {"role": "tool", "tool_call_id": call_id, "content": str(result)}]
        return format(root.get_span_context().trace_id, "032x")


CASES = {
    "openai-v2 span mode, protobuf": ("v2", "SPAN_ONLY", ProtoSpans, ProtoLogs, {}),
    "openai-v2 event mode, json": ("v2", "EVENT_ONLY", JsonSpans, JsonLogs, {}),
    "openinference, protobuf gzip": ("oi", None, ProtoSpans, ProtoLogs,
                                     {"compression": Compression.Gzip}),
    "openinference, json": ("oi", None, JsonSpans, JsonLogs, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_instrumented_openai_agent_is_recorded_turn_by_turn(endpoint, tmp_path, monkeypatch,
                                                               case):
    which, capture, spans_exporter, logs_exporter, kw = CASES[case]
    url, server = endpoint
    server.faults.rules = [
        {"fault": "reply", "when": "(2+3)", "times": 1, "text": 'CALL add {"x": 2, "y": 3}'},
        {"fault": "reply", "when": "(2+3)", "times": 1, "text": 'CALL mul {"x": 5, "y": 4}'}]
    if capture:
        monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", capture)
        monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    db = tmp_path / "agents.duckdb"
    receiver = Receiver(db, port=0, bounds=Bounds(flush_s=0.05, grace_s=0.05)).start()
    resource = Resource.create({"service.name": "arith-agent"})
    tp, lp = TracerProvider(resource=resource), LoggerProvider(resource=resource)
    tp.add_span_processor(SimpleSpanProcessor(spans_exporter(
        endpoint=receiver.url + "/v1/traces", **kw)))
    lp.add_log_record_processor(SimpleLogRecordProcessor(logs_exporter(
        endpoint=receiver.url + "/v1/logs", **kw)))
    if which == "v2":
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
        instrumentor = OpenAIInstrumentor()
        instrumentor.instrument(tracer_provider=tp, logger_provider=lp)
    else:
        from openinference.instrumentation.openai import OpenAIInstrumentor
        instrumentor = OpenAIInstrumentor()
        instrumentor.instrument(tracer_provider=tp)
    try:
        with openai.OpenAI(base_url=url, api_key=KEY) as client:  # closed: the server's
            trace_id = agent(client, tp.get_tracer("arith"))      # teardown waits on open ones
    finally:
        instrumentor.uninstrument()
        tp.shutdown()
        lp.shutdown()
        receiver.stop()
    assert receiver.counts["rejected"] == 0
    with store.reading(db) as con:
        traj = con.execute("SELECT traj_id, task_id, group_id, reward, num_turns, prompt, info "
                           "FROM trajectories").fetchall()
        turns = con.execute("SELECT action, observation, action_type, latency_s, info FROM turns "
                            "ORDER BY turn").fetchall()
        raw = con.execute("SELECT count(*) FROM spans").fetchone()[0]
        logs = con.execute("SELECT count(*) FROM span_logs").fetchone()[0]
    assert [t[:6] for t in traj] == [(trace_id, "arith-20", "arith@0", 0.0, 3,
                                      f"user: {QUESTION}\n")]
    # each call was followed by its tool's span: a tool turn, whichever convention (58, item 9)
    assert [t[:3] for t in turns[:2]] == [('CALL add {"x": 2, "y": 3}', "add -> 5\n", "tool"),
                                          ('CALL mul {"x": 5, "y": 4}', "mul -> 20\n", "tool")]
    info = [json.loads(t[4]) for t in turns]
    assert [i["convention"] for i in info] == ["openinference" if which == "oi" else "genai"] * 3
    assert all(i["model"] == "tiny" and i["input_tokens"] > 0 and i["output_tokens"] > 0
               for i in info)
    assert info[0]["finish_reason"] == "stop" and all(t[3] > 0 for t in turns)
    assert turns[2][0]  # the tiny model's own words
    assert raw == 6  # the agent, three chat calls, two tools: every span kept raw
    assert logs == (3 if capture == "EVENT_ONLY" else 0)
    assert json.loads(traj[0][6])["otel"]["service"] == "arith-agent"
