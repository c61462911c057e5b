"""Tool errors in imported conversations (#51.2): each framework's mark on a failed tool result
makes the turn's error, so a failed last call is classed tool_error_unrecovered."""
from __future__ import annotations

import json

from storage import db
from storage.io import main

CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}]}
ASK = {"role": "user", "content": "What is x?"}
GIVE_UP = {"role": "assistant", "content": "I could not find it."}
RESULTS = {  # the tool's answer, as each framework marks a failure (docs/formats.md)
    "ours": {"role": "tool", "tool_call_id": "c1", "content": "", "error": "no index named x"},
    "inspect": {"role": "tool", "tool_call_id": "c1", "content": "",
                "error": {"type": "timeout", "message": "took over 30 s"}},
    "langchain": {"role": "tool", "tool_call_id": "c1", "content": "ERROR: bad query",
                  "status": "error"},
    "anthropic": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1",
                                               "content": "ERROR: quota", "is_error": True}]},
    "mcp": {"role": "tool", "tool_call_id": "c1", "content": "ERROR: no such table",
            "isError": True},
    "unmarked": {"role": "tool", "tool_call_id": "c1", "content": "ERROR: bad query"},
    "recovered": {"role": "tool", "tool_call_id": "c1", "content": "", "status": "error"},
}


def test_each_frameworks_error_mark_classes_the_trajectory(tmp_path):
    lines = []
    for name, result in RESULTS.items():
        messages = [ASK, CALL, result, GIVE_UP]
        if name == "recovered":  # the same failure, then a call that worked
            messages = [ASK, CALL, result, CALL, {"role": "tool", "tool_call_id": "c1",
                                                   "content": "x = 4"}, GIVE_UP]
        lines.append(json.dumps({"traj_id": name, "messages": messages, "reward": 0.0,
                                 "tools": [{"type": "function", "function": {"name": "lookup"}}]}))
    source = tmp_path / "chats.jsonl"
    source.write_text("\n".join(lines) + "\n")
    store = tmp_path / "s.duckdb"
    assert main(["import", str(source), "--db", str(store), "--format", "messages"]) == 0
    with db.reading(store) as con:
        classes = dict(con.execute("SELECT traj_id, failure_class FROM trajectories").fetchall())
        errors = dict(con.execute("SELECT traj_id, error FROM turns WHERE turn = 0").fetchall())
    for name in ("ours", "inspect", "langchain", "anthropic", "mcp"):
        assert classes[name] == "tool_error_unrecovered", (name, classes[name])
    assert errors["ours"] == "no index named x"
    assert errors["inspect"] == "timeout: took over 30 s"
    assert errors["langchain"] == "ERROR: bad query"  # a bare mark: the result's text says why
    assert errors["anthropic"] == "ERROR: quota" and errors["mcp"] == "ERROR: no such table"
    assert errors["unmarked"] is None and classes["unmarked"] != "tool_error_unrecovered"
    assert errors["recovered"] == "the tool reported an error"
    assert classes["recovered"] != "tool_error_unrecovered"  # a later call succeeded
