"""The receiver's hold on the store (storage/otlp/store.py ``Appender._serve``) ends when another
opener queues or ``LEASE_S`` has passed, even while derivations or requests keep coming: a page
queued behind it waits for one derivation's transaction at most, never for the receiver to go
idle.
"""
from __future__ import annotations

import threading
import time

from storage import db as store
from storage.otlp import Bounds, Receiver
from storage.otlp.store import LEASE_S

SLOW = Bounds(flush_s=600, idle_s=600)  # the receiver's own deriver stays out of the way


def test_a_reader_gets_in_while_derivations_follow_one_another(tmp_path):
    db = tmp_path / "o.duckdb"
    r = Receiver(db, port=0, bounds=SLOW).start()
    stop, ran = threading.Event(), [0]

    def derivation(con):  # a derivation's transaction, 0.2 s long
        con.execute("SELECT count(*) FROM spans").fetchall()
        time.sleep(0.2)

    def deriver():  # one transaction after the other, as a deriver behind on its work
        while not stop.is_set():
            r.writer.appender.run(derivation)
            ran[0] += 1

    thread = threading.Thread(target=deriver, daemon=True)
    give_up = threading.Timer(8.0, stop.set)  # the former appender's reader waited this long
    try:
        thread.start()
        give_up.start()
        time.sleep(0.5)
        started = time.monotonic()
        with store.reading(db) as con:
            waited = time.monotonic() - started
            con.execute("SELECT count(*) FROM spans").fetchall()
    finally:
        stop.set()
        give_up.cancel()
        thread.join(30)
        r.stop()
    assert ran[0] >= 2
    # the former appender lent the next derivation its cursor while a reader queued: the reader
    # waited until the derivations stopped coming (here, 8 s), past LEASE_S
    assert waited < min(2.0, LEASE_S), waited
