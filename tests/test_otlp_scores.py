"""Rewards graded after the agent ran (``agentrl otlp-scores``, storage/otlp/scores.py): real
spans sent through the OpenTelemetry SDK to a running receiver, then a scores file keyed by trace
id rewrites each trajectory with its reward, keeping its turns, and says where the reward came
from; a rerun changes nothing; a bad line is named and nothing is written; an unknown trace and
an agent still running are reported.
"""
from __future__ import annotations

import json

import pytest

from core.commands.agentrl import main as agentrl
from storage.otlp import Receiver
from storage.otlp.scores import MAX_LINE_BYTES, ScoresError, read_scores
from tests.test_otlp_receiver import (AFTER, CALL, FAST, USER, chat, provider, rows, tool_agent,
                                      wait_for)

UNKNOWN = "ab" * 16


def unscored_agent(tp, task="t-unscored") -> str:
    """A two-turn agent whose trace carries no reward (graded later)."""
    tracer = tp.get_tracer("test-agent")
    with tracer.start_as_current_span("invoke_agent") as root:
        chat(tracer, CALL, USER, finish="tool_calls")
        chat(tracer, [{"type": "text", "content": "The answer is 5"}], AFTER)
        return format(root.get_span_context().trace_id, "032x")


def closed(db, *trace_ids):
    got = rows(db, "SELECT traj_id, info FROM trajectories")
    done = {t for t, info in got if not json.loads(info)["otel"]["open"]}
    return set(trace_ids) <= done


def snapshot(db, traj_id):
    (traj,) = rows(db, "SELECT reward, success, task_id, split, num_turns, prompt, "
                       "failure_class, info FROM trajectories WHERE traj_id = ?", traj_id)
    turns = rows(db, "SELECT turn, action, observation, info FROM turns WHERE traj_id = ? "
                     "ORDER BY turn", traj_id)
    rewards = dict(rows(db, "SELECT component, value FROM rewards WHERE traj_id = ?", traj_id))
    return traj, turns, rewards


@pytest.fixture
def store(tmp_path):
    r = Receiver(tmp_path / "o.duckdb", port=0, bounds=FAST).start()
    tp = provider(r.url)
    yield r, tp, tmp_path / "o.duckdb"
    tp.shutdown()
    r.stop()


def write(path, *lines):
    path.write_text("".join((json.dumps(x) if not isinstance(x, str) else x) + "\n"
                            for x in lines))
    return path


def test_a_scores_file_rescored_the_traces_beside_a_running_receiver(store, tmp_path, capsys):
    r, tp, db = store
    a = unscored_agent(tp)
    b = tool_agent(tp, reward=0.0)
    wait_for(lambda: closed(db, a, b))
    before_a = snapshot(db, a)
    assert before_a[0][0] == 0.0 and "no reward in the trace" in before_a[0][7]
    scores = write(tmp_path / "scores.jsonl",
                   {"trace_id": a, "reward": 0.75, "success": True, "task_id": "graded-a"},
                   {"trace_id": b.upper(), "reward": 1},
                   {"trace_id": UNKNOWN, "reward": 0.5})
    # through the front door, while the receiver still runs on the same store
    assert agentrl(["otlp-scores", str(scores), "--db", str(db)]) == 1
    out = capsys.readouterr().out
    assert "2 trajectory(ies) rescored" in out
    assert f"1 trace id(s) not found in {db}: {UNKNOWN}" in out

    traj, turns, rewards = snapshot(db, a)
    assert traj[:6] == (0.75, True, "graded-a", before_a[0][3], 2, before_a[0][5])
    assert turns == before_a[1]                      # the turns, their text and info, unchanged
    assert rewards["outcome"] == 0.75
    info = json.loads(traj[7])
    assert info["otel"]["reward_source"] == "scores file scores.jsonl"
    assert info["otel"]["scored"] == {"file": "scores.jsonl", "line": 1, "task_id": True}
    assert info["otel"]["trace_ids"] == [a] and info["otel"]["open"] is False
    assert not any("no reward in the trace" in n for n in info.get("import_notes", []))

    traj_b, _, _ = snapshot(db, b)
    assert traj_b[:4] == (1.0, True, "add-2-3", "eval")   # the span's task id kept
    assert "success inferred as reward >= 1" in json.loads(traj_b[7])["import_notes"]

    # idempotent: the same file again rewrites nothing
    first = snapshot(db, a), snapshot(db, b)
    assert agentrl(["otlp-scores", str(scores), "--db", str(db)]) == 1
    assert "0 trajectory(ies) rescored, 2 already carried their score" in capsys.readouterr().out
    assert (snapshot(db, a), snapshot(db, b)) == first
    # the run's derived metrics read the new rewards
    assert rows(db, "SELECT count(*) FROM trajectories WHERE reward > 0")[0][0] == 2


def test_a_bad_line_is_named_and_nothing_is_written(store, tmp_path, capsys):
    r, tp, db = store
    a = unscored_agent(tp)
    wait_for(lambda: closed(db, a))
    before = snapshot(db, a)
    for bad, said in [('{"trace_id": "%s", "reward": NaN}' % a, "line 2: reward must be a "
                       "finite number"),
                      ({"trace_id": a[:31], "reward": 1}, "line 2: trace_id must be 32 hex"),
                      ({"trace_id": a, "reward": True}, "line 2: reward must be a finite"),
                      ({"trace_id": a, "reward": 1, "succes": True}, "line 2: unknown key"),
                      ({"trace_id": a, "reward": 1, "success": "yes"}, "line 2: success must"),
                      ("[1, 2]", "line 2: expected a JSON object"),
                      ("{not json", "line 2: not JSON"),
                      ({"trace_id": UNKNOWN, "reward": 1}, f"line 2: trace {UNKNOWN} was already "
                       "given on line 1")]:
        f = write(tmp_path / "bad.jsonl", {"trace_id": UNKNOWN, "reward": 0.5}, bad)
        assert agentrl(["otlp-scores", str(f), "--db", str(db)]) == 2
        err = capsys.readouterr().err
        assert said in err and "nothing was written" in err, err
    with pytest.raises(ScoresError, match=f"line 1: longer than {MAX_LINE_BYTES} bytes"):
        read_scores(write(tmp_path / "long.jsonl", {"trace_id": a, "reward": 1,
                                                     "task_id": "x" * MAX_LINE_BYTES}))
    assert snapshot(db, a) == before


def test_a_trace_whose_agent_still_runs_is_left_alone_and_named(store, tmp_path, capsys):
    r, tp, db = store
    tracer = tp.get_tracer("test-agent")
    root = tracer.start_span("invoke_agent")
    from opentelemetry import trace
    chat(tracer, CALL, USER, context=trace.set_span_in_context(root), finish="tool_calls")
    tid = format(root.get_span_context().trace_id, "032x")
    wait_for(lambda: rows(db, "SELECT count(*) FROM trajectories WHERE traj_id = ?", tid)[0][0])
    f = write(tmp_path / "scores.jsonl", {"trace_id": tid, "reward": 1.0})
    assert agentrl(["otlp-scores", str(f), "--db", str(db)]) == 1
    assert f"1 trace id(s) whose agent still runs, left alone" in capsys.readouterr().out
    assert rows(db, "SELECT reward FROM trajectories WHERE traj_id = ?", tid) == [(0.0,)]
    root.end()
    wait_for(lambda: closed(db, tid))
    assert agentrl(["otlp-scores", str(f), "--db", str(db)]) == 0
    assert rows(db, "SELECT reward, success FROM trajectories WHERE traj_id = ?", tid) \
        == [(1.0, True)]


def test_a_missing_store_is_an_error(tmp_path, capsys):
    f = write(tmp_path / "s.jsonl", {"trace_id": UNKNOWN, "reward": 1})
    assert agentrl(["otlp-scores", str(f), "--db", str(tmp_path / "none.duckdb")]) == 2
    assert "no store at" in capsys.readouterr().err
