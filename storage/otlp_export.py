"""Export a run as OpenTelemetry spans over OTLP/HTTP, so trace viewers (Phoenix, Jaeger, Tempo,
any OpenTelemetry Collector) show it, and so this product's own receiver (``agentrl otlp``)
reads it back.

One trajectory is one trace (its id derived from run and trajectory, so re-exporting sends the
same ids):

    rl.sample            the root: agentrl.* (reward, success, task_id, group_id, split, step,
                         traj_id), rl.reward.<component> for each reward component, failure class,
                         finish reason; gen_ai.conversation.id = the trajectory id
                         (task_id, group_id, split and step are on every span: a collector
                         that splits a trace hands the receiver its task with any span)
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

Every door bounded: http(s) endpoints only, at most 4 MiB of protobuf a request (gzip), retries
on 429/502/503/504 honouring Retry-After (at most 30 s, 5 tries), and an error naming the endpoint
and the HTTP status. The rules of the endpoint client, through the same code
(storage/http_client.py):

* **one deadline per request** (``timeout``, ``--timeout``): from connect to the answer's last
  byte, however the collector paces its bytes (a per-read timeout lets a byte every 2 s hang it
  for ever); past it the request is cut and the export fails naming the deadline, not retried.
* **no redirect is followed**: a 3xx is an error naming the URL it points to, so the bearer token
  never goes to another URL (urllib re-sends every header to whatever host a 302 names).
* **success is the collector's answer**: a 200 whose body is an ``ExportTraceServiceResponse``
  (protobuf, at most 1 MiB); a 200 that is a web page, JSON or garbage is an error, and spans the
  collector says it rejected (``partial_success``) fail the export (``ExportRejected``) after
  every request was sent, with its count and message.
"""
from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import ssl
import time
import urllib.error
import urllib.parse
from typing import Iterator

from google.protobuf.message import DecodeError

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from storage import db, http_client
from storage.export import Filters, _records, _run_config, selected_ids

MAX_REQUEST_BYTES = 4 << 20
RETRY_STATUS = (429, 502, 503, 504)
MAX_TRIES = 5
MAX_RETRY_AFTER = 30.0
MAX_ANSWER_BYTES = 1 << 20
"""An ExportTraceServiceResponse is a count and a message: a longer answer is not one."""
OTLP_TYPES = ("application/x-protobuf", "application/protobuf")
SECOND = 1_000_000_000


class ExportError(RuntimeError):
    """An export that could not be delivered, naming the endpoint."""


class ExportRejected(ExportError):
    """Every request was answered, but the collector rejected ``rejected`` of the ``spans``
    sent (its ``partial_success``): those are not stored there."""

    def __init__(self, endpoint: str, sent: int, spans: int, rejected: int, message: str):
        super().__init__(f"endpoint {endpoint} rejected {rejected} of {spans} spans"
                         + (f" ({message[:300]!r})" if message else "")
                         + f"; the {sent} trajectories sent are not all stored there")
        self.sent, self.spans, self.rejected, self.message = sent, spans, rejected, message


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
    identity = {"agentrl.task_id": rec.get("task_id"), "agentrl.group_id": rec.get("group_id"),
                "agentrl.split": rec.get("split"), "agentrl.step": rec.get("step")}
    root = {"agentrl.traj_id": traj, **identity, "agentrl.reward": rec.get("reward"),
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
                **identity, "gen_ai.operation.name": "chat", "gen_ai.provider.name": "agentrl",
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
                attributes=_attrs({**identity, "gen_ai.operation.name": "execute_tool",
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


_OPENER = http_client.opener(redirects="none")  # a 3xx comes back as an HTTPError: post()


def _exchange(endpoint: str, data: bytes, headers: dict, timeout: float):
    """(status, headers, body up to MAX_ANSWER_BYTES + 1) of one POST within ``timeout`` in
    all (storage/http_client.py ``Deadline``); TimeoutError past it; OSError when no answer
    came."""
    req = http_client.request(endpoint, http_client.Deadline(timeout), data, headers, "POST")
    try:
        try:
            with _OPENER.open(req, timeout=timeout) as reply:
                return reply.status, reply.headers, _read(reply)
        except urllib.error.HTTPError as exc:  # not 2xx: still an answer, maybe with a body
            with exc:
                return exc.code, exc.headers, _read(exc.fp) if exc.fp else b""
    except (OSError, http.client.HTTPException) as exc:
        # every socket operation waits at most the time left: its timeout is the deadline
        if isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
            raise TimeoutError(f"no complete answer within {timeout:g} s (--timeout)") from exc
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ssl.SSLError):  # sending again meets the same server: no retry
            hint = ("; is it an http:// endpoint?" if "WRONG_VERSION_NUMBER" in str(reason)
                    else "")
            raise ExportError(f"endpoint {endpoint}: TLS failed ({reason}){hint}") from exc
        raise OSError(str(exc) or type(exc).__name__) from exc


def _read(reply: http.client.HTTPResponse) -> bytes:
    """The answer's body, up to MAX_ANSWER_BYTES + 1; a body cut short (the server closing
    early) is an error, not a shorter answer."""
    body = reply.read(MAX_ANSWER_BYTES + 1)
    if len(body) <= MAX_ANSWER_BYTES and reply.length:  # bytes announced and never sent
        raise http.client.IncompleteRead(body, reply.length)
    return body


def _answer(endpoint: str, headers, body: bytes) -> ExportTraceServiceResponse:
    """The 200's body as the collector's ExportTraceServiceResponse, or why it is not one."""
    kind = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if kind and kind not in OTLP_TYPES:
        raise ExportError(f"endpoint {endpoint}: answered 200 with Content-Type {kind!r}, not an "
                          f"OTLP response ({body[:120]!r}); is this the collector's "
                          "…/v1/traces URL?")
    if len(body) > MAX_ANSWER_BYTES:
        raise ExportError(f"endpoint {endpoint}: answered 200 with over {MAX_ANSWER_BYTES} "
                          "bytes, not an OTLP response")
    out = ExportTraceServiceResponse()
    try:
        out.ParseFromString(body)
    except DecodeError as exc:
        raise ExportError(f"endpoint {endpoint}: answered 200 with a body that is not an "
                          f"ExportTraceServiceResponse ({body[:120]!r})") from exc
    return out


def check_endpoint(endpoint: str) -> None:
    """ExportError, before anything is sent, for a URL that can never be right: not http(s), no
    host, a port that is not a number, spaces or control characters, or a user or password in
    it (those are refused and never echoed: the message shows ``***``; a token goes in
    AGENTRL_OTLP_TOKEN). Without this each was tried five times over 30 s of back-off, and the
    error printed the password."""
    if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
        raise ExportError(f"endpoint {endpoint!r}: only http:// or https:// OTLP endpoints")
    parts = urllib.parse.urlsplit(endpoint)
    if "@" in parts.netloc:
        shown = parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()
        raise ExportError(f"endpoint {shown!r}: a user or password in the URL is not sent; "
                          "give a bearer token in AGENTRL_OTLP_TOKEN instead")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in endpoint):
        raise ExportError(f"endpoint {endpoint!r}: a URL holds no spaces or control characters")
    try:
        port = parts.port
    except ValueError as exc:
        raise ExportError(f"endpoint {endpoint!r}: {exc}") from None
    if not parts.hostname or port == 0:
        raise ExportError(f"endpoint {endpoint!r}: no host (or port 0) in the URL")


MAX_TIMEOUT_S = 86400.0


def check_timeout(timeout) -> None:
    """ExportError unless ``timeout`` (``--timeout``) is a number of seconds in (0, 86400]: nan,
    0 or -1 read as "no complete answer within nan s", inf as an OverflowError."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not 0 < timeout <= MAX_TIMEOUT_S:
        raise ExportError(f"--timeout {timeout!r}: must be seconds in (0, {MAX_TIMEOUT_S:g}]")


def post(endpoint: str, body: bytes, token: str | None = None, timeout: float = 30.0,
         sleep=time.sleep) -> ExportTraceServiceResponse:
    """POST one gzipped protobuf request to ``endpoint`` (…/v1/traces) within ``timeout`` in all,
    retrying what OTLP says to retry; the collector's answer, else ExportError naming the
    endpoint (see the module docstring)."""
    check_endpoint(endpoint)
    check_timeout(timeout)
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = gzip.compress(body)
    for attempt in range(1, MAX_TRIES + 1):
        try:
            status, reply_headers, raw = _exchange(endpoint, data, headers, timeout)
        except TimeoutError as exc:  # a collector this slow is not helped by sending again
            raise ExportError(f"endpoint {endpoint}: {exc}") from exc
        except OSError as exc:
            if attempt == MAX_TRIES:
                raise ExportError(f"endpoint {endpoint}: {exc}") from exc
            sleep(min(2.0 ** attempt, MAX_RETRY_AFTER))
            continue
        if 300 <= status < 400:
            raise ExportError(f"endpoint {endpoint}: HTTP {status} redirect to "
                              f"{reply_headers.get('Location')!r} not followed (the token is "
                              "never sent on to another URL); export to the URL it names")
        if status in RETRY_STATUS and attempt < MAX_TRIES:
            wait = reply_headers.get("Retry-After", "")
            sleep(min(float(wait) if wait.replace(".", "", 1).isdigit() else 2.0 ** attempt,
                      MAX_RETRY_AFTER))
            continue
        if status != 200:
            raise ExportError(f"endpoint {endpoint}: HTTP {status} "
                              f"{raw[:500].decode('utf-8', 'replace')!r}")
        return _answer(endpoint, reply_headers, raw)
    raise AssertionError("unreachable")


def export_otlp(db_path, run_id: str, endpoint: str, filters: Filters = Filters(),
                token: str | None = None, timeout: float = 30.0,
                allow_rejected: bool = False) -> tuple[int, int]:
    """Send the selected trajectories; return (trajectories sent, spans the collector rejected).
    Rejected spans raise ``ExportRejected`` once every request was sent, unless
    ``allow_rejected`` (then they are only counted)."""
    check_endpoint(endpoint)  # before the store is read
    check_timeout(timeout)
    sent = rejected = spans = 0
    message = ""
    for req, count in run_requests(db_path, run_id, filters):
        reply = post(endpoint, req.SerializeToString(), token, timeout)
        rejected += reply.partial_success.rejected_spans
        message = message or reply.partial_success.error_message
        spans += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        sent += count
    if rejected and not allow_rejected:
        raise ExportRejected(endpoint, sent, spans, rejected, message)
    return sent, rejected
