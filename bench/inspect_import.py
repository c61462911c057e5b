"""Import throughput and memory of ``python -m storage.io import LOG.eval --format inspect``.

    .venv/bin/python bench/inspect_import.py [--samples 5000] [--repeats 2] [--out DIR]

Makes (once, kept in ``--out``) a real Inspect log of N samples with inspect-ai's offline mockllm
model (requirements-inspect.txt): each sample calls a real ``add`` tool three times with new
arguments and answers, so it has 8 messages, its events and its usage (given with every output,
so mockllm never loads a tokenizer). Then imports it into a fresh store ``--repeats`` times,
each in a child process, and prints samples/s (wall, from the child's own perf_counter) and the
child's peak RSS (ru_maxrss). The baseline row is the same child importing nothing (Python, duckdb,
pyarrow and storage imported, the store prepared) — what the product costs before a sample. The
``follow`` rows take the same log the way ``python -m storage.io follow DIR --format inspect``
does (storage/ingest/follow_logs.py: the file opened inside the directory, its digest, then its
samples), in a child of their own too.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MAKE = r"""
import sys
from inspect_ai import Task, eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import tool

@tool
def add():
    async def execute(x: int, y: int):
        '''Add two integers.

        Args:
            x: The first integer.
            y: The second integer.
        '''
        return str(x + y)
    return execute

def outputs(messages, tools, tool_choice, config):
    n = len(messages)
    if n >= 7:
        out = ModelOutput.from_content("mockllm", f"The total is {messages[-1].text}.")
    else:
        out = ModelOutput.for_tool_call("mockllm", "add", {"x": n, "y": n * 7})
    out.usage = ModelUsage(input_tokens=40 * n, output_tokens=12, total_tokens=40 * n + 12)
    return out

n = int(sys.argv[2])
task = Task(name="bench", dataset=[Sample(id=f"q{i}", input=f"Add up the numbers for case {i}.",
                                          target=str(i % 50)) for i in range(n)],
            solver=[use_tools(add()), generate()], scorer=includes())
inspect_eval(task, model=get_model("mockllm/model", custom_outputs=outputs), log_dir=sys.argv[1],
             display="none", max_samples=64)
"""

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from storage.ingest.follow import Follower
from storage.ingest.inspect_import import import_inspect
from storage.migrations import prepare
if sys.argv[1] == "-":
    prepare(sys.argv[2]); n = 0
elif sys.argv[1].startswith("follow:"):
    follower = Follower(sys.argv[1][len("follow:"):], sys.argv[2], "inspect", log=lambda m: None)
    assert follower.poll_once() == 0 and follower.poll_once() == 1  # held still, then read
    n = follower.report.trajectories
    assert not follower.report.failed and not follower.report.errors, follower.report.errors
    follower.finish(); follower.close()
else:
    result = import_inspect(sys.argv[1], sys.argv[2])
    n = sum(r.imported for r in result.reports)
    assert not result.errors and not any(r.failed for r in result.reports)
print(json.dumps({"seconds": time.perf_counter() - t0, "imported": n,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def make_log(out: Path, samples: int) -> Path:
    found = sorted(out.glob("*.eval"))
    if found:
        return found[-1]
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", MAKE, str(out), str(samples)], check=True, cwd=ROOT,
                   timeout=3600)
    log = sorted(out.glob("*.eval"))[-1]
    print(f"made {log.name}: {samples} samples, {log.stat().st_size / 1e6:.1f} MB, "
          f"in {time.perf_counter() - t0:.0f} s")
    return log


def child(source: str, store: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, source, str(store)], cwd=ROOT,
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "tmp" / "bench-inspect"))
    args = ap.parse_args()
    log = make_log(Path(args.out), args.samples)
    with tempfile.TemporaryDirectory() as tmp:
        base = child("-", Path(tmp) / "empty.duckdb")
        print(f"{'run':<10} {'samples':>8} {'seconds':>8} {'samples/s':>10} {'peak RSS MB':>12}")
        print(f"{'baseline':<10} {0:>8} {base['seconds']:>8.2f} {'':>10} "
              f"{base['peak_rss_mb']:>12.0f}")
        for i in range(args.repeats):
            for kind, source in (("import", str(log)), ("follow", f"follow:{log.parent}")):
                r = child(source, Path(tmp) / f"{kind}{i}.duckdb")
                print(f"{kind:<10} {r['imported']:>8} {r['seconds']:>8.2f} "
                      f"{r['imported'] / r['seconds']:>10.0f} {r['peak_rss_mb']:>12.0f}")
    print(f"(children's ru_maxrss, this process: "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)")


if __name__ == "__main__":
    main()
