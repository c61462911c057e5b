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


def test_big_compressed_bodies_are_decoded_and_stored_a_few_at_a_time(tmp_path):
    """20 gzip bodies of 61 KB, 60 MB inflated each, sent at once took the receiver past 8 GB:
    every one was decoded at the same time. Now at most BIG_AT_ONCE are, and every one is kept."""
    import gzip
    import threading

    from storage.otlp.receiver import BIG_AT_ONCE
    db = tmp_path / "o.duckdb"
    r = Receiver(db, port=0, bounds=FAST).start()
    decode, now, most, lock = r._decode, [0], [0], threading.Lock()

    def counted(*a):  # the real decode, counting how many run at once
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        try:
            return decode(*a)
        finally:
            with lock:
                now[0] -= 1
    r._decode = counted
    bodies = [gzip.compress(json_body(chat_span(f"{i + 1:032x}", f"{i + 1:016x}", 10,
                                                "z" * (4 << 20))), 1) for i in range(8)]
    got = []
    threads = [threading.Thread(target=lambda b=b: got.append(post(
        r, b, "application/json", headers={"Content-Encoding": "gzip"})[0])) for b in bodies]
    try:
        [t.start() for t in threads]
        [t.join() for t in threads]
    finally:
        r.stop()
    assert got == [200] * 8
    assert 1 <= most[0] <= BIG_AT_ONCE == 2
    assert rows(db, "SELECT count(*) FROM spans")[0][0] == 8
