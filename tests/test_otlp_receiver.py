"""The OTLP/HTTP receiver (storage/otlp/) driven by the real OpenTelemetry SDK exporters
(protobuf, JSON, gzip) and by hand-made hostile bodies: spans become trajectories, every span
is kept raw, late spans re-assemble a closed trajectory, and bad input gets the status the OTLP
specification names, never a crash.
"""
from __future__ import annotations

import gzip
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.json.http.trace_exporter import OTLPSpanExporter as JsonExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as ProtoExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from storage import db as store
from storage.otlp import Bounds, Limits, Receiver

ROOT = Path(__file__).resolve().parents[1]
FAST = Bounds(flush_s=0.05, grace_s=0.05, idle_s=5.0)


@pytest.fixture
def receiver(tmp_path):
    r = Receiver(tmp_path / "otlp.duckdb", port=0, bounds=FAST).start()
    yield r
    r.stop()


def provider(url: str, exporter=ProtoExporter, service="agent", **kw) -> TracerProvider:
    tp = TracerProvider(resource=Resource.create({"service.name": service}))
    tp.add_span_processor(SimpleSpanProcessor(exporter(endpoint=url + "/v1/traces", **kw)))
    return tp


def chat(tracer, output_parts, inputs=None, context=None, finish="stop"):
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "tiny",
             "gen_ai.usage.input_tokens": 7, "gen_ai.usage.output_tokens": 4,
             "gen_ai.response.finish_reasons": [finish],
             "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": output_parts,
                                                    "finish_reason": finish}])}
    if inputs is not None:
        attrs["gen_ai.input.messages"] = json.dumps(inputs)
    span = tracer.start_span("chat tiny", context=context, attributes=attrs)
    span.end()


USER = [{"role": "user", "parts": [{"type": "text", "content": "What is 2+3?"}]}]
CALL = [{"type": "tool_call", "id": "c1", "name": "add", "arguments": {"x": 2, "y": 3}}]
AFTER = USER + [{"role": "assistant", "parts": CALL},
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1",
                                            "response": "5"}]}]


def tool_agent(tp: TracerProvider, reward=1.0) -> str:
    """A two-turn tool-using agent's trace; returns its trace id."""
    tracer = tp.get_tracer("test-agent")
    with tracer.start_as_current_span("invoke_agent", attributes={
            "agentrl.reward": reward, "agentrl.task_id": "add-2-3", "agentrl.split": "eval"}) as root:
        chat(tracer, CALL, USER, finish="tool_calls")
        with tracer.start_as_current_span("execute_tool add", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "add",
                "gen_ai.tool.call.id": "c1", "gen_ai.tool.call.result": "5"}):
            pass
        chat(tracer, [{"type": "text", "content": "The answer is 5"}], AFTER)
        return format(root.get_span_context().trace_id, "032x")


def rows(db, sql, *params):
    """Read as the app does (storage.db.reading queues behind the receiver's writes)."""
    with store.reading(db) as con:
        return con.execute(sql, list(params)).fetchall()


def wait_for(check, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            value = check()
        except (duckdb.Error, store.StoreError):
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


# -- real exporters ------------------------------------------------------------------------------
@pytest.mark.parametrize("exporter, kw", [(ProtoExporter, {}), (JsonExporter, {}),
                                          (ProtoExporter, {"compression": Compression.Gzip})],
                         ids=["protobuf", "json", "protobuf-gzip"])
def test_an_exported_agent_trace_becomes_a_trajectory(tmp_path, exporter, kw):
    r = Receiver(tmp_path / "o.duckdb", port=0, bounds=FAST).start()
    tp = provider(r.url, exporter, **kw)
    trace_id = tool_agent(tp)
    tp.shutdown()
    r.stop()
    db = tmp_path / "o.duckdb"
    (run_id, source, status, config), = rows(db, "SELECT run_id, source, status, config FROM runs")
    assert (run_id, source, status) == ("otlp-agent", "import:otlp", "finished")
    assert json.loads(config)["model"] == "tiny"
    traj = rows(db, "SELECT traj_id, task_id, reward, success, num_turns, split, finish_reason, "
                    "prompt, info FROM trajectories")
    assert [t[:8] for t in traj] == [(trace_id, "add-2-3", 1.0, True, 2, "eval", "answered",
                                      "user: What is 2+3?\n")]
    assert json.loads(traj[0][8])["otel"]["reward_source"] == "agentrl.reward"
    turns = rows(db, "SELECT action, observation, action_type, parsed, info FROM turns "
                     "ORDER BY turn")
    assert [t[:3] for t in turns] == [("add(x=2, y=3)", "add -> 5\n", "tool"),
                                      ("The answer is 5", "", "answer")]
    assert json.loads(turns[0][3])["tool_calls"][0]["arguments"] == {"x": 2, "y": 3}
    info = json.loads(turns[0][4])
    assert (info["model"], info["input_tokens"], info["output_tokens"], info["finish_reason"]) \
        == ("tiny", 7, 4, "tool_calls")
    spans = rows(db, "SELECT name, parent_span_id = '', attributes FROM spans ORDER BY start_ns")
    assert [s[:2] for s in spans] == [("invoke_agent", True), ("chat tiny", False),
                                      ("execute_tool add", False), ("chat tiny", False)]
    assert json.loads(spans[0][2])["agentrl.reward"] == 1.0  # every raw attribute kept
    tokens = rows(db, "SELECT string_agg(text, '' ORDER BY pos) FROM tokens")[0][0]
    assert tokens.startswith("user: What is 2+3?") and "The answer is 5" in tokens


def test_a_running_agent_is_written_as_it_goes_and_late_spans_reopen_it(receiver):
    db = receiver.writer.db_path
    tracer = provider(receiver.url).get_tracer("t")
    root = tracer.start_span("agent")
    ctx = trace.set_span_in_context(root)
    chat(tracer, [{"type": "text", "content": "thinking"}], USER, context=ctx)
    open_turns = wait_for(lambda: rows(db, "SELECT num_turns, info FROM trajectories"))
    assert open_turns[0][0] == 1 and json.loads(open_turns[0][1])["otel"]["open"] is True
    root.end()
    wait_for(lambda: rows(db, "SELECT 1 FROM trajectories WHERE NOT (info->'otel'->>'open')::BOOLEAN"))
    chat(tracer, [{"type": "text", "content": "late"}], USER, context=ctx)  # after the close
    wait_for(lambda: rows(db, "SELECT 1 FROM trajectories WHERE num_turns = 2"))
    assert rows(db, "SELECT count(*), count(DISTINCT traj_id) FROM trajectories") == [(1, 1)]
    assert rows(db, "SELECT count(*) FROM spans") == [(3,)]


def test_a_span_whose_parent_never_arrives_closes_after_the_idle_timeout(tmp_path):
    r = Receiver(tmp_path / "o.duckdb", port=0, bounds=Bounds(flush_s=0.05, idle_s=0.3)).start()
    tracer = provider(r.url).get_tracer("t")
    parent = tracer.start_span("never exported")
    chat(tracer, [{"type": "text", "content": "orphan"}], USER,
         context=trace.set_span_in_context(parent))
    db = tmp_path / "o.duckdb"
    info = wait_for(lambda: rows(db, "SELECT info FROM trajectories WHERE NOT "
                                     "(info->'otel'->>'open')::BOOLEAN"))
    assert json.loads(info[0][0])["otel"]["orphans"] == [
        format(parent.get_span_context().span_id, "016x")]
    r.stop()


def test_conversation_id_joins_traces_and_rewards_come_from_other_conventions(receiver):
    db = receiver.writer.db_path
    tracer = provider(receiver.url).get_tracer("t")
    for i in range(2):  # two traces, one conversation
        with tracer.start_as_current_span("turn", attributes={"gen_ai.conversation.id": "conv-9"}):
            chat(tracer, [{"type": "text", "content": f"part {i}"}], USER)
    with tracer.start_as_current_span("agentlightning.annotation", attributes={
            "gen_ai.conversation.id": "conv-9", "agentlightning.reward.0.value": 0.5}):
        pass
    receiver.bounds = receiver.assembler.bounds = Bounds(flush_s=0.05, idle_s=0.2)
    got = wait_for(lambda: rows(db, "SELECT traj_id, num_turns, reward, info FROM trajectories "
                                    "WHERE NOT (info->'otel'->>'open')::BOOLEAN"))
    assert got[0][:3] == ("conv:conv-9", 2, 0.5)
    assert len(json.loads(got[0][3])["otel"]["trace_ids"]) == 3


# -- hostile bodies ----------------------------------------------------------------------------------
def post(r, body: bytes, ctype="application/x-protobuf", path="/v1/traces", headers=None):
    host, port = r.server_address[:2]
    con = http.client.HTTPConnection(host, port, timeout=30)
    con.request("POST", path, body, {"Content-Type": ctype, **(headers or {})})
    resp = con.getresponse()
    out = (resp.status, dict(resp.getheaders()), resp.read())
    con.close()
    return out


def json_span(trace_id="5b8efff798038103d269b633813fc60c", span_id="eee19b7ec3c1b174", **kw):
    return {"traceId": trace_id, "spanId": span_id, "name": "chat x", "kind": 1,
            "startTimeUnixNano": "1", "endTimeUnixNano": "2",
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}], **kw}


def json_body(*spans) -> bytes:
    return json.dumps({"resourceSpans": [{"resource": {"attributes": []},
                                          "scopeSpans": [{"spans": list(spans)}]}]}).encode()


def test_ids_of_the_wrong_length_are_rejected_by_name_and_the_rest_kept(receiver):
    bad = json_span(trace_id="abc123", span_id="eee19b7ec3c1b175")
    status, _, body = post(receiver, json_body(json_span(), bad), "application/json")
    assert status == 200
    reply = json.loads(body)["partialSuccess"]
    assert reply["rejectedSpans"] == "1" and "'abc123'" in reply["errorMessage"]
    req = ExportTraceServiceRequest()
    span = req.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = b"\x01" * 15, b"\x02" * 8, "short id"
    status, _, body = post(receiver, req.SerializeToString())
    resp = ExportTraceServiceResponse.FromString(body)
    assert status == 200 and resp.partial_success.rejected_spans == 1
    assert "01" * 15 in resp.partial_success.error_message and "15" in \
        resp.partial_success.error_message
    assert receiver.counts["spans"] == 1


@pytest.mark.parametrize("body, ctype", [
    (b"{nope", "application/json"), (b"[" * 100_000, "application/json"),
    (b"\xff\xfe{}", "application/json"), (b"\x0a\xff\xff\xff\xff\x0f", "application/x-protobuf"),
    (json.dumps({"resourceSpans": [{"resource": {"attributes": [{"key": "k", "value": json.loads(
        '{"kvlistValue": {"values": [{"key": "a", "value": ' * 200 + '{}' + '}]}}' * 200)}]}}]}
    ).encode(), "application/json")], ids=["bad-json", "100k-deep", "not-utf8", "bad-proto",
                                           "200-deep-anyvalue"])
def test_a_body_that_does_not_parse_is_a_400(receiver, body, ctype):
    status, _, reply = post(receiver, body, ctype)
    assert status == 400 and reply
    assert post(receiver, json_body(json_span()), "application/json")[0] == 200  # still serving


def test_size_caps_refuse_big_and_inflating_bodies_with_413(tmp_path):
    r = Receiver(tmp_path / "o.duckdb", port=0, bounds=FAST,
                 limits=Limits(max_body_bytes=1 << 20, max_inflated_bytes=4 << 20)).start()
    host, port = r.server_address[:2]
    sock = socket.create_connection((host, port))  # a 100 MB body, announced: refused unread
    sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf"
                 b"\r\nContent-Length: 104857600\r\n\r\n")
    assert sock.recv(100).startswith(b"HTTP/1.1 413")
    sock.close()
    bomb = gzip.compress(b"\0" * (64 << 20))  # 64 MiB of zeros in ~64 KB
    status, _, _ = post(r, bomb, headers={"Content-Encoding": "gzip"})
    assert status == 413
    r.stop()


def test_a_client_that_leaves_mid_body_costs_nothing(receiver):
    host, port = receiver.server_address[:2]
    sock = socket.create_connection((host, port))
    sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100000\r\n\r\n" + json_body(json_span())[:50])
    sock.close()
    wait_for(lambda: receiver.counts["dropped_bodies"] == 1)
    assert receiver.counts["spans"] == 0
    assert post(receiver, json_body(json_span()), "application/json")[0] == 200


def test_spans_past_the_per_trajectory_limit_are_rejected_naming_the_trace(tmp_path):
    r = Receiver(tmp_path / "o.duckdb", port=0,
                 bounds=Bounds(max_spans_per_trace=3, flush_s=0.05)).start()
    spans = [json_span(span_id=f"{i:016x}") for i in range(1, 6)]
    status, _, body = post(r, json_body(*spans), "application/json")
    reply = json.loads(body)["partialSuccess"]
    assert status == 200 and reply["rejectedSpans"] == "2"
    assert reply["errorMessage"] == ("trace 5b8efff798038103d269b633813fc60c: 2 span(s) over "
                                     "the limit of 3 spans per trajectory")
    r.stop()


def test_a_bearer_token_is_checked_before_the_body(tmp_path):
    r = Receiver(tmp_path / "o.duckdb", port=0, bounds=FAST, limits=Limits(token="s3cret")).start()
    assert post(r, json_body(json_span()), "application/json")[0] == 401
    assert post(r, json_body(json_span()), "application/json",
                headers={"Authorization": "Bearer s3cret"})[0] == 200
    tp = provider(r.url, headers={"Authorization": "Bearer s3cret"})
    tool_agent(tp)
    tp.shutdown()
    assert r.counts["spans"] == 5
    r.stop()


def test_sigint_writes_what_it_holds_and_exits_0(tmp_path):
    db = tmp_path / "o.duckdb"
    # port 0: the receiver says the port it got (a port probed free here may be taken meanwhile)
    proc = subprocess.Popen([sys.executable, "-m", "core.cli", "otlp", "--db", str(db),
                             "--port", "0", "--idle-s", "600", "--flush-s", "60"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        port = int(re.search(r"127\.0\.0\.1:(\d+)/v1/traces", line).group(1))
        tracer = provider(f"http://127.0.0.1:{port}").get_tracer("t")
        root = tracer.start_span("agent")  # never ends: the trajectory is still open
        chat(tracer, [{"type": "text", "content": "hi"}], USER,
             context=trace.set_span_in_context(root))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "received 1 spans" in out
    assert rows(db, "SELECT num_turns, status FROM trajectories JOIN runs USING (run_id)") \
        == [(1, "finished")]
