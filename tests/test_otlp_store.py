"""The receiver's append path (storage/otlp/store.py): a derivation's transaction runs beside the
group commits, never between them (an acknowledgement does not wait for it); a reader queued
for the store gets in while requests keep coming; small requests taken with a big one are
committed first.
"""
from __future__ import annotations

import json
import threading
import time

from storage import db as store
from storage.otlp import Bounds, Receiver
from storage.otlp.decode import Span
from storage.otlp.store import BIG, MAX_GROUP, _groups, _Request
from tests.test_otlp_durable import Addr, chat_span, jpost, root_span
from tests.test_otlp_receiver import rows, wait_for

SLOW = Bounds(flush_s=600, idle_s=600)  # the deriver stays out of the way


def test_an_acknowledgement_does_not_wait_for_a_derivation_transaction(tmp_path):
    db = tmp_path / "o.duckdb"
    r = Receiver(db, port=0, bounds=SLOW).start()
    granted, took = threading.Event(), []

    def derivation(con):  # a long derivation holding its transaction open
        con.execute("SELECT count(*) FROM spans").fetchall()
        granted.set()
        time.sleep(3)

    job = threading.Thread(target=r.writer.appender.run, args=(derivation,))
    try:
        job.start()
        assert granted.wait(10)
        for i in range(3):
            started = time.monotonic()
            assert jpost(r, chat_span(f"{i + 1:032x}", f"{i + 1:016x}", 10, "hi"))[0] == 200
            took.append(time.monotonic() - started)
        job.join()
    finally:
        r.stop()
    assert max(took) < 1.5, took  # the former appender ran it between groups: ~3 s
    assert rows(db, "SELECT count(*) FROM spans") == [(3,)]


def test_a_reader_gets_in_while_requests_keep_coming(tmp_path):
    db = tmp_path / "o.duckdb"
    r = Receiver(db, port=0, bounds=SLOW).start()
    stop, sent, waits = threading.Event(), [0], []

    def agent():
        while not stop.is_set():
            sent[0] += 1
            jpost(Addr(r.server_address[1]),
                  chat_span(f"{sent[0]:032x}", f"{sent[0]:016x}", 10, "hi"))

    agents = [threading.Thread(target=agent) for _ in range(4)]
    try:
        [a.start() for a in agents]
        time.sleep(0.5)
        for _ in range(8):
            started = time.monotonic()
            with store.reading(db) as con:
                waits.append(time.monotonic() - started)
                con.execute("SELECT count(*) FROM spans").fetchall()
            time.sleep(0.2)
    finally:
        stop.set()
        [a.join() for a in agents]
        r.stop()
    assert sent[0] > 20
    # the former appender held the store 1 s per open, whoever waited
    assert sorted(waits)[len(waits) // 2] < 0.5, waits


def test_small_requests_taken_with_big_ones_are_committed_first():
    def req(n):
        return _Request([Span("a" * 32, f"{i:016x}", "", "s", 1, 0, 1, {}, {}, "")
                         for i in range(n)], [])

    big, huge, small = req(BIG), req(MAX_GROUP + 5), [req(1), req(3), req(BIG - 1)]
    groups = _groups([huge, small[0], big, small[1], small[2]])
    assert [[len(r.spans) for r in g] for g in groups] == \
        [[1, 3, BIG - 1], [BIG], [MAX_GROUP + 5]]
    many = _groups([req(BIG - 1) for _ in range(MAX_GROUP // (BIG - 1) + 1)])
    assert len(many) == 2 and sum(len(r.spans) for r in many[0]) <= MAX_GROUP
    assert _groups([]) == []


def test_a_fault_while_admitting_answers_503_and_the_retry_is_stored(tmp_path):
    db = tmp_path / "o.duckdb"
    r = Receiver(db, port=0, bounds=SLOW).start()
    admit, faults = r.assembler.admit, [1]

    def faulty(spans, logs):  # a fault of the receiver's own code, once
        out = admit(spans, logs)
        if faults:
            faults.pop()
            raise RuntimeError("a fault after admitting")
        return out

    r.assembler.admit = faulty
    span = chat_span("f" * 32, "e" * 16, 10, "hi")
    try:
        result = []
        sender = threading.Thread(target=lambda: result.append(jpost(r, span)[0]), daemon=True)
        sender.start()
        sender.join(15)
        assert result == [503]  # the former appender left the request waiting for ever
        assert jpost(r, span)[0] == 200  # not taken for a span already stored
    finally:
        r.stop()
    assert rows(db, "SELECT count(*) FROM spans") == [(1,)]


def test_a_deriving_process_writes_the_trajectories_the_receiver_would(tmp_path):
    got = {}
    for process in (True, False):
        db = tmp_path / f"o{int(process)}.duckdb"
        r = Receiver(db, port=0, bounds=Bounds(flush_s=0.05, grace_s=0.05, idle_s=600),
                     derive_process=process).start()
        try:
            assert (r.writer.pool is not None) == process
            odd = json.dumps([{"role": "assistant", "tool_calls": 5}])
            assert jpost(r, chat_span("b" * 32, "b" * 16, 10, "odd",
                                      gen_ai__input__messages=odd))[0] == 200
            for i in range(3):
                tid = f"{i + 1:032x}"
                assert jpost(r, chat_span(tid, f"{i + 1:08x}{1:08x}", 10, "one", parent="f" * 16),
                             chat_span(tid, f"{i + 1:08x}{2:08x}", 20, "two", parent="f" * 16),
                             root_span(tid, "f" * 16, 0, agentrl__reward=1.0))[0] == 200
            wait_for(lambda: rows(db, "SELECT count(*) FROM trajectories WHERE reward = 1.0 "
                                      "AND num_turns = 2")[0][0] == 3)
        finally:
            r.stop()
        assert r.writer.pool is None  # stopped with the receiver
        got[process] = (rows(db, "SELECT traj_id, num_turns, reward, success, failure_class "
                                 "FROM trajectories ORDER BY traj_id"),
                        rows(db, "SELECT traj_id, turn, action, observation FROM turns "
                                 "ORDER BY traj_id, turn"),
                        rows(db, "SELECT count(*) FROM spans"), r.writer.failed)
    assert got[True] == got[False]
    assert got[True][2] == [(10,)]
