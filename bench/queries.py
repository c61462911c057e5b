"""Every page's queries on a large synthetic store: 100k trajectories, 10M token rows. A script:

    nice -n 15 .venv/bin/python bench/queries.py [--store /tmp/big.duckdb] [--steps 3125]

The store (built once, reused when the file exists) holds one run of ``--steps`` steps x 32
trajectories (4 tasks x G 8) of 40-160 tokens (mean 100), the search env's shapes: 1-4 turns of
``<think>``/``<search>`` actions and ``<information>`` observations, 4 reward components, 44
metrics and 14 per-module gradient norms per step, plus a small second run. Rows go in step by
step, in the recorder's order, as bulk DataFrame inserts.

The queries are timed in a child process (``--read``) that opens the store read-only for every
query exactly as the app does (storage/db.py: open + query + close; the open alone is timed as
``open + SELECT 1``), median of ``--repeats`` calls each, wall time and CPU time of all the
process's threads (on a loaded machine wall time includes waiting for a core); its peak RSS is the app process's memory
for that store. Targets: every query <= 300 ms, one trajectory's tokens <= 50 ms, <= 1 GB.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage import db, queries  # noqa: E402
from storage.migrations import migrate  # noqa: E402

RUN, SMALL_RUN = "bench-big", "bench-small"
G, TASKS = 8, 4
CLASSES = np.array(["success", "wrong_answer", "no_search", "format_error", "max_turns",
                    "shallow_search", None], dtype=object)
PLACES = [f"{a}{b}" for a in ("Os", "Var", "Tel", "Mor", "Quen", "Bral") for b in
          ("k", "nia", "ith", "ova", "ar", "en")]
# The last names are those the Dynamics page draws (gradient norms and spikes, collapse alarms),
# so a page-load benchmark on this store walks its whole page.
METRIC_NAMES = [f"{k}/{i}" for k in ("reward", "policy", "grad", "env") for i in range(9)] + \
    ["reward/mean", "success/rate", "time/step_s", "perf/tokens_per_s", "grad/norm",
     "reward/group_std_mean", "policy/entropy", "collapse/repeat_frac"]
VOCAB = np.array(["".join(np.random.default_rng(i).choice(list("aeioulnrstmkdgpbvhy"), 3 + i % 7))
                  for i in range(3000)])
"""Made-up words for the model's actions and the retrieved documents: real text is varied, so
DuckDB cannot answer a text filter from a small string dictionary."""
DEFAULT_STORE = Path(tempfile.gettempdir()) / "agentrl-bench-queries.duckdb"
MODULES = [f"model.layers.{i}.{m}" for i in range(2) for m in
           ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]


def chunk_frames(run_id: str, steps: range, rng: np.random.Generator) -> dict[str, pd.DataFrame]:
    """All rows of ``steps`` of one run, one DataFrame per table."""
    n_steps = len(steps)
    n = n_steps * TASKS * G
    step = np.repeat(np.array(steps, dtype=np.int32), TASKS * G)
    g = np.tile(np.repeat(np.arange(TASKS), G), n_steps)
    r = np.tile(np.arange(G), n_steps * TASKS)
    traj_id = np.char.add(np.char.add(np.char.add(np.char.add(
        "s", step.astype(str)), "-g"), g.astype(str)), np.char.add("-r", r.astype(str)))
    group_id = np.char.add(np.char.add("s", step.astype(str)), np.char.add("-g", g.astype(str)))
    task_num = rng.integers(0, 256, n)
    task_id = np.char.add("search-train-", task_num.astype(str))
    n_turns = rng.integers(1, 5, n)
    reward = rng.random(n).round(2)
    success = reward > 0.6
    place = np.array(PLACES)[task_num % len(PLACES)]
    prompt = np.char.add(np.char.add("In what year was the capital of ", place), " founded?")
    traj = pd.DataFrame({
        "run_id": run_id, "step": step, "traj_id": traj_id, "group_id": group_id,
        "task_id": task_id, "reward": reward, "advantage": rng.normal(size=n), "success": success,
        "num_turns": n_turns.astype(np.int32), "finish_reason": np.where(success, "answered", "max_turns"),
        "split": "train", "rank": 0, "prompt": prompt, "answer": "1204",
        "golds": '["1204"]', "failure_class": np.where(success, None, rng.choice(CLASSES[1:], n)),
        "filtered": rng.random(n) < 0.1, "grad_norm": rng.gamma(2.0, 0.1, n),
        "response_tokens": rng.integers(20, 100, n).astype(np.int32),
        "info": '{"episode_seed": 1}'})
    t_idx = np.repeat(np.arange(n), n_turns)
    turn_no = np.concatenate([np.arange(k) for k in n_turns]).astype(np.int32)
    nt = len(t_idx)
    words = VOCAB[rng.integers(0, len(VOCAB), (nt, 36))]
    action = [f"<think>{' '.join(w[:8])}</think><search>{' '.join(w[8:11])} {p}</search>"
              for w, p in zip(words, place[t_idx])]
    observation = [f"\n\n<information>Doc 1(Title: {w[11]}) {' '.join(w[12:24])}\n"
                   f"Doc 2(Title: {w[24]}) {' '.join(w[25:36])}</information>\n\n" for w in words]
    turns = pd.DataFrame({
        "run_id": run_id, "step": step[t_idx], "traj_id": traj_id[t_idx], "turn": turn_no,
        "action": action, "observation": observation,
        "action_valid": True, "action_type": "search", "parsed": None, "obs_truncated": False,
        "action_truncated": False, "latency_s": 0.003, "error": None, "state_diff": None,
        "advantage": traj["advantage"].to_numpy()[t_idx], "step_reward": 0.0})
    rewards = pd.DataFrame({"run_id": run_id, "step": np.repeat(step, 4),
                            "traj_id": np.repeat(traj_id, 4),
                            "component": np.tile(["outcome", "format", "cost", "process"], n),
                            "value": rng.random(4 * n).round(3)})
    length = rng.integers(40, 161, n)
    k_idx = np.repeat(np.arange(n), length)
    pos = (np.arange(len(k_idx)) - np.repeat(np.cumsum(length) - length, length)).astype(np.int32)
    prompt_len = 30
    role = np.where(pos < prompt_len, "prompt", np.where((pos // 20) % 2 == 0, "action",
                                                           "observation"))
    trained = role == "action"
    m = len(k_idx)
    lp = -rng.gamma(1.0, 0.8, m)
    tokens = pd.DataFrame({
        "run_id": run_id, "step": step[k_idx], "traj_id": traj_id[k_idx], "pos": pos,
        "token_id": rng.integers(0, 49152, m, dtype=np.int32), "text": np.char.add(" ", VOCAB[rng.integers(0, len(VOCAB), m)]),
        "role": role, "trained": trained, "logprob": np.where(trained, lp, np.nan),
        "advantage": np.where(trained, traj["advantage"].to_numpy()[k_idx], np.nan),
        "turn": np.where(pos < prompt_len, -1, np.minimum((pos - prompt_len) // 40,
                                                          n_turns[k_idx] - 1)).astype(np.int32),
        "entropy": np.where(trained, rng.random(m), np.nan),
        "new_logprob": np.where(trained, lp + rng.normal(0, 0.01, m), np.nan),
        "ref_logprob": np.where(trained, lp + rng.normal(0, 0.05, m), np.nan), "value": np.nan})
    metrics = pd.DataFrame({"run_id": run_id, "step": np.repeat(np.array(steps, dtype=np.int32),
                                                                len(METRIC_NAMES)),
                            "name": np.tile(METRIC_NAMES, n_steps),
                            "value": np.abs(rng.normal(size=n_steps * len(METRIC_NAMES)))})
    grads = pd.DataFrame({"run_id": run_id, "step": np.repeat(np.array(steps, dtype=np.int32),
                                                              len(MODULES)),
                          "module": np.tile(MODULES, n_steps),
                          "norm": rng.gamma(2.0, 0.05, n_steps * len(MODULES))})
    return {"trajectories": traj, "turns": turns, "rewards": rewards, "tokens": tokens,
            "metrics": metrics, "grad_stats": grads}


def build(path: Path, steps: int, chunk: int = 50) -> None:
    """Create the store: the schema, two runs, every step's rows in bulk inserts."""
    t0 = time.perf_counter()
    con = db.connect(path)
    migrate(con)
    rng = np.random.default_rng(0)
    now = pd.Timestamp.now()
    for run_id, n_steps in ((SMALL_RUN, 20), (RUN, steps)):
        con.execute("INSERT INTO runs (run_id, name, created_at, updated_at, status, config, "
                    "last_step) VALUES (?, ?, ?, ?, 'finished', ?, ?)",
                    [run_id, run_id, now, now, json.dumps({"env": "search", "model": "tiny"}),
                     n_steps])
        for start in range(1, n_steps + 1, chunk):
            frames = chunk_frames(run_id, range(start, min(start + chunk, n_steps + 1)), rng)
            for table, df in frames.items():
                cols = [c for (c,) in con.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                    "ORDER BY ordinal_position", [table]).fetchall()]
                df = df.reindex(columns=cols)  # noqa: F841 (DuckDB reads df by name)
                con.execute(f"INSERT INTO {table} SELECT * FROM df")
    counts = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
              for t in ("trajectories", "turns", "tokens")}
    con.close()
    print(f"built {path}: {counts} in {time.perf_counter() - t0:.0f} s, "
          f"{path.stat().st_size / 2**20:.0f} MiB", flush=True)


def ensure(path: Path, steps: int = 3125) -> None:
    """Build the store at ``path`` unless it exists (bench/pages.py serves the same store)."""
    if not path.exists():
        build(path, steps)
    else:  # the app migrates nothing; bring an older bench store up to the current schema
        con = db.connect(path)
        migrate(con)
        con.close()


def page_queries(path: str) -> dict[str, callable]:
    """The app's reads for each page, on the big run, as ``name -> zero-argument call``."""
    step, traj = 1500, "s1500-g2-r5"
    return {
        "open + SELECT 1 (every query pays it)": lambda: _select_one(path),
        "Runs: all_runs": lambda: queries.all_runs([path]),
        "Dynamics: metrics (4 names)": lambda: queries.metrics(
            path, RUN, ["reward/mean", "success/rate", "grad/0", "policy/1"]),
        f"Dynamics: metrics (all {len(METRIC_NAMES)})": lambda: queries.metrics(path, RUN),
        "Dynamics: grad_stats": lambda: queries.grad_stats(path, RUN),
        "step picker: steps": lambda: queries.steps(path, RUN),
        "Replay: trajectory": lambda: queries.trajectory(path, RUN, traj),
        "Replay: turns": lambda: queries.turns(path, RUN, [traj]),
        "Replay: rewards": lambda: queries.rewards(path, RUN, [traj]),
        "Replay: tokens (one trajectory)": lambda: queries.tokens(path, RUN, traj),
        "Groups: groups of a step": lambda: queries.groups(path, RUN, step),
        "Groups: one group's trajectories": lambda: queries.trajectories(path, RUN, step,
                                                                         "s1500-g2"),
        "Dynamics: top_gradient_trajectories": lambda: queries.top_gradient_trajectories(
            path, RUN, step),
        "Failures: failure_counts (facets)": lambda: queries.failure_counts(path, RUN),
        "Failures: search, facets only": lambda: queries.search_trajectories(
            path, RUN, classes=["wrong_answer"], step_range=(100, 2000)),
        "Failures: full-text search (rare word)": lambda: queries.search_trajectories(
            path, RUN, str(VOCAB[123])),
        "Failures: full-text search (place name)": lambda: queries.search_trajectories(
            path, RUN, "Quenith"),
        "Failures: full-text, no match": lambda: queries.search_trajectories(path, RUN, "zzqx"),
        "Tasks: task_ids": lambda: queries.task_ids(path, RUN),
        "Tasks: task_history": lambda: queries.task_history(path, RUN, "search-train-17"),
    }


def _select_one(path: str):
    with db.reading(path) as con:
        return con.execute("SELECT 1").fetchall()


def read(path: str, repeats: int) -> None:
    """Child process: time each query; print one JSON line of results and the peak RSS."""
    out = {}
    for name, call in page_queries(path).items():
        call()  # first call: file cache warm, as for a user clicking around
        times, cpu = [], []
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            result = call()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        rows = len(result) if hasattr(result, "__len__") else 1
        out[name] = {"ms": 1e3 * statistics.median(times), "cpu_ms": 1e3 * statistics.median(cpu),
                     "rows": rows, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    out["_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", default=None, help="store file (default: a file in the temp dir)")
    parser.add_argument("--steps", type=int, default=3125, help="steps of 32 trajectories")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--read", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    path = Path(args.store or DEFAULT_STORE)
    if args.read:
        read(str(path), args.repeats)
        return
    ensure(path, args.steps)
    child = subprocess.run([sys.executable, __file__, "--store", str(path), "--read",
                            "--repeats", str(args.repeats)], capture_output=True, text=True,
                           check=True)
    res = json.loads(child.stdout.strip().splitlines()[-1])
    rss = res.pop("_peak_rss_mb")
    print(f"store {path.name}: {path.stat().st_size / 2**20:.0f} MiB; median of {args.repeats} "
          "calls, each opening the store read-only as the app does")
    print(f"{'query':42s} {'wall ms':>8s} {'CPU ms':>8s} {'rows':>8s} {'target':>7s} "
          f"{'peak RSS MB':>12s}")
    for name, r in res.items():
        target = 50 if "tokens" in name else 300
        flag = "ok" if r["ms"] <= target else "OVER"
        print(f"{name:42s} {r['ms']:8.1f} {r['cpu_ms']:8.1f} {r['rows']:8d} {flag:>7s} "
              f"{r['rss']:12.0f}")
    print(f"peak RSS of the reading process: {rss:.0f} MB (target <= 1024 MB)")


if __name__ == "__main__":
    main()
