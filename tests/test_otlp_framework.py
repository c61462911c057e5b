"""An agent framework's own agent into the OTLP receiver: smolagents' ``ToolCallingAgent`` (its
``OpenAIModel``, which speaks chat completions through the ``openai`` client), instrumented by
``openinference-instrumentation-smolagents``, exporting through the SDK's OTLP/HTTP protobuf
exporter, solves (2+3)*4 with two tools against the project's OpenAI-compatible server
(core/serve/server.py, the tiny model). The server returns no structured ``tool_calls``, so its
``reply`` rule scripts the model's three answers as the JSON action blobs smolagents parses from
text when a reply carries none (``Model.parse_tool_calls``): ``add``, ``mul``, ``final_answer``.
The tools run in the agent, in the framework's own TOOL spans.

smolagents' span layout: an AGENT root ``ToolCallingAgent.run``, a CHAIN ``Step N`` per step,
under it the LLM span ``OpenAIModel.generate`` (messages as ``message.contents`` parts, roles
``tool-call`` / ``tool-response``) and the TOOL span of the call.
"""
from __future__ import annotations

import json

import pytest
from openinference.instrumentation.smolagents import SmolagentsInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from smolagents import OpenAIModel, ToolCallingAgent, tool

from core.serve.server import ChatModel, serve
from storage import db as store
from storage.otlp import Bounds, Receiver
from storage.otlp.conventions import openinference_messages

KEY = "sk-otlp-framework-7c2"
QUESTION = "What is (2+3)*4? Use the tools."
REPLIES = ['{"name": "add", "arguments": {"x": 2, "y": 3}}',
           '{"name": "mul", "arguments": {"x": 5, "y": 4}}',
           '{"name": "final_answer", "arguments": {"answer": "20"}}']


@tool
def add(x: int, y: int) -> int:
    """Adds two integers.

    Args:
        x: the first integer
        y: the second integer
    """
    return x + y


@tool
def mul(x: int, y: int) -> int:
    """Multiplies two integers.

    Args:
        x: the first integer
        y: the second integer
    """
    return x * y


@pytest.fixture(scope="module")
def endpoint():
    srv = serve(ChatModel("tiny"), api_key=KEY)
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1", srv
    srv.shutdown()
    srv.server_close()


def test_a_smolagents_tool_calling_agent_is_recorded_turn_by_turn(endpoint, tmp_path):
    url, server = endpoint
    server.faults.rules = [{"fault": "reply", "when": "(2+3)", "times": 1, "text": text}
                           for text in REPLIES]
    db = tmp_path / "agents.duckdb"
    receiver = Receiver(db, port=0, bounds=Bounds(flush_s=0.05, grace_s=0.05)).start()
    tp = TracerProvider(resource=Resource.create({"service.name": "smol-arith"}))
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
        endpoint=receiver.url + "/v1/traces")))
    instrumentor = SmolagentsInstrumentor()
    instrumentor.instrument(tracer_provider=tp)
    try:
        model = OpenAIModel(model_id="tiny", api_base=url, api_key=KEY, max_tokens=24,
                            temperature=0)
        agent = ToolCallingAgent(tools=[add, mul], model=model, max_steps=4, verbosity_level=0)
        answer = agent.run(QUESTION)
        model.client.close()  # the server's teardown waits on open connections
    finally:
        instrumentor.uninstrument()
        tp.shutdown()
        receiver.stop()
    assert answer == "20"
    assert receiver.counts["rejected"] == 0
    with store.reading(db) as con:
        traj = con.execute("SELECT run_id, reward, num_turns, prompt, info "
                           "FROM trajectories").fetchall()
        turns = con.execute("SELECT action, observation, action_type, latency_s, info FROM turns "
                            "ORDER BY turn").fetchall()
        kinds = con.execute("SELECT name FROM spans ORDER BY start_ns").fetchall()
    assert [t[:3] for t in traj] == [("otlp-smol-arith", 0.0, 3)]
    assert traj[0][3].startswith("system: You are an expert assistant")
    assert traj[0][3].endswith(f"user: New task:\n{QUESTION}\n")
    # the model's action blobs, in order; each step's tool result is what the next call saw
    # each step ran a tool (its TOOL span), so each turn is a tool turn (issue 58 item 9)
    assert [t[:3] for t in turns] == [(REPLIES[0], "add -> 5\n", "tool"),
                                      (REPLIES[1], "mul -> 20\n", "tool"),
                                      (REPLIES[2], "final_answer -> 20\n", "tool")]
    info = [json.loads(t[4]) for t in turns]
    assert [i["convention"] for i in info] == ["openinference"] * 3
    assert all(i["model"] == "tiny" and i["input_tokens"] > 1000 and i["output_tokens"] > 0
               for i in info)
    assert info[0]["input_tokens"] < info[1]["input_tokens"] < info[2]["input_tokens"]
    assert all(t[3] > 0 for t in turns)
    otel = json.loads(traj[0][4])["otel"]
    assert otel["service"] == "smol-arith" and otel["spans"] == 10 and not otel["orphans"]
    assert [k[0] for k in kinds] == ["ToolCallingAgent.run", "Step 1", "OpenAIModel.generate",
                                     "SimpleTool", "Step 2", "OpenAIModel.generate",
                                     "SimpleTool", "Step 3", "OpenAIModel.generate",
                                     "FinalAnswerTool"]


def _oi(side: str, i: int, role: str, *parts: tuple[str, str]) -> dict:
    base = f"llm.{side}_messages.{i}.message."
    out = {base + "role": role}
    for k, (kind, text) in enumerate(parts):
        out[base + f"contents.{k}.message_content.type"] = kind
        if kind == "text":
            out[base + f"contents.{k}.message_content.text"] = text
    return out


def test_openinference_content_parts_and_smolagents_roles_are_read():
    calls = ("Calling tools:\n[{'id': 'c1', 'type': 'function', 'function': {'name': 'add', "
             "'arguments': {'x': 2, 'y': 3}}}]")
    attrs = {**_oi("input", 0, "user", ("text", "New task:\n"), ("image", ""), ("text", "Q")),
             **_oi("input", 1, "assistant", ("text", "blob")),
             **_oi("input", 2, "tool-call", ("text", calls)),
             **_oi("input", 3, "tool-response", ("text", "Observation:\n5")),
             **_oi("input", 4, "tool-call", ("text", "Calling tools:\n[{'id': 'a'} + 1]")),
             **_oi("input", 5, "tool-response", ("text", "Call id: e7\nError:\nno such tool")),
             **_oi("output", 0, "assistant", ("text", "done")),
             "llm.input_messages.6.message.role": "user",
             "llm.input_messages.6.message.content": "plain"}
    inputs, outputs = openinference_messages(attrs)
    assert [(m["role"], m["text"]) for m in inputs] == [
        ("user", "New task:\n[image]Q"), ("assistant", "blob"), ("assistant", calls),
        ("tool", "5"), ("assistant", "Calling tools:\n[{'id': 'a'} + 1]"),
        ("tool", "Error:\nno such tool"), ("user", "plain")]
    assert inputs[2]["calls"] == [{"id": "c1", "name": "add", "arguments": {"x": 2, "y": 3}}]
    assert (inputs[3]["name"], inputs[3]["call_id"]) == ("add", "c1")
    assert inputs[4]["calls"] == []  # not a literal: text only, the response unnamed
    assert (inputs[5]["name"], inputs[5]["call_id"]) == (None, "e7")
    assert [(m["role"], m["text"]) for m in outputs] == [("assistant", "done")]


def test_a_smolagents_step_with_two_calls_names_both_and_no_single_id():
    calls = ("Calling tools:\n[{'id': 'c1', 'function': {'name': 'add', 'arguments': {}}}, "
             "{'id': 'c2', 'function': {'name': 'mul', 'arguments': {}}}]")
    inputs, _ = openinference_messages({
        **_oi("input", 0, "tool-call", ("text", calls)),
        **_oi("input", 1, "tool-response", ("text", "Observation:\n5\n20")),
        **_oi("input", 2, "tool-response", ("text", "Observation:\nlate"))})
    assert [(m["role"], m["name"], m["call_id"], m["text"]) for m in inputs] == [
        ("assistant", None, None, calls), ("tool", "add, mul", None, "5\n20"),
        ("tool", None, None, "late")]
