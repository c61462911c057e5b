"""A scored trajectory keeps its score when the receiver derives it again: a late span of its
trace, after a restart of the receiver, re-assembles it from all its stored spans, and the
reward, success, task and reward source a scores file gave (``info.otel.scored``) win over the
spans' own again, as they did when the file was applied (storage/otlp/writer.py
``scored_facts``). Before, the re-derivation wrote the spans' reward (0.0) over the score."""
from __future__ import annotations

import json

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from core.commands.agentrl import main as agentrl
from storage.otlp import Receiver
from tests.test_otlp_receiver import AFTER, FAST, chat, provider, rows, wait_for
from tests.test_otlp_scores import closed, unscored_agent, write


def late_span(tp, trace_id: str) -> None:
    """One more model call in an old trace (a span exported after its agent's root)."""
    parent = SpanContext(int(trace_id, 16), 0x1234ABCD, is_remote=True,
                         trace_flags=TraceFlags(TraceFlags.SAMPLED))
    context = trace.set_span_in_context(NonRecordingSpan(parent))
    chat(tp.get_tracer("late-agent"), [{"type": "text", "content": "late"}], AFTER,
         context=context)


def test_a_late_span_after_a_restart_keeps_the_scores_file_reward(tmp_path, capsys):
    db = tmp_path / "o.duckdb"
    r = Receiver(db, port=0, bounds=FAST).start()
    tp = provider(r.url)
    try:
        a = unscored_agent(tp)
        wait_for(lambda: closed(db, a))
    finally:
        tp.shutdown()
        r.stop()
    scores = write(tmp_path / "scores.jsonl",
                   {"trace_id": a, "reward": 0.75, "success": True, "task_id": "graded-a"})
    assert agentrl(["otlp-scores", str(scores), "--db", str(db)]) == 0
    capsys.readouterr()
    (spans_before,) = rows(db, "SELECT count(*) FROM spans WHERE trace_id = ?", a)[0]

    r = Receiver(db, port=0, bounds=FAST).start()          # a restart, then a late span
    tp = provider(r.url)
    try:
        late_span(tp, a)

        def rederived():
            (info,) = rows(db, "SELECT info FROM trajectories WHERE traj_id = ?", a)[0]
            otel = json.loads(info)["otel"]
            return otel["spans"] > spans_before and not otel["open"]
        assert wait_for(rederived, timeout=30.0)
    finally:
        tp.shutdown()
        r.stop()
    ((reward, success, task_id, info),) = rows(
        db, "SELECT reward, success, task_id, info FROM trajectories WHERE traj_id = ?", a)
    otel = json.loads(info)["otel"]
    assert (reward, success, task_id) == (0.75, True, "graded-a")
    assert otel["reward_source"] == "scores file scores.jsonl"
    assert otel["scored"] == {"file": "scores.jsonl", "line": 1, "task_id": True}
    assert rows(db, "SELECT value FROM rewards WHERE traj_id = ? AND component = 'outcome'",
                a) == [(0.75,)]
    assert rows(db, "SELECT count(*) FROM trajectories")[0][0] == 1     # no duplicate
