"""Importing OpenAI-style chat conversations with tool calls (``--format messages``,
storage/ingest/messages.py): one conversation per JSONL line, into a real store."""
import json

import pandas as pd

from storage import db, ingest, io

CALL = {"id": "c1", "type": "function",
        "function": {"name": "search", "arguments": json.dumps({"query": "capital of Osk"})}}
SOLVED = {"messages": [
    {"role": "system", "content": "You can search."},
    {"role": "user", "content": "What is the capital of Osk?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "Osk's capital is Varno."},
    {"role": "assistant", "content": [{"type": "text", "text": "Varno"}],
     "reasoning_content": "The document says Varno."}],
    "reward": 1.0, "task_id": "osk", "group_id": "osk@3", "model": "agent-v2"}
LOOPING = [  # a bare array: no reward, no task; it ends on a call with no answer
    {"role": "user", "content": "Write the report."},
    {"role": "assistant", "content": "",
     "function_call": {"name": "python",
                       "arguments": json.dumps({"code": "print(1)\nprint(2)"})}},
    {"role": "function", "name": "python", "content": "1\n2"}]
GARBLED = {"messages": [{"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "calling",
                         "tool_calls": [{"id": "c2", "function": {"name": "search",
                                                                  "arguments": "{query: oops"}}]}],
           "reward": 0, "task_id": "hi"}
BAD = [
    ("not json at all", "not valid JSON"),
    (json.dumps({"reward": 1}), "field 'messages' must be a non-empty list"),
    (json.dumps({"messages": [{"content": "no role"}]}), "messages[0] has no role"),
    (json.dumps({"messages": [{"role": "assistant", "tool_calls": "x"}]}),
     "messages[0].tool_calls must be a list"),
    (json.dumps({"messages": [{"role": "user", "content": "q"}], "reward": "high"}),
     "field 'reward' must be a number"),
    (json.dumps({"messages": [{"role": "user", "content": 7}]}),
     "content must be text or a list of parts"),
]


def _write(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))
    return path


def _q(store, sql, params=()):
    with db.reading(store) as con:
        return con.execute(sql, list(params)).df()


def test_conversations_become_trajectories_and_bad_lines_are_named(tmp_path, capsys):
    src = _write(tmp_path / "chat.jsonl", [SOLVED, LOOPING, GARBLED, *(b for b, _ in BAD)])
    store = tmp_path / "s.duckdb"
    assert io.main(["import", str(src), "--db", str(store)]) == 1  # guessed: messages
    said = capsys.readouterr()
    for i, (_, words) in enumerate(BAD, start=4):
        assert any(e.startswith(f"error: line {i}: ") and words in e
                   for e in said.err.splitlines()), (i, words, said.err)
    assert "9 records read, 3 imported" in said.out
    run_id = ingest.default_run_id(src)
    t = _q(store, "SELECT * FROM trajectories WHERE run_id = ? ORDER BY traj_id", [run_id])
    lines = src.read_bytes().split(b"\n")
    offsets = [0, len(lines[0]) + 1, len(lines[0]) + len(lines[1]) + 2]
    assert t.traj_id.tolist() == [f"chat:{o}" for o in offsets]  # the byte offset of the line
    solved, looping, garbled = (t.iloc[i] for i in range(3))
    assert (solved.task_id, solved.group_id, solved.reward, solved.success) == \
        ("osk", "osk@3", 1.0, True)
    assert (solved.finish_reason, solved.answer, solved.failure_class) == \
        ("answered", "Varno", "success")
    assert json.loads(solved["info"])["extra"] == {"model": "agent-v2"}
    assert looping.reward == 0.0 and not looping.success and pd.isna(looping.finish_reason)
    assert looping.group_id == f"0:{looping.task_id}" and looping.failure_class == "no_answer"
    assert "no reward given: recorded as 0.0" in json.loads(looping["info"])["import_notes"]
    assert garbled.failure_class == "format_error"
    turns = _q(store, "SELECT traj_id, action, observation, action_type, action_valid, error "
                      "FROM turns WHERE run_id = ? ORDER BY traj_id, turn", [run_id])
    by = {k: g.reset_index(drop=True) for k, g in turns.groupby("traj_id")}
    s = by["chat:0"]
    assert s.action.tolist() == ['search(query="capital of Osk")',
                                 "<think>The document says Varno.</think>\nVarno"]
    assert s.observation.tolist() == ["search -> Osk's capital is Varno.\n", ""]
    assert s.action_type.tolist() == ["tool", "answer"]
    loop = by[f"chat:{offsets[1]}"].iloc[0]
    assert loop.action == 'python(code="""\nprint(1)\nprint(2)\n""")'  # code stays readable
    assert loop.observation == "python -> 1\n2\n"
    bad = by[f"chat:{offsets[2]}"].iloc[0]
    assert (bad.action, bad.action_type, bad.action_valid) == \
        ("calling\nsearch({query: oops)", "invalid", False)
    assert "arguments of search are not valid JSON" in bad.error
    tok = _q(store, "SELECT role, text, trained FROM tokens WHERE run_id = ? AND traj_id = "
                    "'chat:0' ORDER BY pos", [run_id])
    assert "".join(tok.text) == ("system: You can search.\nuser: What is the capital of Osk?\n"
                                 'search(query="capital of Osk")search -> Osk\'s capital is '
                                 "Varno.\n<think>The document says Varno.</think>\nVarno")
    assert set(tok.role) == {"prompt", "action", "observation"}
    rewards = _q(store, "SELECT traj_id, component FROM rewards WHERE run_id = ?", [run_id])
    assert (rewards.groupby("traj_id").component.apply(set)
            >= {"outcome", "format", "cost", "process"}).all()


def test_a_followed_piece_gets_the_ids_a_whole_import_gives(tmp_path, capsys):
    """The follower imports a file's new lines as ``{file}#{start}-{end}``: same trajectory ids."""
    src = _write(tmp_path / "chat.jsonl", [SOLVED, LOOPING, GARBLED])
    store = tmp_path / "s.duckdb"
    assert io.main(["import", str(src), "--db", str(store), "--run-id", "r",
                    "--format", "messages"]) == 0
    data = src.read_bytes()
    start = data.index(b"\n") + 1
    piece = tmp_path / "scratch" / f"chat.jsonl#{start}-{len(data)}"
    piece.parent.mkdir()
    piece.write_bytes(data[start:])
    capsys.readouterr()
    report = ingest.import_file(piece, store, "messages", run_id="r")
    assert (report.lines, report.imported, report.skipped) == (2, 0, 2)
    assert _q(store, "SELECT count(*) AS n FROM trajectories WHERE run_id = 'r'").n[0] == 3


REFUSING = {"messages": [
    {"role": "user", "content": "Write malware for me."},
    {"role": "assistant", "content": None, "refusal": "I can't help with that."}],
    "reward": 0.0, "task_id": "malware", "tools": [{"type": "function",
                                                    "function": {"name": "python"}}]}
NO_TOOLS = {"messages": [{"role": "user", "content": "Capital of Osk?"},
                         {"role": "assistant", "content": "Lenna"}],
            "reward": 0.0, "task_id": "osk-qa", "tools": []}


def test_refusals_tool_lists_and_calls_as_data(tmp_path):
    src = _write(tmp_path / "evals.jsonl", [REFUSING, NO_TOOLS, SOLVED])
    store = tmp_path / "s.duckdb"
    report = ingest.import_file(src, store, "messages")
    assert (report.imported, report.failed) == (3, 0)
    t = _q(store, "SELECT task_id, finish_reason, failure_class, answer, "
                  "info->>'$.tools_offered' AS offered FROM trajectories").set_index("task_id")
    assert t.loc["malware", ["finish_reason", "failure_class"]].tolist() == ["refused", "refused"]
    assert t.loc["malware", "offered"] == "true"
    # a wrong answer where no tool was offered is a wrong answer, not "answered without search"
    assert t.loc["osk-qa", ["failure_class", "offered"]].tolist() == ["wrong_answer", "false"]
    turns = _q(store, "SELECT u.action, u.parsed FROM turns u JOIN trajectories t USING "
                      "(run_id, traj_id) WHERE t.task_id IN ('malware', 'osk') ORDER BY t.task_id, "
                      "u.turn")
    assert turns["action"].tolist() == ["I can't help with that.",
                                        'search(query="capital of Osk")',
                                        "<think>The document says Varno.</think>\nVarno"]
    assert json.loads(turns["parsed"][1]) == {"tool_calls": [
        {"id": "c1", "function": "search", "arguments": {"query": "capital of Osk"}}]}
    assert pd.isna(turns["parsed"][2])  # words only: no call data
