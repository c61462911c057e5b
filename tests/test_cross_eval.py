"""Evaluating a checkpoint on another evaluation's tasks and seeds (core/jobs/evaluation.py,
storage/evalsets.py) and Compare's job that runs it (pages/_evaljob.py).

Two real runs of the tiny model on FrozenLake in a real DuckDB file, evaluated with different
seeds (so different held-out tasks and episode seeds). The CLI evaluates one run's checkpoint on
the other's tasks: the new evaluation's (task, seed) list is the other's, and Compare then pairs
every task; a run's own checkpoint on its own tasks reproduces its evaluation token for token;
the same seed gives the same numbers; bad input exits 2 and leaves the store byte for byte;
a job killed midway writes nothing; the Compare page offers the job only where task sets differ,
runs it as its own process and then links the pairing.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs

import duckdb
import pytest

from core.commands import evaluate as evaluation_cli
from core.jobs import evaluation
from storage import evaldiff, evalsets
from tests.subprocesses import kill_at_first_progress
from tests.test_pages import app, demo  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """(store path, run A, run B): no RL step, each evaluated once at step 0 on 4 held-out tasks
    (seeds 0 and 1: different tasks), adapter snapshot of step 0 kept."""
    from core.commands import train
    db = tmp_path_factory.mktemp("xeval") / "store.duckdb"
    for seed, name in ((0, "alpha"), (1, "beta")):
        assert train.main(["--env", "frozenlake", "--model", "tiny", "--algo", "grpo",
                           "--steps", "0", "--group-size", "2", "--tasks-per-step", "1",
                           "--max-turns", "3", "--max-new-tokens", "6", "--eval-tasks", "4",
                           "--seed", str(seed), "--lora-targets", "q_proj,v_proj",
                           "--name", name, "--db", str(db), "--quiet"]) == 0
    with duckdb.connect(str(db), read_only=True) as con:
        ids = dict(con.execute("SELECT name, run_id FROM runs").fetchall())
    return db, ids["alpha"], ids["beta"]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _eval_rows(db: Path, run_id: str, step: int) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(
            "SELECT task_id, json_extract_string(info, '$.episode_seed') FROM trajectories "
            "WHERE run_id = ? AND step = ? AND split = 'eval' ORDER BY traj_id",
            [run_id, step]).fetchall()


def _tokens(db: Path, run_id: str, step: int) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(
            "SELECT k.traj_id, k.pos, k.token_id, k.role, k.logprob FROM tokens k JOIN "
            "trajectories t USING (run_id, traj_id) WHERE k.run_id = ? AND t.step = ? AND "
            "t.split = 'eval' ORDER BY k.traj_id, k.pos", [run_id, step]).fetchall()


def _counts(db: Path) -> dict:
    with duckdb.connect(str(db), read_only=True) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("runs", "metrics", "trajectories", "turns", "tokens", "rewards")}


def test_checkpoint_on_the_others_tasks_pairs_every_task(store, capsys):
    db, a, b = store
    before = evaldiff.diff(db, (a, 0), (b, 0))["coverage"]
    assert not before["same"] and before["shared"] == 0          # the premise: other tasks
    assert evaluation_cli.main(["--db", str(db), "--run", a, "--step", "0",
                            "--tasks-from", f"{b}:0"]) == 0
    out = capsys.readouterr().out
    assert "adapter of step 0" in out and f"{b}@0" in out
    made = evalsets.cross_evaluations(db)
    row = made[(made["checkpoint_run"] == a) & (made["tasks_run"] == b)].iloc[0]
    assert row["name"] == "alpha@0 on beta@0's tasks" and row["seed"] == 1 + 7
    new = str(row["run_id"])
    assert _eval_rows(db, new, 0) == _eval_rows(db, b, 0)        # tasks AND seeds, in order
    d = evaldiff.diff(db, (new, 0), (b, 0))
    assert d["coverage"]["same"] and d["coverage"]["shared"] == 4 == len(d["paired"])
    with duckdb.connect(str(db), read_only=True) as con:
        status, config = con.execute("SELECT status, config FROM runs WHERE run_id = ?",
                                     [new]).fetchone()
        metric = con.execute("SELECT value FROM metrics WHERE run_id = ? AND name = "
                             "'eval/tasks'", [new]).fetchone()[0]
    config = json.loads(config)
    assert status == "finished" and metric == 4.0
    assert config["cross_eval"] == {"checkpoint_run": a, "checkpoint_step": 0,
                                    "snapshot_step": 0, "tasks_run": b, "tasks_step": 0,
                                    "seed": 8}
    assert config["seed"] == 1 and config["model"] == "tiny"     # B's tasks, A's policy

    # the same job again: the same numbers, its earlier result replaced (no twin run)
    counts, tokens = _counts(db), _tokens(db, new, 0)
    assert evaluation_cli.main(["--db", str(db), "--run", a, "--step", "0",
                            "--tasks-from", f"{b}:0"]) == 0
    assert _counts(db) == counts and _tokens(db, new, 0) == tokens


def test_own_checkpoint_on_own_tasks_reproduces_the_evaluation(store):
    db, a, b = store
    assert evaluation_cli.main(["--db", str(db), "--run", b, "--step", "0",
                            "--tasks-from", f"{b}:0"]) == 0
    made = evalsets.cross_evaluations(db)
    new = str(made[(made["checkpoint_run"] == b) & (made["tasks_run"] == b)]["run_id"].iloc[0])
    original = _tokens(db, b, 0)
    assert original and _tokens(db, new, 0) == original           # token for token, logprobs too


def _copy(db: Path, where: Path) -> Path:
    """The store and its checkpoints, copied: a store to spoil."""
    shutil.copytree(db.parent / "checkpoints", where / "checkpoints")
    shutil.copy(db, where / db.name)
    return where / db.name


def _set_config(db: Path, run_id: str, **changes) -> None:
    with duckdb.connect(str(db)) as con:
        config = json.loads(con.execute("SELECT config FROM runs WHERE run_id = ?",
                                        [run_id]).fetchone()[0])
        con.execute("UPDATE runs SET config = ? WHERE run_id = ?",
                    [json.dumps({**config, **changes}), run_id])


@pytest.mark.parametrize("case, message", [
    ("no store", "no store at"),
    ("unknown run", "no run 'nope'"),
    ("unknown step", "has no step 9"),
    ("unknown task step", "has no held-out evaluation at step 3"),
    ("bad tasks-from", "--tasks-from must be RUN:STEP"),
    ("imported", "was imported (verl)"),
    ("no snapshot", "has no saved adapter at or before step 0"),
    ("other env", "trained on 'bandit', the task set is of 'frozenlake'"),
    ("tasks not rebuilt", "the environment cannot be rebuilt as recorded"),
    ("model not installed", "is not available"),
])
def test_bad_input_exits_2_and_writes_nothing(store, tmp_path, capsys, case, message):
    db, a, b = store
    args = {"--db": str(db), "--run": a, "--step": "0", "--tasks-from": f"{b}:0"}
    if case in ("imported", "other env", "tasks not rebuilt", "model not installed"):
        args["--db"] = str(_copy(db, tmp_path))
        spoil = {"imported": lambda p: _source(p, a, "verl"),
                 "other env": lambda p: _set_config(p, a, env="bandit"),
                 # B's world drawn from another seed: its recorded tasks are not among them
                 "tasks not rebuilt": lambda p: _set_config(p, b, seed=5),
                 "model not installed": lambda p: _set_config(p, a, model=str(tmp_path / "gone"))}
        spoil[case](Path(args["--db"]))
    elif case == "no snapshot":
        args["--db"] = str(tmp_path / db.name)
        shutil.copy(db, args["--db"])
    elif case == "no store":
        args["--db"] = str(tmp_path / "none.duckdb")
    else:
        key, value = {"unknown run": ("--run", "nope"), "unknown step": ("--step", "9"),
                      "unknown task step": ("--tasks-from", f"{b}:3"),
                      "bad tasks-from": ("--tasks-from", b)}[case]
        args[key] = value
    target = Path(args["--db"])
    before = _sha(target) if target.exists() else None
    assert evaluation_cli.main([x for kv in args.items() for x in kv]) == 2
    assert message in capsys.readouterr().err
    assert (_sha(target) if target.exists() else None) == before


def _source(db: Path, run_id: str, source: str) -> None:
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE runs SET source = ? WHERE run_id = ?", [source, run_id])


def test_a_job_killed_midway_writes_nothing(store):
    db, a, b = store
    before = _counts(db)
    code = kill_at_first_progress("core.evaluation", "--db", str(db), "--run", b, "--step", "0",
                                  "--tasks-from", f"{a}:0", "--seed", "3")
    assert code == -signal.SIGKILL
    assert _counts(db) == before


# -- the page --------------------------------------------------------------------------------------
def test_compare_offers_the_job_where_task_sets_differ_and_links_its_pairing(store, app):
    from pages import _evaljob
    db, a, b = store
    at = app("compare", store_dir=str(db.parent), store=str(db), run=a, a=f"{a}:0", b=f"{b}:0")
    assert not at.exception, at.exception
    assert any("did not use the same held-out tasks" in w.value for w in at.warning)
    labels = [x.label for x in at.button]
    assert "Evaluate B's checkpoint on A's tasks" in labels
    go = next(x for x in at.button if x.label == "Evaluate B's checkpoint on A's tasks")
    at = go.click().run()
    assert not at.exception, at.exception
    job = _evaljob.current()
    assert job is not None and job["args"][-2:] == ["--tasks-from", f"{a}:0"]
    assert any(x.label == "Stop the cross-evaluation" for x in at.button) or not job["alive"]
    deadline = time.monotonic() + 300
    while _evaljob.current()["alive"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _evaljob.current()["exit"] == 0, _evaljob.current()
    at = at.run()
    links = [e.proto for e in at.get("page_link")]
    mine = [p for p in links if "B's checkpoint on A's tasks" in p.label]
    assert mine, [p.label for p in links]
    made = evalsets.cross_evaluations(db)
    new = made[(made["checkpoint_run"] == b) & (made["tasks_run"] == a)].iloc[0]
    params = parse_qs(mine[0].query_string)
    assert params["a"] == [f"{a}:0"] and params["b"] == [f"{new['run_id']}:{int(new['step'])}"]
    assert params["run"] == [a]                                  # the sidebar's run stays
    # the pairing it links: A against B's checkpoint on A's tasks, every task shared
    at = app("compare", store_dir=str(db.parent), store=str(db), run=a, a=f"{a}:0",
             b=f"{new['run_id']}:{int(new['step'])}")
    assert not at.exception, at.exception
    assert not at.warning and not any(x.label.startswith("Evaluate") for x in at.button)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["solved in A"].endswith("/ 4")


def test_the_page_side_does_not_import_torch():
    code = "import sys, pages._evaljob, storage.evalsets; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
