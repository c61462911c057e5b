"""Shared by the reliability tests: run the real trainer (optionally with a fault), read a store."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny", "--group-size", "2", "--tasks-per-step", "2", "--max-new-tokens", "8",
        "--seed", "0", "--threads", "1", "--quiet"]
BANDIT = ["--env", "bandit", "--max-turns", "1", *TINY]
SEARCH = ["--env", "search", "--max-turns", "2", *TINY]


def trainer(args: list[str], fault: str = "", mark: Path | None = None, **popen) -> subprocess.Popen:
    """Start ``python -m core.train ARGS`` (through the fault wrapper when ``fault`` is given)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "AGENTRL_FAULT": fault,
           "AGENTRL_FAULT_MARK": str(mark or "")}
    module = "tests.reliability.faulty_train" if fault else "core.train"
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def finish(proc: subprocess.Popen, timeout: float = 180) -> tuple[int, str]:
    """Wait for the process; (exit code, stderr)."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the trainer did not finish in {timeout} s: {err[-2000:]}")
    return proc.returncode, err


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until the fault wrapper touched ``path`` (the process is then held at its point)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the trainer exited early: {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError("the trainer never reached the fault point")
        time.sleep(0.05)


def q(db: Path | str, sql: str, params=()) -> list[tuple]:
    """Plain read-only DuckDB, as any outside tool would open the file."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def step_counts(db, run_id: str) -> dict[int, tuple[int, int, int]]:
    """step -> (train trajectories, distinct traj ids, metric rows) of a run."""
    rows = q(db, """
        SELECT m.step, coalesce(t.n, 0), coalesce(t.d, 0), m.n FROM
          (SELECT step, count(*) n FROM metrics WHERE run_id = ? GROUP BY 1) m
          LEFT JOIN (SELECT step, count(*) n, count(DISTINCT traj_id) d FROM trajectories
                     WHERE run_id = ? AND split = 'train' GROUP BY 1) t USING (step)
        ORDER BY 1""", [run_id, run_id])
    return {r[0]: r[1:] for r in rows}


def assert_whole(db, run_id: str) -> None:
    """No duplicated row, and every trajectory whole: its turns and tokens all there, and the
    four contract reward components (measured extras such as info_gain may come with them)."""
    assert q(db, "SELECT count(*) - count(DISTINCT traj_id) FROM trajectories WHERE run_id = ?",
             [run_id]) == [(0,)]
    assert q(db, "SELECT count(*) FROM (SELECT step, name FROM metrics WHERE run_id = ? "
                 "GROUP BY ALL HAVING count(*) > 1)", [run_id]) == [(0,)]
    broken = q(db, """
        SELECT t.traj_id FROM trajectories t
        LEFT JOIN (SELECT traj_id, count(*) n, max(pos) mp, count(DISTINCT pos) d FROM tokens
                   WHERE run_id = $r GROUP BY 1) k USING (traj_id)
        LEFT JOIN (SELECT traj_id, count(*) n FROM turns WHERE run_id = $r GROUP BY 1) u
               USING (traj_id)
        LEFT JOIN (SELECT traj_id, count(DISTINCT component) FILTER (
                          WHERE component IN ('outcome', 'format', 'cost', 'process')) n
                   FROM rewards WHERE run_id = $r GROUP BY 1) w
               USING (traj_id)
        WHERE t.run_id = $r AND (k.n IS NULL OR k.n <> k.mp + 1 OR k.d <> k.n
              OR coalesce(u.n, 0) <> t.num_turns OR w.n <> 4)""".replace("$r", "?"),
               [run_id] * 4)
    assert broken == [], f"trajectories not whole: {broken[:5]}"
