"""How much recording a training step costs. A script, not a test:

    .venv/bin/python bench/storage.py [--steps 8] [--no-model]

One step = 64 trajectories x 512 tokens (32,768 token rows) plus their trajectories, turns (3 per
trajectory), rewards (4 per trajectory) and 12 metrics. Printed:

* ``Recorder.record_step`` on a file store, as the trainer calls it (open, one transaction, close);
* the same inserts on a connection kept open (the recorder's steady-state cost without open/close);
* a bare ``INSERT INTO t SELECT * FROM df`` of the same DataFrames into an open connection;
* rows/s of each, the ratios to the bare insert, and the recording time as a share of a
  training step of the tiny stand-in model (2-layer, 128-wide Llama, vocabulary 49,152):
  forward + backward over the same 64 x 512 tokens.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage import db  # noqa: E402
from storage.migrations import migrate, prepare  # noqa: E402
from storage.recorder import Recorder, insert_frame, now, to_frame  # noqa: E402

TRAJ, TOKENS, TURNS = 64, 512, 3


def step_tables(step: int) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(step)
    ids = [f"{step}-{i}" for i in range(TRAJ)]
    roles = np.where(np.arange(TOKENS) < 128, "prompt",
                     np.where((np.arange(TOKENS) // 64) % 2 == 0, "action", "observation"))
    tokens = pd.DataFrame({
        "traj_id": np.repeat(ids, TOKENS), "pos": np.tile(np.arange(TOKENS, dtype=np.int32), TRAJ),
        "token_id": rng.integers(0, 49152, TRAJ * TOKENS, dtype=np.int32),
        "text": rng.choice([" the", " search", "</answer>", " 1204", "\n"], TRAJ * TOKENS),
        "role": np.tile(roles, TRAJ), "trained": np.tile(roles == "action", TRAJ),
        "logprob": rng.normal(-1, 0.5, TRAJ * TOKENS), "advantage": 0.5,
        "turn": np.tile(np.minimum(np.arange(TOKENS) // 128, TURNS - 1), TRAJ).astype(np.int32),
        "entropy": rng.random(TRAJ * TOKENS)})
    trajectories = pd.DataFrame({
        "traj_id": ids, "group_id": [f"g{i // 8}" for i in range(TRAJ)],
        "task_id": [f"q{i // 8}" for i in range(TRAJ)], "reward": rng.random(TRAJ),
        "advantage": rng.normal(size=TRAJ), "success": rng.random(TRAJ) > 0.5,
        "num_turns": TURNS, "finish_reason": "answered", "prompt": "In what year ...?",
        "answer": "1204", "golds": '["1204"]', "response_tokens": 192})
    turns = pd.DataFrame({"traj_id": np.repeat(ids, TURNS), "turn": np.tile(np.arange(TURNS), TRAJ),
                          "action": "<search>capital of Varnia</search>",
                          "observation": "<information>Doc 1 ... Doc 3 ...</information>",
                          "action_valid": True, "action_type": "search"})
    rewards = pd.DataFrame({"traj_id": np.repeat(ids, 4),
                            "component": np.tile(["outcome", "format", "cost", "process"], TRAJ),
                            "value": rng.random(4 * TRAJ)})
    metrics = {f"metric/{i}": float(i) for i in range(12)}
    return {"metrics": metrics, "trajectories": trajectories, "turns": turns, "rewards": rewards,
            "tokens": tokens}


def n_rows(tables) -> int:
    return sum(len(v) for v in tables.values())


class RecorderWrites:
    """``Recorder.record_step`` exactly as the trainer calls it (open, one transaction, close)."""

    def __init__(self, path: Path):
        self.rec = Recorder(path)
        self.rec.start_run({"env": "search", "model": "tiny", "algo": "grpo"})

    def __call__(self, step: int, tables: dict) -> None:
        self.rec.record_step(step, **tables)


class SteadyWrites:
    """The recorder's own statements, on a connection that stays open."""

    def __init__(self, path: Path):
        prepare(path)
        self.con = db.connect(path)

    def __call__(self, step: int, tables: dict) -> None:
        self.con.execute("BEGIN TRANSACTION")
        for table, rows in tables.items():
            insert_frame(self.con, table, to_frame(table, rows), "bench", step)
        self.con.execute("UPDATE runs SET last_step = ?, updated_at = ? WHERE run_id = 'bench'",
                         [step, now()])
        self.con.execute("COMMIT")


class BareWrites:
    """INSERT INTO t SELECT * FROM df, the frames shaped exactly like the tables beforehand."""

    def __init__(self, path: Path):
        self.con = db.connect(path)
        migrate(self.con)
        self.shaped: dict[int, dict[str, pd.DataFrame]] = {}

    def prepare(self, step: int, tables: dict) -> None:
        frames = {}
        for table, rows in tables.items():
            cols = [c for (c,) in self.con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                "ORDER BY ordinal_position", [table]).fetchall()]
            frames[table] = to_frame(table, rows).assign(run_id="bench", step=step).reindex(
                columns=cols)
        self.shaped[step] = frames

    def __call__(self, step: int, tables: dict) -> None:
        for table, df in self.shaped[step].items():  # noqa: B007 (DuckDB reads df by name)
            self.con.execute(f"INSERT INTO {table} SELECT * FROM df")


def bench_writes(tmp: Path, steps: list[dict]) -> dict[str, list[float]]:
    """Time the three writers step by step, in turn, so that load on the machine hits all alike."""
    RecorderWrites(tmp / "warm.duckdb")(0, steps[0])  # first-use costs out of the figures
    writers = {"Recorder.record_step (open+write+close)": RecorderWrites(tmp / "rec.duckdb"),
               "recorder inserts, connection kept open": SteadyWrites(tmp / "steady.duckdb"),
               "bare INSERT ... SELECT * FROM df": BareWrites(tmp / "bare.duckdb")}
    times: dict[str, list[float]] = {name: [] for name in writers}
    for step, tables in enumerate(steps):
        writers["bare INSERT ... SELECT * FROM df"].prepare(step, tables)
        for name, write in writers.items():
            t0 = time.perf_counter()
            write(step, tables)
            times[name].append(time.perf_counter() - t0)
    return times


def bench_train_step(micro: int = 4) -> float:
    """Forward + backward of the tiny stand-in over 64 x 512 tokens (micro-batches of ``micro``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=49152, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=TOKENS))
    ids = torch.randint(0, 49152, (TRAJ, TOKENS))
    t0 = time.perf_counter()
    for start in range(0, TRAJ, micro):
        batch = ids[start:start + micro]
        loss = model(input_ids=batch, labels=batch).loss * (len(batch) / TRAJ)
        loss.backward()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--no-model", action="store_true", help="skip the training-step timing")
    args = parser.parse_args()
    steps = [step_tables(s) for s in range(args.steps)]
    rows = n_rows({k: (v if isinstance(v, pd.DataFrame) else pd.Series(v)) for k, v in
                   steps[0].items()})
    with tempfile.TemporaryDirectory() as tmp:
        results = bench_writes(Path(tmp), steps)
    bare = statistics.median(results["bare INSERT ... SELECT * FROM df"])
    print(f"one step = {TRAJ} trajectories x {TOKENS} tokens: {rows:,} rows "
          f"({TRAJ * TOKENS:,} token rows); median of {args.steps} steps")
    print(f"{'':44s} {'ms/step':>9s} {'rows/s':>12s} {'vs bare':>8s}")
    for name, times in results.items():
        med = statistics.median(times)
        print(f"{name:44s} {med * 1e3:9.1f} {rows / med:12,.0f} {med / bare:8.2f}")
    if not args.no_model:
        train_s = bench_train_step()
        rec = statistics.median(results["Recorder.record_step (open+write+close)"])
        print(f"tiny-model forward+backward over {TRAJ} x {TOKENS} tokens: {train_s:.2f} s; "
              f"recording the step = {100 * rec / train_s:.2f}% of it")


if __name__ == "__main__":
    main()
