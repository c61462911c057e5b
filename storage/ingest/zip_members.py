"""Bounded reading of the members of a zip archive another program wrote (Inspect's ``.eval``).

Why not ``zipfile.ZipFile.open`` alone:
* Inspect 0.3.2xx compresses members with zstandard (method 93), which Python's zipfile reads
  only from 3.14 on. Here zstd is inflated with pyarrow's codec (already a dependency), deflate
  with zlib, stored members as they are.
* A log cut short (a crashed writer, a copy still under way) has no central directory, so zipfile
  cannot open it at all. Then the local headers are walked from the start: every member whole
  before the cut is read, and the cut one fails by name.
* A member's declared size is whatever the file says. Each member is inflated a chunk at a time
  and refused as soon as it passes ``max_member_bytes``, whatever it claims (zip bombs); the
  archive as a whole stops past ``max_total_bytes`` read, or past ``MAX_RATIO`` times the file's
  size (``MIN_INFLATED`` at least); the number of members is checked from
  the end record before zipfile parses the directory. The CRC-32 is checked at the end of each.

Errors: ``ZipError`` (the archive as a whole) and ``MemberError`` (one member), both naming the
file and, for a member, the member. ``parse_member`` reads a member as JSON, refusing one whose
parse would cost more than ``MAX_PARSE_BYTES`` (``parse_cost``), and turns any exception out of
the parse (RecursionError, MemoryError) into a ValueError naming the file and member.
"""
from __future__ import annotations

import io
import json
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STORED, DEFLATED, ZSTD = 0, 8, 93
MAX_MEMBER_BYTES = 256 * 1024 * 1024
MAX_TOTAL_BYTES = 32 * 1024 ** 3
MAX_RATIO = 50
MIN_INFLATED = 128 << 20
"""The members of one archive inflate to at most ``MAX_RATIO`` times the file's size (but
``MIN_INFLATED`` whatever the file, and never more than the total cap): what an import of it
then costs (its rows, and DuckDB's rewrite of the text the store's tables hold, which grows with
that text) grows with the file, not with how well it compresses. Inspect's JSON compresses 5-20
times; a sample of 3.9M characters of ``"a "`` 1,000 times, and 128 of them (a 1.5 MB ``.eval``)
once took 5.1 GB and 143 s."""
MAX_MEMBERS = 1_000_000
CHUNK = 1 << 20
LOCAL = struct.Struct("<4sHHHHHIIIHH")  # a local file header's fixed 30 bytes
END = b"PK\x05\x06"


class ZipError(ValueError):
    """The archive as a whole cannot be read (not a zip, too many members, over the total)."""


class MemberError(ValueError):
    """One member cannot be read (cut short, corrupt, over the cap, unknown compression)."""


@dataclass(frozen=True)
class Member:
    name: str
    method: int
    offset: int       # of its local header
    compressed: int   # -1: unknown (written as a stream, and the archive is cut)
    size: int         # as declared; never trusted for the cap
    crc: int


class _Slice(io.RawIOBase):
    """``length`` bytes of ``fp`` from ``start``, as a file (pyarrow reads zstd from it)."""

    def __init__(self, fp, start: int, length: int):
        self.fp, self.pos, self.left = fp, start, length

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        want = min(len(buf), self.left)
        if want <= 0:
            return 0
        self.fp.seek(self.pos)
        data = self.fp.read(want)
        buf[:len(data)] = data
        self.pos += len(data)
        self.left -= len(data)
        return len(data)


def _member_count(fp, size: int) -> int | None:
    """Entries the end record declares (zip64 too); None when there is no end record."""
    tail_len = min(size, 65535 + 22)
    fp.seek(size - tail_len)
    tail = fp.read(tail_len)
    at = tail.rfind(END)
    if at < 0 or at + 22 > len(tail):
        return None
    entries = struct.unpack_from("<H", tail, at + 10)[0]
    if entries == 0xFFFF and at >= 20 and tail[at - 20:at - 16] == b"PK\x06\x07":
        z64 = struct.unpack_from("<Q", tail, at - 20 + 8)[0]
        if 0 <= z64 <= size - 56:
            fp.seek(z64)
            record = fp.read(56)
            if record[:4] == b"PK\x06\x06":
                entries = struct.unpack_from("<Q", record, 32)[0]
    return entries


def _zip64_sizes(extra: bytes, usize: int, csize: int) -> tuple[int, int]:
    """Sizes from a local header's zip64 extra field (tag 1), in the order the spec gives."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        if tag == 1:
            values = list(struct.unpack_from(f"<{length // 8}Q", extra, pos + 4))
            if usize == 0xFFFFFFFF and values:
                usize = values.pop(0)
            if csize == 0xFFFFFFFF and values:
                csize = values.pop(0)
            break
        pos += 4 + length
    return usize, csize


def _walk_local_headers(fp, size: int) -> list[Member]:
    """Members from their local headers, front to back (an archive with no central directory)."""
    members, pos = [], 0
    while pos + LOCAL.size <= size and len(members) <= MAX_MEMBERS:
        fp.seek(pos)
        head = fp.read(LOCAL.size)
        sig, _, flags, method, _, _, crc, csize, usize, nlen, xlen = LOCAL.unpack(head)
        if sig != b"PK\x03\x04":
            break  # the (partial) central directory, or garbage: nothing more to find
        raw_name, extra = fp.read(nlen), fp.read(xlen)
        name = raw_name.decode("utf-8" if flags & 0x800 else "cp437", "replace")
        usize, csize = _zip64_sizes(extra, usize, csize)
        if flags & 0x08:  # sizes follow the data: unknowable without the directory
            members.append(Member(name, method, pos, -1, usize, crc))
            break
        members.append(Member(name, method, pos, csize, usize, crc))
        pos += LOCAL.size + nlen + xlen + csize
    if len(members) > MAX_MEMBERS:
        raise ZipError(f"more than {MAX_MEMBERS} members")
    return members


def _shared(members: list[Member]) -> dict[str, str]:
    """Members whose data overlaps another's -> the name of one they overlap. In a sound zip each
    member's bytes (its local header, then its data) end before the next member's start; entries
    pointing into one another's bytes would have the same data inflated once per entry (a 1.2 MB
    file whose entries all point at one 255 MiB member cost 106 s before the total stopped it).
    The span of each is taken from its offset and compressed size only, a lower bound of its
    true end, so a sound archive never has one."""
    spans = sorted((m.offset, m.offset + LOCAL.size + max(m.compressed, 0), m.name)
                   for m in members)
    shared: dict[str, str] = {}
    reach, owner = -1, ""
    for start, end, name in spans:
        if start < reach:
            shared[name] = owner
            shared.setdefault(owner, name)  # both sides are refused: neither is the sound one
        if end > reach:
            reach, owner = end, name
    return shared


class Archive:
    """The members of one zip file, read with caps. ``truncated``: no central directory was
    found, and the members come from the local headers (the last one may be cut)."""

    def __init__(self, path, max_member_bytes: int = MAX_MEMBER_BYTES,
                 max_total_bytes: int = MAX_TOTAL_BYTES, fp=None):
        """``fp``: the file already open (a follower's, checked to lie inside its directory);
        the archive closes it. ``path`` then only names it in messages."""
        self.path = Path(path)
        self.max_member, self.read_total = max_member_bytes, 0
        self.fp = fp if fp is not None else open(self.path, "rb")
        try:
            self.size = self.fp.seek(0, io.SEEK_END)
            # whichever is less: the total cap, or MAX_RATIO times the file (MIN_INFLATED at least)
            self.max_total = min(max_total_bytes, max(MIN_INFLATED, MAX_RATIO * self.size))
            self.total_cap = max_total_bytes
            self.members, self.truncated = self._directory()
        except BaseException:
            self.fp.close()
            raise
        if not self.members:
            self.fp.close()
            raise ZipError(f"{self.path.name}: not a zip archive (no member found)")

    def _directory(self) -> tuple[dict[str, Member], bool]:
        count = _member_count(self.fp, self.size)
        if count is not None and count > MAX_MEMBERS:
            raise ZipError(f"{self.path.name}: declares {count} members, over the limit of "
                           f"{MAX_MEMBERS}")
        found, truncated = None, count is None
        if not truncated:
            try:
                with zipfile.ZipFile(self.fp) as zf:
                    found = [Member(i.filename, i.compress_type, i.header_offset, i.compress_size,
                                    i.file_size, i.CRC) for i in zf.infolist()]
            except (zipfile.BadZipFile, ValueError, OSError, EOFError, struct.error):
                truncated = True  # a damaged directory: the local headers may still be whole
        if found is None:
            found = _walk_local_headers(self.fp, self.size)
        self.shared = _shared(found)
        # a name written twice (Inspect rewrites header.json in place): the later one counts
        return {m.name: m for m in found}, truncated

    def __enter__(self) -> "Archive":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.fp.close()

    def read(self, name: str) -> bytearray:
        """The member's bytes, or MemberError/ZipError naming the file, the member and why."""
        member = self.members[name]
        where = f"{self.path.name}: member {name}"
        if name in self.shared:
            raise MemberError(f"{where}: its data overlaps that of member {self.shared[name]} "
                              "(directory entries that share their bytes, as zip bombs do): "
                              "not read")
        if member.compressed < 0:
            raise MemberError(f"{where}: its sizes follow its data, and the archive is cut "
                              "short before its directory")
        self.fp.seek(member.offset)
        head = self.fp.read(LOCAL.size)
        if len(head) < LOCAL.size or head[:4] != b"PK\x03\x04":
            raise MemberError(f"{where}: no local header where the directory says")
        nlen, xlen = LOCAL.unpack(head)[9:11]
        start = member.offset + LOCAL.size + nlen + xlen
        if start + member.compressed > self.size:
            raise MemberError(f"{where}: cut short (the file ends "
                              f"{max(0, self.size - start)} bytes into its "
                              f"{member.compressed} compressed bytes)")
        out, crc = bytearray(), 0
        for chunk in self._inflate(member, _Slice(self.fp, start, member.compressed), where):
            out += chunk
            crc = zlib.crc32(chunk, crc)
            if len(out) > self.max_member:
                raise MemberError(f"{where}: more than {self.max_member} bytes uncompressed "
                                  f"(the limit for one member; it declares {member.size})")
            if self.read_total + len(out) > self.max_total:
                raise ZipError(f"{self.path.name}: its members hold more than "
                               f"{self.max_total} bytes uncompressed in all (the limit: "
                               f"{MAX_RATIO} times its {self.size} bytes, {MIN_INFLATED} at "
                               f"least, {self.total_cap} at most)")
        if crc != member.crc:
            raise MemberError(f"{where}: corrupt (CRC-32 {crc:08x}, expected {member.crc:08x})")
        self.read_total += len(out)
        return out  # json.loads reads a bytearray: no second copy of a large member

    def _inflate(self, member: Member, data: _Slice, where: str):
        if member.method == STORED:
            while chunk := data.read(CHUNK):
                yield chunk
        elif member.method == DEFLATED:
            inflater = zlib.decompressobj(-15)
            try:
                while raw := data.read(CHUNK):
                    while raw:  # at most CHUNK out per call, however much the input expands
                        yield inflater.decompress(raw, CHUNK)
                        raw = inflater.unconsumed_tail
                yield inflater.flush()
            except zlib.error as exc:
                raise MemberError(f"{where}: corrupt deflate data ({exc})") from None
            if not inflater.eof:
                raise MemberError(f"{where}: deflate data ends before its end marker")
        elif member.method == ZSTD:
            # deferred: pyarrow (large), only on the Arrow/Parquet path
            import pyarrow as pa
            try:
                stream = pa.CompressedInputStream(pa.PythonFile(data, mode="r"), "zstd")
                while chunk := stream.read(CHUNK):
                    yield chunk
            except (pa.ArrowException, OSError) as exc:
                raise MemberError(f"{where}: corrupt zstd data ({exc})") from None
        else:
            raise MemberError(f"{where}: compression method {member.method} is not one this "
                              "reader knows (stored 0, deflate 8, zstd 93)")


# -- members as JSON ------------------------------------------------------------------------------
MAX_PARSE_BYTES = 1 << 30
"""What parsing one member (or a ``.json`` log) may cost, as ``parse_cost`` estimates it."""


WIDE_UTF8 = re.compile(rb"[\xc4-\xef]|\\u")       # a character above U+00FF, or an escape
ASTRAL = re.compile(rb"[\xf0-\xf4]|\\u[dD][89abAB]")  # one above U+FFFF (a surrogate pair)


def parse_cost(data: bytes | bytearray) -> int:
    """An upper estimate of the memory ``json.loads(data)`` takes at its peak, in bytes, from a
    count of what it makes: each object or list (``{``, ``[``: 56-64 bytes in CPython and a slot
    in its parent, ~80 with growth), each string (a quote each side: ~50 bytes besides its
    text), each value and key (a comma, a colon: a slot, a float of 24), and the text twice (the
    decoded document and the strings cut from it) at 1, 2 or 4 bytes a character: CPython
    stores a string at the width of its widest character, so one emoji makes an ASCII document
    cost 8 times its size. JSON of ``{},`` costs ~25 times its size, one long ASCII string 2:
    the counts tell them apart before anything is parsed. Brackets and quotes inside strings
    count too, so the estimate errs high (checked shape by shape against tracemalloc:
    tests/test_import_bounds.py)."""
    width = 4 if ASTRAL.search(data) else 2 if WIDE_UTF8.search(data) else 1
    containers = data.count(b"{") + data.count(b"[")
    return (2 * width * len(data) + 80 * containers + 40 * data.count(b'"')
            + 40 * data.count(b",") + 16 * data.count(b":") + (1 << 16))


def check_parse_cost(data: bytes | bytearray, where: str, limit: int = MAX_PARSE_BYTES) -> None:
    """ValueError naming ``where`` when parsing ``data`` would cost more than ``limit``."""
    cost = parse_cost(data)
    if cost > limit:
        raise ValueError(f"{where}: {len(data)} bytes of JSON that would take about "
                         f"{cost >> 20} MiB to parse (more than the limit of {limit >> 20} MiB: "
                         "mostly tiny objects or lists)")


def parse_member(archive: "Archive", name: str) -> Any:
    """The JSON of one member, or an exception naming the file and the member: MemberError,
    ZipError (the archive's total), ValueError (bad JSON or UTF-8, nested too deeply, too costly
    to parse; MemoryError and RecursionError become it)."""
    data = archive.read(name)
    where = f"{archive.path.name}: member {name}"
    try:
        check_parse_cost(data, where)
        return json.loads(data)
    except ValueError as exc:
        if str(exc).startswith(where):
            raise
        raise ValueError(f"{where}: not valid JSON ({exc})") from None
    except Exception as exc:  # RecursionError, MemoryError: this member only
        raise ValueError(f"{where}: not valid JSON ({json_error(exc)})") from None


def json_error(exc: BaseException) -> str:
    """What went wrong parsing JSON, said briefly."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, MemoryError):
        return "out of memory parsing it"
    return f"{exc}" if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
