"""Export a run as OpenTelemetry spans over OTLP/HTTP, so trace viewers (Phoenix, Jaeger, Tempo,
any OpenTelemetry Collector) show it, and so this product's own receiver (``agentrl otlp``)
reads it back.

One trajectory is one trace (its id derived from run and trajectory, so re-exporting sends the
same ids):

    rl.sample            the root: agentrl.* (reward, success, task_id, group_id, split, step,
                         traj_id), rl.reward.<component> for each reward component, failure class,
                         finish reason; gen_ai.conversation.id = the trajectory id
      chat {model}       one per turn, in turn order (GenAI semantic conventions, span mode):
                         gen_ai.operation.name chat, gen_ai.request.model, gen_ai.input.messages
                         (what the turn newly saw: the prompt at turn 0, else the previous
                         observation as a tool message), gen_ai.output.messages (the action);
                         agentrl.observation: the observation that followed, exactly as the
                         environment gave it (the receiver takes it over its rendering of tool
                         messages)
      execute_tool       one per turn with an observation: gen_ai.tool.call.result

The resource carries the proposed rl.* names (semantic-conventions-genai issue 88): rl.run.id,
rl.algorithm, rl.model.name, rl.environment.name. Token rows are not exported: a trace has no
place for them (the JSONL and Parquet exports carry them). Times are synthetic but ordered (the
store keeps no per-turn clock): each step one second apart, each turn one millisecond.

Every door bounded: http(s) endpoints only, a deadline per request, at most 4 MiB of protobuf a
request (gzip), retries on 429/502/503/504 honouring Retry-After (at most 30 s, 5 tries), and an
error naming the endpoint and the HTTP status.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import time
import urllib.error
import urllib.request
from typing import Iterator

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from storage import db
from storage.export import Filters, _records, _run_config, selected_ids

MAX_REQUEST_BYTES = 4 << 20
RETRY_STATUS = (429, 502, 503, 504)
MAX_TRIES = 5
MAX_RETRY_AFTER = 30.0
SECOND = 1_000_000_000


class ExportError(RuntimeError):
    """An export that could not be delivered, naming the endpoint."""


def _id(n: int, *parts: str) -> bytes:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogatepass")).digest()[:n]


def _value(v) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    return AnyValue(string_value=v if isinstance(v, str) else json.dumps(v, ensure_ascii=False))


def _attrs(d: dict) -> list[KeyValue]:
    return [KeyValue(key=k, value=_value(v)) for k, v in d.items() if v is not None]


def trajectory_spans(rec: dict, run_id: str, model: str, t0: int) -> list[Span]:
    """The spans of one exported trajectory (generic record, storage/interchange.py)."""
    traj = rec["traj_id"]
    trace = _id(16, run_id, traj)
    root_id = _id(8, run_id, traj, "root")
    turns = rec.get("turns") or []
    start = t0 + int(rec.get("step") or 0) * SECOND
    end = start + (2 * len(turns) + 1) * 1_000_000
    root = {"agentrl.traj_id": traj, "agentrl.task_id": rec.get("task_id"),
            "agentrl.group_id": rec.get("group_id"), "agentrl.split": rec.get("split"),
            "agentrl.step": rec.get("step"), "agentrl.reward": rec.get("reward"),
            "agentrl.success": rec.get("success"), "agentrl.failure_class": rec.get("failure_class"),
            "agentrl.finish_reason": rec.get("finish_reason"), "agentrl.prompt": rec.get("prompt"),
            "gen_ai.conversation.id": traj}
    root.update({f"rl.reward.{k}": v for k, v in (rec.get("rewards") or {}).items()})
    spans = [Span(trace_id=trace, span_id=root_id, name="rl.sample", kind=Span.SPAN_KIND_INTERNAL,
                  start_time_unix_nano=start, end_time_unix_nano=end, attributes=_attrs(root))]
    seen = rec.get("prompt") or ""
    for k, turn in enumerate(turns):
        at = start + (2 * k + 1) * 1_000_000
        said = [{"role": "user" if k == 0 else "tool", "parts": [
            {"type": "text", "content": seen} if k == 0 else
            {"type": "tool_call_response", "id": f"turn-{k - 1}", "response": seen}]}]
        out = [{"role": "assistant", "parts": [{"type": "text", "content": turn.get("action", "")}],
                "finish_reason": "stop"}]
        spans.append(Span(
            trace_id=trace, span_id=_id(8, run_id, traj, "turn", str(k)), parent_span_id=root_id,
            name=f"chat {model}", kind=Span.SPAN_KIND_CLIENT, start_time_unix_nano=at,
            end_time_unix_nano=at + 500_000, attributes=_attrs({
                "gen_ai.operation.name": "chat", "gen_ai.provider.name": "agentrl",
                "gen_ai.request.model": model, "gen_ai.input.messages": json.dumps(said),
                "gen_ai.output.messages": json.dumps(out), "agentrl.turn": k,
                "agentrl.observation": turn.get("observation") or "",
                "agentrl.action_valid": turn.get("action_valid")})))
        seen = turn.get("observation") or ""
        if seen:
            spans.append(Span(
                trace_id=trace, span_id=_id(8, run_id, traj, "tool", str(k)),
                parent_span_id=root_id, name="execute_tool", kind=Span.SPAN_KIND_INTERNAL,
                start_time_unix_nano=at + 500_000, end_time_unix_nano=at + 1_000_000,
                attributes=_attrs({"gen_ai.operation.name": "execute_tool",
                                   "gen_ai.tool.call.id": f"turn-{k}",
                                   "gen_ai.tool.call.result": seen, "agentrl.turn": k})))
    return spans


def run_requests(db_path, run_id: str, filters: Filters = Filters(), chunk: int = 200
                 ) -> Iterator[tuple[ExportTraceServiceRequest, int]]:
    """(request, trajectories in it) of at most ``MAX_REQUEST_BYTES`` each; a trajectory whose
    spans alone are larger goes in a request of its own."""
    with db.reading(db_path) as con:
        config = _run_config(con, run_id)
        ids = selected_ids(con, run_id, filters)
        created = con.execute("SELECT epoch_ns(created_at) FROM runs WHERE run_id = ?",
                              [run_id]).fetchone()
    t0 = int(created[0]) if created and created[0] is not None else time.time_ns()
    model = str(config.get("model") or "unknown")
    resource = _attrs({"service.name": "agentrl", "rl.run.id": run_id,
                       "rl.algorithm": config.get("algo"), "rl.model.name": model,
                       "rl.environment.name": config.get("env")})

    def request(spans: list[Span]) -> ExportTraceServiceRequest:
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.attributes.extend(resource)
        ss = rs.scope_spans.add()
        ss.scope.name = "agentrl.export"
        ss.spans.extend(spans)
        return req

    pending, size, count = [], 0, 0
    for start in range(0, len(ids), chunk):
        with db.reading(db_path) as con:  # short reads: a live run's writer gets its turns
            records = list(_records(con, run_id, ids[start:start + chunk]))
        for rec in records:
            spans = trajectory_spans(rec, run_id, model, t0)
            more = sum(s.ByteSize() for s in spans)
            if pending and size + more > MAX_REQUEST_BYTES:
                yield request(pending), count
                pending, size, count = [], 0, 0
            pending += spans
            size += more
            count += 1
    if pending:
        yield request(pending), count


def post(endpoint: str, body: bytes, token: str | None = None, timeout: float = 30.0,
         sleep=time.sleep) -> ExportTraceServiceResponse:
    """POST one gzipped protobuf request to ``endpoint`` (…/v1/traces), retrying what OTLP says
    to retry; ExportError naming the endpoint otherwise."""
    if not endpoint.startswith(("http://", "https://")):
        raise ExportError(f"endpoint {endpoint!r}: only http:// or https:// OTLP endpoints")
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = gzip.compress(body)
    for attempt in range(1, MAX_TRIES + 1):
        req = urllib.request.Request(endpoint, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as reply:
                out = ExportTraceServiceResponse()
                out.ParseFromString(reply.read(1 << 20))
                return out
        except urllib.error.HTTPError as exc:
            if exc.code not in RETRY_STATUS or attempt == MAX_TRIES:
                raise ExportError(f"endpoint {endpoint}: HTTP {exc.code} "
                                  f"{exc.read(500).decode('utf-8', 'replace')!r}") from exc
            wait = exc.headers.get("Retry-After", "")
            sleep(min(float(wait) if wait.replace(".", "", 1).isdigit() else 2.0 ** attempt,
                      MAX_RETRY_AFTER))
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            if attempt == MAX_TRIES:
                raise ExportError(f"endpoint {endpoint}: {exc}") from exc
            sleep(min(2.0 ** attempt, MAX_RETRY_AFTER))
    raise AssertionError("unreachable")


def export_otlp(db_path, run_id: str, endpoint: str, filters: Filters = Filters(),
                token: str | None = None, timeout: float = 30.0) -> tuple[int, int]:
    """Send the selected trajectories; return (trajectories sent, spans the endpoint rejected
    as its partial_success says)."""
    sent = rejected = 0
    for req, count in run_requests(db_path, run_id, filters):
        reply = post(endpoint, req.SerializeToString(), token, timeout)
        rejected += reply.partial_success.rejected_spans
        sent += count
    return sent, rejected
