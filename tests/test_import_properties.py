"""Issue 47: property tests over each importer's record shape. Any mutation of a valid record
(a value replaced by a hostile one: NaN, huge or non-finite numbers, the strings export writes for
them, long texts of many words, deep nesting, thousands of tiny objects, lone surrogates; a key
deleted or added; a list repeated) written between two good records either imports or fails
alone, named where it is, the good ones importing beside it, and the import's Python-side
memory (tracemalloc's peak) stays within the bound docs/threat-model.md states:
``WORKING_BASE + WORKING_FACTOR x`` the file's size.

Each importer: generic JSONL, chat messages JSONL, verl dumps and Inspect ``.eval`` samples,
through the same entry point the command line uses (``storage.ingest.import_file``) into a real
store.
"""
from __future__ import annotations

import json
import re
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import db, ingest
from tests.hostile_imports import header, sample, write_eval

WORKING_BASE = 64 << 20
WORKING_FACTOR = 40
"""docs/threat-model.md: an import's Python-side working memory is at most ~64 MiB (a chunk of
token rows, the batch) plus ~40 times the line or member it is reading (parsing JSON of tiny
objects costs ~25-31 times its size; the rest is its rows)."""

# -- hostile values ----------------------------------------------------------------------------
LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "", "attachment://h", "\ud800x", "a\x00b",
                     "user", "assistant", "tool", "C", "I", "-1e999", "0.5"]),
    st.text(max_size=20))
LONG_TEXT = st.integers(0, 300_000).map(lambda n: "a " * n)           # up to 600 KB of words
DEEP = st.integers(1, 3_000).map(lambda d: f"\x01DEEP{d}\x01")  # written as d nested lists
TINY_MANY = st.integers(0, 40_000).map(lambda n: [{}] * n)
SMALL_JSON = st.recursive(LEAVES, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)),
    max_leaves=12)
HOSTILE = st.one_of(LEAVES, LONG_TEXT, DEEP, TINY_MANY, SMALL_JSON)


def _paths(value: Any, at: tuple = ()) -> list[tuple]:
    """Every place in ``value`` (the root included)."""
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, at + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:8]):
            out += _paths(v, at + (i,))
    return out


@st.composite
def mutated(draw, record: dict) -> Any:
    """``record`` with one mutation at one place."""
    value = json.loads(json.dumps(record))
    path = draw(st.sampled_from(_paths(value)))
    kind = draw(st.sampled_from(["replace", "replace", "delete", "add", "repeat"]))
    if not path:
        return draw(HOSTILE) if kind == "replace" else value
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    if kind == "delete" and isinstance(parent, dict):
        del parent[key]
    elif kind == "add" and isinstance(parent, dict):
        parent[draw(st.text(max_size=12))] = draw(HOSTILE)
    elif kind == "repeat" and isinstance(parent[key], list):
        parent[key] = parent[key] * draw(st.integers(0, 2_000))
    else:
        parent[key] = draw(HOSTILE)
    return value


# -- valid records, one per importer ------------------------------------------------------------
GENERIC = {"traj_id": "mut", "task_id": "q", "step": 1, "reward": 1.0, "prompt": "Who wrote Dune?",
           "rewards": {"outcome": 1.0, "format": 0.0, "cost": 0.0, "process": 0.0},
           "turns": [{"action": "<answer>Frank Herbert</answer>", "observation": "ok"}],
           "tokens": [{"text": "Who", "role": "prompt"},
                      {"text": "<answer>", "role": "action", "trained": True, "logprob": -0.1,
                       "train_logprob": -0.12, "token_id": 7, "turn": 0}],
           "info": {"k": [1, 2]}, "success": True}
MESSAGES = {"messages": [{"role": "user", "content": "What is 2+3?"},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "c1", "type": "function",
                              "function": {"name": "add", "arguments": "{\"x\": 2, \"y\": 3}"}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "5"},
                         {"role": "assistant", "content": "5"}],
            "reward": 1.0, "task_id": "add"}
VERL = {"input": "Q?", "output": "<search>q</search><information>d</information>"
                                 "<answer>4</answer>", "gts": ["4"], "score": 1.0, "acc": 1}
INSPECT = sample("mut", metadata={"k": "v"})

COMMON = settings(max_examples=25, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("props") / "s.duckdb"


def _dump(record: Any) -> bytes:
    """JSON of ``record`` (NaN/Infinity as the bare literals, which are refused; lone surrogates
    as escapes), with each DEEP marker written as that many nested lists."""
    text = json.dumps(record)
    return re.sub(r'"\\u0001DEEP(\d+)\\u0001"', lambda m: "[" * int(m[1]) + "]" * int(m[1]),
                  text).encode()


def _lines(path: Path, records: list) -> Path:
    path.write_bytes(b"".join(_dump(r) + b"\n" for r in records))
    return path


def _import(source: Path, store: Path, fmt: str):
    """(report, stored traj ids, Python peak bytes) of one import into a run of its own."""
    run_id = f"p-{uuid.uuid4().hex[:12]}"
    tracemalloc.start()
    try:
        report = ingest.import_file(source, store, fmt, run_id=run_id)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    with db.reading(store) as con:
        ids = {r[0] for r in con.execute("SELECT traj_id FROM trajectories WHERE run_id = ?",
                                         [run_id]).fetchall()}
    return report, ids, peak


def _check(report, ids, peak, size: int, goods: set, bad_where: str) -> None:
    """The good ones imported whatever is beside them; the mutated one imported too (one more
    trajectory) or failed alone, named; the memory within the bound."""
    assert goods <= ids, (report.errors, ids)
    assert report.lines == 3 and report.imported + report.failed == 3, report
    if ids - goods:
        assert len(ids - goods) == 1 and report.failed == 0, (ids, report.errors)
    else:
        assert report.failed == 1 and report.errors[0].startswith(bad_where), report.errors
    assert peak <= WORKING_BASE + WORKING_FACTOR * size, (peak, size)


@COMMON
@given(bad=mutated(GENERIC))
def test_generic_jsonl_lines(tmp_path, store, bad):
    good = [dict(GENERIC, traj_id=f"good-{i}") for i in (1, 2)]
    source = _lines(tmp_path / f"{uuid.uuid4().hex}.jsonl", [good[0], bad, good[1]])
    report, ids, peak = _import(source, store, "jsonl")
    _check(report, ids, peak, source.stat().st_size, {"good-1", "good-2"}, "line 2: ")


@COMMON
@given(bad=mutated(MESSAGES))
def test_chat_message_lines(tmp_path, store, bad):
    name = uuid.uuid4().hex
    source = _lines(tmp_path / f"{name}.jsonl", [MESSAGES, bad, MESSAGES])
    offsets = [0]
    for line in source.read_bytes().splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    report, ids, peak = _import(source, store, "messages")
    _check(report, ids, peak, source.stat().st_size, {f"{name}:0", f"{name}:{offsets[2]}"},
           "line 2: ")


@COMMON
@given(bad=mutated(VERL))
def test_verl_dump_lines(tmp_path, store, bad):
    source = _lines(tmp_path / "7.jsonl", [VERL, bad, VERL])
    report, ids, peak = _import(source, store, "verl")
    _check(report, ids, peak, source.stat().st_size, {"7:1", "7:3"}, "7.jsonl:2: ")


@COMMON
@given(bad=mutated(INSPECT))
def test_inspect_samples(tmp_path, store, bad):
    body = _dump(bad)
    source = write_eval(tmp_path / f"{uuid.uuid4().hex[:8]}.eval",
                        {"good1_epoch_1": sample("good1"), "mut_epoch_1": body,
                         "good2_epoch_1": sample("good2")}, head=header())
    report, ids, peak = _import(source, store, "inspect")
    _check(report, ids, peak, len(body), {"good1:epoch1", "good2:epoch1"},
           f"{source.name}: sample mut epoch 1: ")
