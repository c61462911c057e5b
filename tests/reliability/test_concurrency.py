"""A real trainer writing while two reader processes poll the same run through storage.queries
(as two browser sessions do) and an import writes another run into the same store.

No side errors, nobody blocked for a second, and the rows match what was written: every step's
trajectories once and whole, every imported line once.
"""
import json
import multiprocessing
import os
import subprocess
import sys
import time

from storage.recorder import Recorder

from .helpers import BANDIT, ROOT, assert_whole, finish, q, step_counts, trainer

STEPS, PER_STEP, IMPORT_LINES = 6, 4, 600
MAX_WAIT_S = 1.0


def _reader(path: str, out: str, stop: str) -> None:
    from storage import queries
    result = {"durations": [], "errors": [], "torn": [], "reads": 0}
    # durations: each query (one open of the store); cycles: the slowest poll of all of them
    while True:
        final = os.path.exists(stop)
        t0 = time.monotonic()

        def timed(fn, *args):
            t = time.monotonic()
            try:
                return fn(*args)
            finally:
                result["durations"].append(time.monotonic() - t)
        try:
            runs = timed(queries.runs, path)
            for run_id in runs["run_id"]:
                timed(queries.metrics, path, run_id, ["reward/mean"])
                trajs = timed(queries.trajectories, path, run_id)
                if run_id.startswith("import"):
                    continue
                for step, n in trajs[trajs["split"] == "train"].groupby("step").size().items():
                    if n != PER_STEP:
                        result["torn"].append([int(step), int(n)])
            result["reads"] += 1
        except Exception as exc:  # counted, not raised: the test asserts there are none
            result["errors"].append(repr(exc))
        result["cycles"] = max(result.get("cycles", 0.0), time.monotonic() - t0)
        if final:
            break
        time.sleep(0.1)
    with open(out, "w") as f:
        json.dump(result, f)


def _jsonl(path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({
                "traj_id": f"t{i}", "task_id": f"q{i % 50}", "group_id": f"g{i % 50}",
                "step": i // 100, "prompt": "Who wrote Dune?", "reward": float(i % 2),
                "turns": [{"action": "<search>dune</search>", "observation": "Dune, a novel."},
                          {"action": "<answer>Frank Herbert</answer>", "observation": ""}]}) + "\n")


def test_trainer_two_readers_and_an_import_share_one_store(tmp_path):
    db, stop = tmp_path / "store.duckdb", tmp_path / "stop"
    Recorder(db)
    data = tmp_path / "other.jsonl"
    _jsonl(data, IMPORT_LINES)
    ctx = multiprocessing.get_context("spawn")
    readers = [ctx.Process(target=_reader, args=(str(db), str(tmp_path / f"r{i}.json"), str(stop)))
               for i in range(2)]
    for r in readers:
        r.start()
    train = trainer([*BANDIT, "--steps", str(STEPS), "--eval-every", "0", "--db", str(db)])
    time.sleep(5)  # the trainer is loading its model: the import overlaps its steps
    imp = subprocess.run([sys.executable, "-m", "storage.io", "import", str(data), "--db", str(db),
                          "--run-id", "import-other"], cwd=ROOT, capture_output=True, text=True,
                         timeout=180)
    code, err = finish(train)
    stop.touch()
    for r in readers:
        r.join(timeout=60)
        assert r.exitcode == 0
    assert code == 0, err[-2000:]
    assert imp.returncode == 0, imp.stderr[-2000:]
    assert f"{IMPORT_LINES} imported" in imp.stdout

    results = [json.loads((tmp_path / f"r{i}.json").read_text()) for i in range(2)]
    for r in results:
        assert r["errors"] == [] and r["torn"] == [] and r["reads"] > 10
        assert max(r["durations"]) < MAX_WAIT_S, sorted(r["durations"])[-5:]
    [(run_id,)] = q(db, "SELECT run_id FROM runs WHERE source = 'trainer'")
    # time/record_s is a step's row building plus its write (waiting for readers included)
    worst_write = q(db, "SELECT max(value) FROM metrics WHERE name = 'time/record_s'")[0][0]
    assert worst_write < MAX_WAIT_S, worst_write
    counts = step_counts(db, run_id)
    assert sorted(counts) == list(range(1, STEPS + 1))
    assert all(n == d == PER_STEP for n, d, _ in counts.values())
    assert_whole(db, run_id)
    assert q(db, "SELECT count(*), count(DISTINCT traj_id) FROM trajectories "
                 "WHERE run_id = 'import-other'") == [(IMPORT_LINES, IMPORT_LINES)]
    assert q(db, "SELECT count(*) FROM turns WHERE run_id = 'import-other'") == [(2 * IMPORT_LINES,)]
    print(f"slowest polls {[round(r['cycles'], 3) for r in results]} s, reads {[r['reads'] for r in results]}, worst read "
          f"{max(max(r['durations']) for r in results):.3f} s, worst write {worst_write:.3f} s")
