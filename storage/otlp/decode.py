"""OTLP/HTTP request bodies -> plain span and log records (``Span``, ``LogRecord``).

A body is protobuf (``application/x-protobuf``) or JSON (``application/json``), optionally
gzip-compressed (``Content-Encoding: gzip``). Both are parsed with the official classes of
``opentelemetry-proto``. OTLP/JSON writes trace and span ids as hex (the OTLP specification's
one exception to the protobuf JSON mapping), while ``json_format`` expects base64 for ``bytes``
fields: the ids are checked and converted before ``ParseDict`` sees them.

What makes a whole body unreadable is a ``BodyError`` (the receiver answers 400, or 413 for a body
that inflates past its cap); what makes one span or log record unusable (an id of the wrong
length) rejects that record alone: it is counted and named in ``Decoded.rejected`` and the
receiver's ``partial_success``.

Depth: protobuf's parser refuses messages nested past its recursion limit (100), and Python's
``json`` raises ``RecursionError`` on deeply nested arrays (100k ``[``): both are a 400. An
attribute value is converted to Python at most ``MAX_VALUE_DEPTH`` levels deep; deeper it is
kept as its protobuf JSON text, cut at ``MAX_VALUE_CHARS``.
"""
from __future__ import annotations

import base64
import json
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from storage.otlp.wire import repair_utf8
from storage.recorder import clean_text

MAX_VALUE_DEPTH = 16
MAX_VALUE_CHARS = 1 << 20
TRACE_ID_BYTES, SPAN_ID_BYTES = 16, 8


class BodyError(ValueError):
    """A body that cannot be read at all; ``status`` is the HTTP answer (400 or 413)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class Span:
    """One span as the assembly reads it; ids are lowercase hex, times Unix nanoseconds."""
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope: str
    status_code: int = 0
    status_message: str = ""
    events: list[dict] = field(default_factory=list)


@dataclass
class LogRecord:
    """One log record (GenAI event mode: ``gen_ai.client.inference.operation.details``)."""
    trace_id: str
    span_id: str
    time_ns: int
    event_name: str
    body: Any
    attributes: dict[str, Any]
    resource: dict[str, Any]


@dataclass
class Decoded:
    """What one request held: the usable records and, per rejected one, why (``rejected``)."""
    spans: list[Span] = field(default_factory=list)
    logs: list[LogRecord] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)


# -- body bytes ---------------------------------------------------------------------------------------
def inflate(body: bytes, encoding: str, cap: int) -> bytes:
    """``body`` decompressed (gzip or deflate), refusing more than ``cap`` bytes (413)."""
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise BodyError(f"Content-Encoding {encoding!r} is not supported (gzip, deflate)", 415)
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, cap + 1)
    except zlib.error as exc:
        raise BodyError(f"the {encoding} body does not decompress: {exc}") from None
    if len(out) > cap or inflater.unconsumed_tail:
        raise BodyError(f"the {encoding} body inflates past the limit of {cap} bytes", 413)
    if not inflater.eof:
        raise BodyError(f"the {encoding} body is cut short")
    return out


def _media(content_type: str) -> str:
    media = (content_type or "").split(";")[0].strip().lower()
    if media in ("application/x-protobuf", "application/protobuf"):
        return "protobuf"
    if media == "application/json":
        return "json"
    raise BodyError(f"Content-Type {content_type!r} is not OTLP (application/x-protobuf or "
                    "application/json)", 415)


def parse_request(raw: bytes, content_type: str, signal: str):
    """The ``Export{Trace,Logs}ServiceRequest`` in ``raw`` and how many records the JSON pre-pass
    rejected (their reasons), or BodyError."""
    cls = ExportTraceServiceRequest if signal == "traces" else ExportLogsServiceRequest
    msg, rejected = cls(), []
    if _media(content_type) == "protobuf":
        try:
            msg.ParseFromString(raw)
        except (DecodeError, RecursionError, ValueError) as exc:
            if "UTF-8" not in str(exc):
                raise BodyError(f"not an OTLP {signal} protobuf message: {exc}") from None
            try:  # one string that is not UTF-8 costs that string (U+FFFD), not the body
                msg = cls()
                msg.ParseFromString(repair_utf8(raw, cls.DESCRIPTOR))
            except (DecodeError, RecursionError, ValueError) as exc2:
                raise BodyError(f"not an OTLP {signal} protobuf message: {exc2}") from None
        return msg, rejected
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BodyError(f"the JSON body is not UTF-8 (bad byte at {exc.start})") from None
    except RecursionError:
        raise BodyError("the JSON body is nested too deeply") from None
    except ValueError as exc:
        raise BodyError(f"the JSON body does not parse: {str(exc)[:200]}") from None
    if not isinstance(obj, dict):
        raise BodyError(f"the JSON body must be an object, not {type(obj).__name__}")
    if _SURROGATE.search(raw):  # "\ud800" parses to a lone surrogate, which no string field
        obj = _clean_strings(obj)  # takes: the recorder's rule (U+FFFD), not a refused body
    rejected = _hex_ids_to_base64(obj, signal)
    try:
        json_format.ParseDict(obj, msg, ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError, ValueError, TypeError) as exc:
        raise BodyError(f"not an OTLP {signal} JSON message: {str(exc)[:300]}") from None
    return msg, rejected


_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _clean_strings(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if depth > 200:  # deeper than the parser goes: left for it to refuse
        return value
    if isinstance(value, dict):
        return {clean_text(k): _clean_strings(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean_strings(v, depth + 1) for v in value]
    return value


# -- JSON ids: hex on the wire, base64 for json_format ---------------------------------------------------
def _b64(hex_id: Any, size: int, required: bool) -> str | None:
    """base64 of a hex id of ``size`` bytes ('' for an absent optional one); None if invalid."""
    if hex_id in (None, "") and not required:
        return ""
    if not isinstance(hex_id, str) or len(hex_id) != 2 * size:
        return None
    try:
        return base64.b64encode(bytes.fromhex(hex_id)).decode()
    except ValueError:
        return None


def _shown(value: Any) -> str:
    return repr(value)[:80]


def _hex_ids_to_base64(obj: dict, signal: str) -> list[str]:
    """Convert every record's ids in place; drop (and name) records whose ids are not hex of
    the right length."""
    rejected = []
    outer, inner, records = (("resourceSpans", "scopeSpans", "spans") if signal == "traces"
                             else ("resourceLogs", "scopeLogs", "logRecords"))
    for res in _list(obj.get(outer) or obj.get(_snake(outer))):
        for scope in _list(res.get(inner) or res.get(_snake(inner))) if isinstance(res, dict) else ():
            if not isinstance(scope, dict):
                continue
            key = records if records in scope else _snake(records)
            kept = []
            for rec in _list(scope.get(key)):
                why = _convert_ids(rec, signal) if isinstance(rec, dict) else "not an object"
                if why:
                    rejected.append(why)
                else:
                    kept.append(rec)
            if key in scope:
                scope[key] = kept
    return rejected


def _convert_ids(rec: dict, signal: str) -> str | None:
    required = signal == "traces"
    ids = [("traceId", TRACE_ID_BYTES, required), ("spanId", SPAN_ID_BYTES, required)]
    if signal == "traces":
        ids.append(("parentSpanId", SPAN_ID_BYTES, False))
    for name, size, req in ids:
        key = name if name in rec else _snake(name)
        converted = _b64(rec.get(key), size, req)
        if converted is None:
            return (f"{'span' if signal == 'traces' else 'log record'} "
                    f"{_shown(rec.get('name', rec.get('spanId', '')))} of trace "
                    f"{_shown(rec.get('traceId'))}: {name} {_shown(rec.get(key))} is not "
                    f"{2 * size} hex digits")
        rec[key] = converted
    for link in _list(rec.get("links")):
        if isinstance(link, dict):
            link["traceId"] = _b64(link.get("traceId"), TRACE_ID_BYTES, False) or ""
            link["spanId"] = _b64(link.get("spanId"), SPAN_ID_BYTES, False) or ""
    return None


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


# -- protobuf -> plain records ------------------------------------------------------------------------
def any_value(v, depth: int = 0) -> Any:
    """An OTLP ``AnyValue`` as Python (str, bool, int, float, list, dict, bytes as hex)."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(v, kind)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    if depth >= MAX_VALUE_DEPTH:
        return json_format.MessageToJson(v, indent=None)[:MAX_VALUE_CHARS]
    if kind == "array_value":
        return [any_value(x, depth + 1) for x in v.array_value.values]
    return {kv.key: any_value(kv.value, depth + 1) for kv in v.kvlist_value.values}


def attributes(kvs) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def _id(raw: bytes, size: int, required: bool) -> str | None:
    if not raw and not required:
        return ""
    return raw.hex() if len(raw) == size else None


def spans_of(msg: ExportTraceServiceRequest, out: Decoded) -> None:
    for rs in msg.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                tid, sid = _id(s.trace_id, TRACE_ID_BYTES, True), _id(s.span_id, SPAN_ID_BYTES, True)
                parent = _id(s.parent_span_id, SPAN_ID_BYTES, False)
                if tid is None or sid is None or parent is None:
                    out.rejected.append(
                        f"span {s.name[:80]!r} of trace {s.trace_id.hex()[:64] or '(none)'}: ids "
                        f"must be {TRACE_ID_BYTES}/{SPAN_ID_BYTES} bytes, got trace "
                        f"{len(s.trace_id)}, span {len(s.span_id)}, parent "
                        f"{len(s.parent_span_id)}")
                    continue
                out.spans.append(Span(
                    tid, sid, parent, s.name, s.kind, s.start_time_unix_nano,
                    s.end_time_unix_nano, attributes(s.attributes), resource, ss.scope.name,
                    s.status.code, s.status.message,
                    [{"name": e.name, "time_ns": e.time_unix_nano,
                      "attributes": attributes(e.attributes)} for e in s.events]))


def logs_of(msg: ExportLogsServiceRequest, out: Decoded) -> None:
    for rl in msg.resource_logs:
        resource = attributes(rl.resource.attributes)
        for sl in rl.scope_logs:
            for r in sl.log_records:
                tid, sid = _id(r.trace_id, TRACE_ID_BYTES, False), _id(r.span_id, SPAN_ID_BYTES, False)
                if tid is None or sid is None:
                    out.rejected.append(f"log record {r.event_name[:80]!r}: trace/span ids must "
                                        f"be {TRACE_ID_BYTES}/{SPAN_ID_BYTES} bytes, got "
                                        f"{len(r.trace_id)}/{len(r.span_id)}")
                    continue
                out.logs.append(LogRecord(tid, sid, r.time_unix_nano or r.observed_time_unix_nano,
                                          r.event_name, any_value(r.body),
                                          attributes(r.attributes), resource))


def decode(body: bytes, content_type: str, encoding: str, signal: str, cap: int) -> Decoded:
    """The records of one ``/v1/traces`` or ``/v1/logs`` body (see the module docstring)."""
    raw = inflate(body, encoding, cap)
    msg, rejected = parse_request(raw, content_type, signal)
    out = Decoded(rejected=list(rejected))
    (spans_of if signal == "traces" else logs_of)(msg, out)
    return out


def response_body(signal: str, rejected: int, message: str, as_json: bool) -> bytes:
    """An ``Export{Trace,Logs}ServiceResponse`` with ``partial_success`` when anything was
    rejected, in the request's encoding."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
    if signal == "traces":
        resp = ExportTraceServiceResponse()
        if rejected:
            resp.partial_success.rejected_spans = rejected
    else:
        resp = ExportLogsServiceResponse()
        if rejected:
            resp.partial_success.rejected_log_records = rejected
    if rejected or message:
        resp.partial_success.error_message = message
    if as_json:
        return json_format.MessageToJson(resp, indent=None).encode()
    return resp.SerializeToString()


def status_body(message: str, as_json: bool) -> bytes:
    """A ``google.rpc.Status`` carrying ``message`` (the OTLP/HTTP error body). Written by hand
    (field 2, a string) so the receiver needs no googleapis-common-protos."""
    if as_json:
        return json.dumps({"message": message}).encode()
    text = message.encode("utf-8", "replace")
    size, varint = len(text), bytearray()
    while True:
        byte, size = size & 0x7F, size >> 7
        varint.append(byte | (0x80 if size else 0))
        if not size:
            break
    return b"\x12" + bytes(varint) + text
