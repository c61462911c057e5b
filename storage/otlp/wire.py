"""Invalid UTF-8 in a protobuf body's string fields becomes U+FFFD, the rest of the body kept.

protobuf refuses a whole message for one string field that is not UTF-8 (a Go or Rust exporter
can send such bytes; Python's cannot), which would refuse every other span of the request. The
JSON path already replaces a lone surrogate with U+FFFD; this gives protobuf the same rule. It
walks the wire format once against the message's descriptor (linear in the body), re-encoding
only string fields, and is called only after a parse failed.
"""
from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor

MAX_DEPTH = 100  # protobuf's own recursion limit for parsing


class WireError(ValueError):
    """The body is not a protobuf message at all (not only a bad string)."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise WireError("a varint is cut short")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _put_varint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def repair_utf8(raw: bytes, descriptor, depth: int = 0) -> bytes:
    """``raw`` with every string field of ``descriptor``'s message (nested included) valid UTF-8."""
    if depth > MAX_DEPTH:
        raise WireError("the message is nested too deeply")
    out, i, n = bytearray(), 0, len(raw)
    while i < n:
        start = i
        tag, i = _varint(raw, i)
        number, wire, tag_end = tag >> 3, tag & 7, i
        if wire == 0:
            _, i = _varint(raw, i)
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        elif wire == 2:
            size, i = _varint(raw, i)
            chunk, end = raw[i:i + size], i + size
            if end > n:
                raise WireError("a field is cut short")
            field = descriptor.fields_by_number.get(number)
            if field is not None and field.type == FieldDescriptor.TYPE_STRING:
                chunk = chunk.decode("utf-8", "replace").encode("utf-8")
            elif field is not None and field.type == FieldDescriptor.TYPE_MESSAGE:
                chunk = repair_utf8(chunk, field.message_type, depth + 1)
            out += raw[start:tag_end]
            _put_varint(len(chunk), out)
            out += chunk
            i = end
            continue
        else:
            raise WireError(f"wire type {wire} is not used by OTLP")
        if i > n:
            raise WireError("a field is cut short")
        out += raw[start:i]
    return bytes(out)

