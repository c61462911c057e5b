"""Hostile clients of the OTLP receiver, second round: bytes that are not UTF-8 in one span of a
protobuf body (a Go or Rust exporter can send them) cost that string, not the request's other
spans; a body that is not protobuf at all stays a 400.
"""
from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from storage.otlp import Receiver
from storage.otlp.decode import parse_request
from storage.otlp.wire import repair_utf8
from tests.test_otlp_durable import chat_span
from tests.test_otlp_receiver import FAST, json_body, post, rows, wait_for


def _proto(*spans) -> bytes:
    msg, rejected = parse_request(json_body(*spans), "application/json", "traces")
    assert not rejected
    return msg.SerializeToString()


def test_invalid_utf8_in_one_protobuf_span_keeps_the_other_spans(tmp_path):
    db = tmp_path / "o.duckdb"
    bad, good = f"{1:032x}", f"{2:032x}"
    raw = _proto(chat_span(bad, "a" * 16, 10, "MARK"), chat_span(good, "b" * 16, 10, "fine"))
    raw = raw.replace(b"MARK", b"\xff\xfe\xc3(")  # same length: the framing stays valid
    r = Receiver(db, port=0, bounds=FAST).start()
    try:
        status, _, body = post(r, raw, "application/x-protobuf")
        assert status == 200, body
        wait_for(lambda: rows(db, "SELECT count(*) FROM trajectories")[0][0] == 2)
    finally:
        r.stop()
    assert sorted(t for t, in rows(db, "SELECT trace_id FROM spans")) == [bad, good]
    text = str(rows(db, "SELECT * FROM spans WHERE trace_id = ?", bad))
    assert "\ufffd" in text and "MARK" not in text


def test_the_repair_keeps_a_valid_message_byte_for_byte_and_refuses_garbage():
    raw = _proto(chat_span(f"{3:032x}", "c" * 16, 10, "héllo"))
    assert repair_utf8(raw, ExportTraceServiceRequest.DESCRIPTOR) == raw
    try:
        repair_utf8(b"\x0a\xff\xff\xff", ExportTraceServiceRequest.DESCRIPTOR)
    except ValueError as exc:
        assert "cut short" in str(exc)
    else:
        raise AssertionError("a cut-short body was repaired")


def test_a_protobuf_body_that_is_garbage_is_still_a_400(tmp_path):
    r = Receiver(tmp_path / "o.duckdb", port=0, bounds=FAST).start()
    try:
        status, _, body = post(r, b"\x0a\xff\xff\xff\xc3(", "application/x-protobuf")
    finally:
        r.stop()
    assert status == 400, body
