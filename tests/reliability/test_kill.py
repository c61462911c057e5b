"""Kill -9 of the trainer in the middle of a step: inside the database write, and during rollout.

The fault wrapper (faulty_train.py) holds the real trainer at the exact point, so the kill lands
there every time. Afterwards the store opens, every committed step is whole, the killed step is
absent, the app shows the run as interrupted, and ``--resume`` completes it without duplicates.
"""
import os
import signal
from datetime import timedelta

import pandas as pd

from storage import queries

from .helpers import BANDIT, assert_whole, finish, q, step_counts, trainer, wait_for

STEPS = 5
PER_STEP = 4  # tasks_per_step 2 x group_size 2


def _kill_at(fault: str, args: list[str], mark) -> None:
    proc = trainer(args, fault=fault, mark=mark)
    wait_for(mark, proc)
    os.kill(proc.pid, signal.SIGKILL)
    finish(proc, timeout=30)
    assert proc.returncode == -signal.SIGKILL


def _interrupted(db, run_id: str, committed: int) -> None:
    [(status, last, updated)] = q(db, "SELECT status, last_step, updated_at FROM runs "
                                      "WHERE run_id = ?", [run_id])
    assert (status, last) == ("running", committed)
    runs = queries.runs(db)   # the app's own read path opens the file after the kill
    assert runs.loc[0, "run_id"] == run_id
    later = pd.Timestamp(updated) + timedelta(seconds=queries.STALE_AFTER_S + 1)
    assert queries.shown_status(status, updated, now=later) == "interrupted"
    assert step_counts(db, run_id) == {s: (PER_STEP, PER_STEP, step_counts(db, run_id)[s][2])
                                       for s in range(1, committed + 1)}
    assert_whole(db, run_id)


def test_kill_inside_the_write_then_during_rollout_then_resume(tmp_path):
    db = tmp_path / "store.duckdb"
    args = [*BANDIT, "--steps", str(STEPS), "--eval-every", "0", "--db", str(db)]

    # 1. killed while step 3's rows are inserted but not committed
    _kill_at("hold-write@3", args, tmp_path / "in-write")
    [(run_id,)] = q(db, "SELECT run_id FROM runs")
    _interrupted(db, run_id, committed=2)
    assert q(db, "SELECT count(*) FROM trajectories WHERE step = 3") == [(0,)]
    assert q(db, "SELECT count(*) FROM metrics WHERE step = 3") == [(0,)]

    # 2. resumed, then killed during step 4's rollout
    resume = ["--resume", run_id, "--db", str(db), "--threads", "1", "--quiet"]
    _kill_at("hold-rollout@4", resume, tmp_path / "in-rollout")
    _interrupted(db, run_id, committed=3)

    # 3. resumed again: the run completes, every step once
    code, err = finish(trainer(resume))
    assert code == 0, err[-2000:]
    counts = step_counts(db, run_id)
    assert sorted(counts) == list(range(1, STEPS + 1))
    assert all(n == d == PER_STEP for n, d, _ in counts.values())
    assert_whole(db, run_id)
    assert q(db, "SELECT status, last_step FROM runs") == [("finished", STEPS)]
