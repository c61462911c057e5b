"""Hostile import files, made by hand (no inspect-ai needed): minimal Inspect ``.eval`` logs with
chosen members, a log whose directory entries share one member's data, and peak-memory
measurement of a real ``python -m storage.io`` subprocess.

    python tests/hostile_imports.py KIND OUT        # writes one hostile file (see ``KINDS``)
    python tests/hostile_imports.py measure FILE    # its import's exit, peak RSS and time

Used by tests/test_import_bounds.py and by the figures in docs/threat-model.md.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# -- minimal Inspect logs ------------------------------------------------------------------------
def header(task: str = "hostile", model: str = "mockllm/model", eval_id: str = "e1") -> dict:
    """A finished log's ``header.json``: what storage/ingest/inspect_log.py reads of it."""
    return {"version": 2, "status": "success",
            "eval": {"task": task, "model": model, "eval_id": eval_id,
                     "scorers": [{"name": "match"}]},
            "results": {"scores": [{"name": "match",
                                    "metrics": {"accuracy": {"name": "accuracy", "value": 0.5}}}]}}


def sample(sid: str, answer: str = "5", epoch: int = 1, correct: bool = True, **extra) -> dict:
    """One sample and epoch: a question, a tool call, its result and an answer."""
    return {"id": sid, "epoch": epoch,
            "messages": [{"role": "user", "content": f"What is 2+3? ({sid})"},
                         {"role": "assistant", "content": "",
                          "tool_calls": [{"id": "c1", "function": "add",
                                          "arguments": {"x": 2, "y": 3}}]},
                         {"role": "tool", "tool_call_id": "c1", "function": "add",
                          "content": "5"},
                         {"role": "assistant", "content": answer}],
            "scores": {"match": {"value": "C" if correct else "I", "answer": answer}},
            "output": {"completion": answer, "choices": [{"stop_reason": "stop"}]}, **extra}


def write_eval(path: Path, samples: dict[str, bytes | dict], head: bytes | dict | None = None
               ) -> Path:
    """A ``.eval`` zip (deflate): ``header.json`` then one member per entry of ``samples``
    (``{id}_epoch_{n}`` -> JSON object or raw bytes)."""
    head = header() if head is None else head
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("header.json", head if isinstance(head, bytes) else json.dumps(head))
        for key, body in samples.items():
            z.writestr(f"samples/{key}.json", body if isinstance(body, bytes)
                       else json.dumps(body))
    return path


def share_member(path: Path, member: str, copies: int) -> Path:
    """Rewrite the zip at ``path`` so that ``copies`` more central directory entries, named
    ``samples/copy{i}_epoch_1.json``, all point at ``member``'s data (a zip bomb made of
    overlapping entries: the bytes are stored once and read once per entry)."""
    data = bytearray(path.read_bytes())
    end = data.rfind(b"PK\x05\x06")
    count, cd_size, cd_offset = struct.unpack_from("<HII", data, end + 10)
    directory = bytes(data[cd_offset:cd_offset + cd_size])
    at, entry = 0, None
    while at < len(directory):
        nlen, xlen, clen = struct.unpack_from("<HHH", directory, at + 28)
        if directory[at + 46:at + 46 + nlen].decode() == member:
            entry = directory[at:at + 46 + nlen + xlen + clen]
        at += 46 + nlen + xlen + clen
    assert entry is not None, member
    extra = b""
    for i in range(copies):
        name = f"samples/copy{i}_epoch_1.json".encode()
        fixed = bytearray(entry[:46])
        struct.pack_into("<HHH", fixed, 28, len(name), 0, 0)
        extra += bytes(fixed) + name
    record = bytearray(data[end:end + 22])
    struct.pack_into("<HHII", record, 8, count + copies, count + copies, cd_size + len(extra),
                     cd_offset)
    path.write_bytes(bytes(data[:cd_offset]) + directory + extra + bytes(record))
    return path


# -- the hostile files of issue 47 ----------------------------------------------------------------
def long_message_sample(sid: str, chars: int) -> dict:
    """A sample whose answer is ``chars`` characters of ``"a "``: one whitespace piece per 2."""
    return sample(sid, answer="a " * (chars // 2))


def kind_long_eval(out: Path, messages: int = 1, chars: int = 3_900_000) -> Path:
    """The ~23 KB ``.eval`` whose assistant message is 3.9M characters of ``"a "`` (1.95M
    whitespace pieces), ``messages`` such samples (8: the ~50 KB one)."""
    return write_eval(out, {f"long{i}_epoch_1": long_message_sample(f"long{i}", chars)
                            for i in range(messages)})


def kind_long_messages(out: Path, lines: int = 1, chars: int = 3_900_000) -> Path:
    """The same message as ``--format messages`` JSONL: ``lines`` lines of ~3.9 MB."""
    line = json.dumps({"messages": [{"role": "user", "content": "Say a lot."},
                                    {"role": "assistant", "content": "a " * (chars // 2)}],
                       "reward": 1.0})
    out.write_text((line + "\n") * lines, encoding="utf-8")
    return out


def kind_shared_eval(out: Path, copies: int = 128, member_mib: int = 255) -> Path:
    """The ~1.2 MB ``.eval`` whose directory has ``copies`` entries pointing at one member of
    ``member_mib`` MiB (valid JSON: a sample padded with spaces)."""
    body = json.dumps(sample("big")).encode()
    pad = member_mib * (1 << 20) - len(body)
    write_eval(out, {"big_epoch_1": body[:-1] + b" " * pad + b"}"})
    return share_member(out, "samples/big_epoch_1.json", copies)


def kind_deep_header(out: Path, depth: int = 100_000) -> Path:
    """A log whose ``header.json`` is ``depth`` nested brackets (RecursionError in json)."""
    return write_eval(out, {"a_epoch_1": sample("a")}, head=b"[" * depth + b"]" * depth)


def kind_costly_eval(out: Path, dicts: int = 1_999_000) -> Path:
    """A log whose sample keeps ``dicts`` empty objects in its metadata: by default just under
    the 2M JSON values one trajectory may hold (storage/interchange.py ``MAX_RECORD_VALUES``),
    each copied on its way to the store."""
    return write_eval(out, {"costly_epoch_1": sample("costly", metadata=[{}] * dicts)})


KINDS = {"long-eval": kind_long_eval, "costly-eval": kind_costly_eval, "long-eval-8": lambda out: kind_long_eval(out, 8),
         "long-messages": kind_long_messages,
         "long-messages-8": lambda out: kind_long_messages(out, 8),
         "shared-eval": kind_shared_eval, "deep-header": kind_deep_header}


# -- measuring a real import -----------------------------------------------------------------------
def peak_import(source: Path, store: Path, *args: str, timeout: float = 300,
                memory_mb: int | None = None) -> tuple[int, float, str]:
    """(exit status, peak RSS of the import in MB, its stderr) of ``python -m storage.io import
    SOURCE --db STORE ARGS`` run as a child, under an address-space limit of ``memory_mb`` when
    given. The peak is the child's VmHWM (/proc/self/status): getrusage's ru_maxrss is carried
    over exec from the process that spawned it, so a large test process would inflate it."""
    code = ("import resource, sys, runpy\n"
            "limit = int(sys.argv.pop(1))\n"
            "if limit: resource.setrlimit(resource.RLIMIT_AS, (limit << 20, limit << 20))\n"
            "sys.argv[0] = 'storage.io'\n"
            "try:\n"
            "    runpy.run_module('storage.io', run_name='__main__')\n"
            "finally:\n"
            "    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')]\n"
            "    sys.stderr.write('peak_rss_kb %s\\n' % hwm[0].split()[1])\n")
    proc = subprocess.run([sys.executable, "-c", code, str(memory_mb or 0), "import",
                           str(source), "--db", str(store), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    peak = [int(line.split()[1]) for line in proc.stderr.splitlines()
            if line.startswith("peak_rss_kb ")]
    return proc.returncode, (peak[-1] / 1024 if peak else float("nan")), proc.stderr


if __name__ == "__main__":
    if sys.argv[1] == "measure":  # python tests/hostile_imports.py measure FILE [IMPORT ARGS]
        started = time.monotonic()
        store = Path(tempfile.mkdtemp()) / "s.duckdb"
        code, peak, err = peak_import(Path(sys.argv[2]), store, *sys.argv[3:], timeout=3600)
        print(f"{Path(sys.argv[2]).name}: exit {code}, peak RSS {peak:,.0f} MB, "
              f"{time.monotonic() - started:.1f} s")
        print("\n".join(line for line in err.splitlines()[:3] if line.startswith("error")))
    else:
        KINDS[sys.argv[1]](Path(sys.argv[2]))
        print(f"{sys.argv[2]}: {os.path.getsize(sys.argv[2]):,} bytes")
