"""bench/credit_compare.py: the harness that runs the credit methods side by side. Its runs must
differ only where the comparison says they do: every seed is evaluated on one held-out draw, and
``--set`` changes every run alike."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from storage import queries

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str):
    """A bench script as a module, without putting bench/ on sys.path (its pages.py would
    shadow the app's pages package for every later test)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


credit_compare = _script("credit_compare")


def _held_out(log: Path) -> list[tuple[str, str]]:
    """(task id, prompt) of every held-out trajectory a child logged."""
    out = []
    for name, args, kwargs in credit_compare.calls(log):
        trajs = kwargs.get("trajectories") if name == "record_step" else None
        if trajs:
            out += [(t, s) for t, s, split in zip(trajs["task_id"], trajs["prompt"], trajs["split"])
                    if split == "eval"]
    return sorted(out)


def _config(log: Path) -> dict:
    return next(args[0] for name, args, _ in credit_compare.calls(log) if name == "start_run")


def test_two_seeds_are_evaluated_on_one_draw_and_set_reaches_every_run(tmp_path):
    out = tmp_path / "cmp"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "credit_compare.py"), "run", "--out", str(out),
         "--device", "cpu", "--smoke", "--runs", "grpo-s0,info_gain-s1", "--steps", "1",
         "--eval-every", "1", "--sft-steps", "1", "--parallel", "1",
         "--set", "lr=5e-5", "--set", "env_options=two_hop_frac=1.0"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    a, b = out / "grpo-s0.log", out / "info_gain-s1.log"
    for log, seed in ((a, 0), (b, 1)):
        cfg = _config(log)
        assert (cfg["seed"], cfg["eval_seed"]) == (seed, 0)
        assert (cfg["lr"], cfg["env_options"]) == (5e-5, "two_hop_frac=1.0")
    assert _config(b)["w_info_gain"] == 1.0 and _config(a)["w_info_gain"] == 0.0
    held_a, held_b = _held_out(a), _held_out(b)
    assert held_a and held_a == held_b  # the same held-out tasks
    assert "grpo-s0" in done.stdout and "info_gain-s1" in done.stdout  # the table
    assert "--limit-s 420 s" in done.stdout  # the default stop is said before it bites
    # loaded with a tag, the runs keep their steps and say which comparison they belong to
    db = str(tmp_path / "cmp.duckdb")
    credit_compare.load(out, db, tag="from SFT 1")
    runs = queries.runs(db).set_index("name")
    assert sorted(runs.index) == ["credit grpo seed 0 from SFT 1",
                                  "credit info_gain seed 1 from SFT 1"]
    assert set(queries.trajectories(db, runs["run_id"].iloc[0])["step"]) == {1, 2}


def test_set_reads_numbers_and_refuses_what_is_not_a_pair():
    assert credit_compare.overrides(["lr=1e-4", "steps=3", "env-options=two_hop_frac=1.0",
                                     "record_info_gain=False"]) == \
        {"lr": 1e-4, "steps": 3, "env_options": "two_hop_frac=1.0", "record_info_gain": False}
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        credit_compare.overrides(["lr"])


def test_a_log_cut_mid_record_reads_up_to_the_cut(tmp_path):
    """The table and load read logs that a running (or killed) child is still writing."""
    log = tmp_path / "run.log"
    rec = credit_compare.LogRecorder(log)
    rec.start_run({"env": "search"}, name="x", run_id="r")
    rec.record_step(1, metrics={"a": 1.0}, trajectories={"split": ["train"] * 300})
    rec.file.close()
    whole = log.read_bytes()
    log.write_bytes(whole[:-40])
    assert [name for name, _, _ in credit_compare.calls(log)] == ["start_run"]
    log.write_bytes(whole)
    assert [name for name, _, _ in credit_compare.calls(log)] == ["start_run", "record_step"]
