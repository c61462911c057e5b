"""A store on a file system that turns read-only, or fills up, while a run records into it: a
clear error, the committed steps intact. Needs mount (root); skipped, saying so, elsewhere."""
import subprocess

import pytest

from storage.recorder import Recorder

from .helpers import q


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _step(rec, step, big=False):
    text = "x" * (200_000 if big else 10)
    rec.record_step(step, metrics={"reward/mean": 0.5},
                    trajectories=[{"traj_id": f"s{step}-t{i}", "num_turns": 0} for i in range(4)],
                    turns=[{"traj_id": f"s{step}-t{i}", "turn": 0, "action": text + str(i),
                            "observation": "", "action_valid": True} for i in range(40)])


def test_read_only_then_full_store_gives_clear_errors_and_keeps_committed_steps(small_fs):
    path = small_fs / "store.duckdb"
    rec = Recorder(path)
    run = rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo"})
    _step(rec, 1)
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    with pytest.raises(Exception, match="(?i)read-only|cannot open|IO Error"):
        _step(rec, 2)
    subprocess.run(["mount", "-o", "remount,rw", str(small_fs)], check=True)
    assert q(path, "SELECT DISTINCT step FROM trajectories") == [(1,)]
    with pytest.raises(Exception, match="(?i)space|disk|write"):
        for step in range(2, 200):            # ~8 MB of text into a 4 MB file system
            _step(rec, step, big=True)
    last = q(path, "SELECT max(step) FROM metrics WHERE run_id = ?", [run])[0][0]
    assert q(path, "SELECT count(DISTINCT step), count(*) FROM trajectories") == [(last, 4 * last)]
