"""Import throughput and memory of the RL trainers' rollouts (issue 50), token rows per second.

    .venv/bin/python bench/rl_import.py [--rollouts 512] [--tokens 1500] [--turns 4] \
        [--steps 3] [--verl-only [--team]]

Each row runs in a child process of its own and prints token rows written per second (wall,
the child's own perf_counter around the import only) and the child's peak RSS (ru_maxrss),
beside the RSS it had before importing (Python, torch/verl where needed, the input in memory):

* ``verl-batch``: a real ``verl.DataProto`` of R rollouts of T tokens (a fifth prompt, the rest
  response, every fourth response token an observation: ~T/5 turns a rollout), recorded by
  ``VerlBatchRecorder.record`` with the tiny model's tokenizer (requirements-rl.txt), timed
  without making the recorder (once a run: it prepares the store, ~0.3 s), ``--steps`` steps
  of a run (the first also learns the tokenizer's vocabulary); with ``--turns N`` also one of
  N turns a rollout (each turn's last fifth an observation). Beside each step, the floor: a
  bare insert of the same rows (read back from the store as one Arrow table) into a store of
  their own, one ``INSERT ... SELECT`` in one ``db.writing`` transaction, as ``record()``
  opens, commits and closes one. ``--team``: both into team stores (storage/team_store.py, a
  SQLite catalog each) instead of DuckDB files.
* ``verifiers``: tests/fixtures/verifiers/traces.jsonl (written by verifiers' own writer),
  its lines repeated with fresh trace ids to 10 R episodes (~72 tokens a trace), imported by
  ``python -m storage.io import`` (no tokenizer: token text is the id) and through
  ``read_verifiers`` with the tokenizer (each token decoded); then R episodes whose nodes'
  spans (ids, mask, per-token values) are repeated to ~T tokens a trace, imported with ids.
* ``art``: R/2 groups of 2 trajectories made with ART's own classes and
  ``serialize_trajectory_groups``, each answer T/2 words: rows are rebuilt from the text.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COMMON = r"""
import json, resource, sys, time
sys.path.insert(0, ROOT)
from storage import db
def rows(store):
    with db.reading(store) as con:
        return con.execute("SELECT count(*) FROM tokens").fetchone()[0]
def report(name, store, seconds, before):
    n = rows(store)
    print(json.dumps({"format": name, "token_rows": n, "seconds": round(seconds, 2),
                      "rows_per_s": round(n / seconds), "rss_before_mb": before,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))
def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
"""

VERL = COMMON + r"""
import numpy as np, torch
from verl import DataProto
from core.model.models import load_tokenizer
from storage.integrations.verl_batch import VerlBatchRecorder
from storage.migrations import prepare
R, T, out, turns, steps = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]),
                           int(sys.argv[5]))
team = len(sys.argv) > 6 and sys.argv[6] == "team"
tok = load_tokenizer("tiny")
P = T // 5
def make(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, 40000, (R, T), generator=g)
    mask = torch.ones(R, T - P, dtype=torch.long)
    if turns:  # each turn's last fifth an observation
        span = (T - P) // turns
        for k in range(turns):
            mask[:, k * span + span * 4 // 5:(k + 1) * span] = 0
    else:
        mask[:, 3::4] = 0
    lp = -torch.rand(R, T - P, generator=g)
    return DataProto.from_dict(tensors={
        "prompts": ids[:, :P], "responses": ids[:, P:], "input_ids": ids,
        "attention_mask": torch.ones(R, T, dtype=torch.long), "response_mask": mask,
        "old_log_probs": lp, "rollout_log_probs": lp - 0.01,
        "advantages": torch.randn(R, T - P, generator=g),
        "token_level_rewards": torch.zeros(R, T - P)},
        non_tensors={"uid": np.array([f"u{i // 8}" for i in range(R)], dtype=object)})
COLUMNS = ("run_id, step, traj_id, pos, token_id, text, role, trained, logprob, advantage, "
           "turn, train_logprob")
bare_store = out + ".bare.duckdb"
if team:  # both stores team stores (a SQLite catalog each) instead of DuckDB files
    from storage import team_store
    team_store.init(out, "sqlite")
    team_store.init(bare_store, "sqlite")
prepare(bare_store)
rec = VerlBatchRecorder(out, tok, run_id="bench")  # once a run (it prepares the store)
before, times, bare, cpu, bare_cpu = rss(), [], [], [], []
for step in range(1, steps + 1):
    batch = make(step)
    t, c = time.perf_counter(), time.process_time()
    rec.record(batch, step=step)  # what each step pays
    times.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)  # CPU seconds, every thread's: steadier under load
    with db.reading(out) as con:  # the same rows, as a bare Arrow table
        table = con.sql(f"SELECT {COLUMNS} FROM tokens WHERE step = {step}").to_arrow_table()
    t, c = time.perf_counter(), time.process_time()
    with db.writing(bare_store) as con:  # one INSERT of them, one transaction, as record()'s
        con.register("_rows", table)
        con.execute("INSERT INTO tokens BY NAME SELECT * FROM _rows")
        con.unregister("_rows")
    bare.append(time.perf_counter() - t)
    bare_cpu.append(time.process_time() - c)
    del table
name = f"verl-batch ({turns} turns)" if turns else "verl-batch"
report(name, out, sum(times), before)
r3 = lambda xs: [round(x, 3) for x in xs]  # noqa: E731
print(json.dumps({"format": name, "steps": r3(times), "bare": r3(bare), "cpu": r3(cpu),
                  "bare_cpu": r3(bare_cpu), "rows_per_step": R * T}))
"""

VERIFIERS = r"""
import json, sys, uuid
src, R, out, reps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
lines = open(src).read().splitlines()
with open(out, "w") as f:
    for i in range(R):
        ep = json.loads(lines[i % len(lines)])
        for t in ep["traces"]:
            t["id"] = uuid.uuid4().hex
            for node in t["nodes"]:  # longer traces: each node's span repeated reps times
                for key in ("token_ids", "mask", "logprobs", "trainer_logprobs", "advantages"):
                    if isinstance(node.get(key), list):
                        node[key] = node[key] * reps
        f.write(json.dumps(ep) + "\n")
"""

VERIFIERS_IMPORT = COMMON + r"""
from storage import io
src, out, decode, label = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
before = rss()
if decode:
    from core.model.models import load_tokenizer
    from storage.ingest.feed import write_records
    from storage.ingest.import_batch import finish_import
    from storage.ingest.report import ImportReport
    from storage.ingest.verifiers_traces import read_verifiers
    from storage.migrations import prepare
    tok = load_tokenizer("tiny")
    before = rss()
    t = time.perf_counter()
    prepare(out)
    rep, run = ImportReport("b", src, "verifiers"), {"name": "b", "config": None, "created": False}
    write_records(((w, r, 0) for w, r in read_verifiers(src, tokenizer=tok)), out, "verifiers",
                  "b", run, rep)
    finish_import(out, "b", "verifiers", run, rep)
else:
    t = time.perf_counter()
    assert io.main(["import", src, "--db", out, "--format", "verifiers", "--run-id", "b"]) == 0
report(f"verifiers ({label})", out, time.perf_counter() - t, before)
"""

ART = COMMON + r"""
import art
from art.utils.trajectory_logging import serialize_trajectory_groups
from storage import io
R, T, out, log = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
def one(i):
    words = " ".join(f"w{i}-{k}" for k in range(T // 2))
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": f"Task {i}"},
                                                {"role": "assistant", "content": words}],
                          reward=1.0)
open(log, "w").write(serialize_trajectory_groups(
    [art.TrajectoryGroup([one(2 * g), one(2 * g + 1)]) for g in range(R // 2)]))
before = rss()
t = time.perf_counter()
assert io.main(["import", log, "--db", out, "--format", "art", "--run-id", "b"]) == 0
report("art", out, time.perf_counter() - t, before)
"""


def _child(code: str, *args: str) -> dict | None:
    done = subprocess.run([sys.executable, "-c", code.replace("ROOT", repr(str(ROOT)), 1),
                           *args], capture_output=True, text=True, cwd=ROOT)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode or not lines:
        print(f"failed: {done.stderr[-2000:]}", file=sys.stderr)
        return None
    out: dict = {}
    for line in lines:
        out.update(json.loads(line))
    return out


def _verl_steps(row: dict) -> str:
    """Each step's rows/s beside the bare insert's of the same rows, and their ratio: in wall
    time, then in CPU time (the process's, all threads: what load does not stretch)."""
    n = row["rows_per_step"]
    return "\n".join(
        f"  step {k}: record {n / a:>10,.0f} rows/s ({a:.3f} s), bare Arrow insert "
        f"{n / b:>10,.0f} ({b:.3f} s): {b / a:.2f} of the bare rate; per CPU-second "
        f"{n / ca:>10,.0f} vs {n / cb:>10,.0f}: {cb / ca:.2f}"
        for k, (a, b, ca, cb) in enumerate(zip(row["steps"], row["bare"], row["cpu"],
                                               row["bare_cpu"]), 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=1500)
    parser.add_argument("--turns", type=int, default=0,
                        help="also a verl batch of this many turns a rollout")
    parser.add_argument("--steps", type=int, default=3, help="verl steps recorded in a run")
    parser.add_argument("--team", action="store_true",
                        help="with --verl-only: record verl's steps (and the bare insert) into "
                             "team stores (a SQLite catalog each) instead of DuckDB files")
    parser.add_argument("--verl-only", action="store_true",
                        help="leave out the other formats (with --turns, verl's turn-a-fourth "
                             "batch too)")
    args = parser.parse_args()
    R, T, S = str(args.rollouts), str(args.tokens), str(args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        kind = ["team"] if args.team else []
        if args.team and not args.verl_only:
            raise SystemExit("--team goes with --verl-only")
        rows = [] if args.verl_only and args.turns else \
            [_child(VERL, R, T, str(tmp / "verl.duckdb"), "0", S, *kind)]
        if args.turns:
            rows.append(_child(VERL, R, T, str(tmp / "verl-turns.duckdb"), str(args.turns), S,
                               *kind))
        if args.verl_only:
            return _print(rows)
        fixture = ROOT / "tests" / "fixtures" / "verifiers" / "traces.jsonl"
        scaled = tmp / "traces.jsonl"
        subprocess.run([sys.executable, "-c", VERIFIERS, str(fixture), str(int(R) * 10),
                        str(scaled), "1"], check=True)
        rows.append(_child(VERIFIERS_IMPORT, str(scaled), str(tmp / "vf.duckdb"), "0", "ids"))
        rows.append(_child(VERIFIERS_IMPORT, str(scaled), str(tmp / "vf2.duckdb"), "1",
                           "tokenizer"))
        long = tmp / "long.jsonl"  # traces of about T tokens (the fixture's hold ~72)
        subprocess.run([sys.executable, "-c", VERIFIERS, str(fixture), R, str(long),
                        str(max(1, int(T) // 72))], check=True)
        rows.append(_child(VERIFIERS_IMPORT, str(long), str(tmp / "vf3.duckdb"), "0",
                           f"ids, {T}-token traces"))
        rows.append(_child(ART, R, T, str(tmp / "art.duckdb"), str(tmp / "0001.jsonl")))
    _print(rows)


def _print(rows: list) -> None:
    for row in rows:
        if row:
            print(f"{row['format']:<32} {row['token_rows']:>9,} rows {row['seconds']:>7.2f} s "
                  f"{row['rows_per_s']:>11,} rows/s  RSS {row['rss_before_mb']} -> "
                  f"{row['peak_rss_mb']} MB")
            if "bare" in row:
                print(_verl_steps(row))


if __name__ == "__main__":
    main()
