"""The learning proof on one lent GPU, in one prepared command (issue 39), and its CPU rehearsal.

    python bench/gpu_proof.py pack                 # here, once: .gpu-pack/part-0, part-1, MANIFEST
    python bench/gpu_proof.py stash | restore      # here: the checkout's stores out of / back in
    python bench/gpu_proof.py procedure            # the exact device calls, with sizes
    python3 bench/gpu_proof.py receive .gpu-pack/part-N [--into /tmp/gpu-proof]   # there
    python3 bench/gpu_proof.py check --machine | run --out DIR [--budget-s 480]   # there
    python bench/gpu_proof.py rehearse [--work DIR]   # the whole path on this CPU, tiny model

``run``: start-up checks (bench/gpu_checks.py: pinned versions, the model's sha256, JAX off the
GPU, free GPU memory, disk), the model dequantized once into the cache, the SFT start (the
``search-smollm2`` preset, ``--sft-steps`` 60, evaluated on ``--eval-tasks`` 200 held-out tasks),
then GRPO, GRPO + information gain, GiGPO, SPA and the PRM (bench/credit_compare.py's
``VARIANTS``), seeds 0 and 1, each its own process on the one GPU with its own DuckDB file,
``--init-from`` the start, evaluated every ``--eval-every`` RL steps on the start's tasks and
episode seeds (``eval_seed`` 0). RL settings are the last comparisons' (sample_runs/README.md
section 9): 8 tasks x 8 rollouts per step, temperature 1, fresh train tasks, the held-out mix,
LOOP's |A| filter, lr ``--lr`` 4e-4 (between 2e-4, whose carried step barely moves the policy,
and 6e-4, which broke the greedy answers after 7 steps) and half that for information gain
(its gradient is about twice GRPO's; at half the lr its step matched GRPO's). At ``--budget-s``
less ``--reserve-s`` every run still going is sent SIGINT (it finishes its step, evaluating if
due) and killed ``--reserve-s`` - 25 s later. The stores are merged into one (bench/gpu_store.py)
and the table printed: held-out, two-hop, single-hop, gained / lost against the start with the
two-sided sign test p, RL steps, steps/s, peak GPU memory, at the last step every run evaluated.
$OUT gets table.txt, proof.json, store.duckdb.xz (no token rows) and logs.tar.xz.

How many steps fit in 8 minutes on one H200 (an estimate, to be replaced by the first run's
steps/s). Measured on 2 CPU cores (search_credit.duckdb, 64-rollout steps from the 60-step SFT
start): 6,500-7,700 generated tokens per step (2.7-3.1 turns, 100-130 tokens per rollout; the
longest 160-384), rollout 245-375 s, update 450-800 s, information gain / PRM passes 130-200 s;
an SFT step 20-23 s; 100 held-out tasks 250-620 s. The arithmetic is small: a step is about
6 x 135M x 64k trained tokens + 2 x 135M x 60k sampled and scored ~ 1e14 FLOP, 0.13 s at the
790 TFLOP/s (bf16, autocast) measured on these H200s; ten runs 1.3 s. What bounds a GPU step is
the number of sequential small launches: one decode step of the batch is a 30-layer forward
with 7 LoRA-wrapped projections per layer (~1,200 kernels plus peft's Python), 15-30 ms; a step
has up to 4 turns x 96 = 384 of them (rollout 6-12 s); the update runs one trajectory at a time
(64 microbatches, forward + backward, ~60-100 ms each: 4-7 s) plus the old and reference
logprob passes (2-4 s); dense credits add 3-6 s. So 12-30 s per step alone; ten processes
time-slice the GPU without MPS, but each leaves it idle between its launches, so about 1.5-2x
that: 20-50 s. Eval of 200 tasks greedy in one batch: 384 decode steps, 8-20 s. SFT: 60 steps
of 8 demonstrations, ~0.3-0.6 s each, 20-40 s. In 480 s: start-up 40-60 s (unpack, checks,
dequantize 10-20 s), SFT with its evaluation 40-60 s, RL 280-320 s, merge + table + copy back
20-30 s: 6 to 16 RL steps per run. ``--rl-steps`` 12 with an evaluation every 4 steps; the
budget's stop keeps the 8 minutes when the steps are slower, and the table compares the runs at
the last step all of them evaluated.

``rehearse`` does what the GPU session does, on this CPU with the tiny model and 2 + 2 steps:
builds a pack (the GGUF stored, not compressed: xz takes ~60 s here), copies what the device tool
would send (checked under 64 MiB) into a folder standing for the machine, runs the two calls'
exact command lines there (``CALLS``), and leaves the table, the store and the logs in WORK/OUT.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # before bench/, whose storage.py would shadow the package
INTO = Path("/tmp/gpu-proof")


def _sibling(name: str):
    """A bench/ module by path (bench/ is never put on sys.path: its pages.py would shadow the
    app's pages package)."""
    import importlib.util
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


gpu_pack = _sibling("gpu_pack")
gpu_checks = _sibling("gpu_checks")
gpu_calls = _sibling("gpu_calls")
Children = _sibling("gpu_children").Children

METHODS = ("grpo", "info_gain", "gigpo", "spa", "prm")
LR_SCALE = {"info_gain": 0.5}
RL_SETTINGS = dict(task_pool=0, temperature=1.0, env_options="two_hop_frac=0.75",
                   tasks_per_step=8, min_abs_advantage=0.01, record_info_gain=False)
TINY = dict(group_size=2, tasks_per_step=2, max_turns=2, max_new_tokens=12, sft_batch_size=2,
            max_obs_tokens=64)
"""The rehearsal's sizes: seconds per step on 2 CPU cores (SFT at the preset's batch of 8: 17 s)."""
MODES = {  # the GPU run and its CPU rehearsal: the same path, other sizes
    "gpu": dict(model="smollm2-135m", device="cuda", sft_steps=60, rl_steps=12, eval_every=4,
                eval_tasks=200, budget_s=480.0, reserve_s=100.0, gib_per_run=12.0,
                runs=",".join(f"{m}-s{s}" for s in (0, 1) for m in METHODS)),
    # every method once and a second seed: ten processes starting at once on 2 CPU cores take
    # over a minute to import torch alone
    "rehearse": dict(model="tiny", device="cpu", sft_steps=2, rl_steps=2, eval_every=2,
                     eval_tasks=8, budget_s=170.0, reserve_s=30.0, gib_per_run=0.0,
                     runs=",".join(f"{m}-s0" for m in METHODS) + ",grpo-s1")}
OUT_CAP = 15 * 2**20
"""The store that comes back: under the tool's 16 MiB per file."""


def train_args(fields: dict) -> list[str]:
    """core.train flags for ``fields`` (every TrainConfig field is a flag) after the preset."""
    out = ["--preset", "search-smollm2", "--quiet"]
    for key, value in fields.items():
        out += [f"--{key.replace('_', '-')}", str(value).lower() if isinstance(value, bool)
                else str(value)]
    return out


def plan(mode: dict, args, work: Path) -> tuple[dict, dict[str, dict]]:
    """(the SFT start's fields, each RL run's fields by key 'METHOD-sSEED')."""
    credit = _sibling("credit_compare").VARIANTS
    sizes = TINY if args.rehearse else {}
    common = dict(model=mode["model"], device=mode["device"], eval_every=args.eval_every,
                  eval_tasks=args.eval_tasks, eval_seed=0, sft_steps=args.sft_steps,
                  checkpoint_every=100_000, adapter_every=0)
    start = {**common, **sizes, "seed": 0, "steps": 0, "threads": 2,
             "name": f"gpu proof: SFT start ({args.sft_steps} steps)",
             "db": str(work / "stores" / "start.duckdb"),
             "checkpoint_dir": str(work / "ckpt" / "start")}
    runs = {}
    for method, seed in args.runs:
        key = f"{method}-s{seed}"
        runs[key] = {**common, **RL_SETTINGS, **sizes, **credit[method], "seed": seed,
                     "steps": args.rl_steps, "threads": 1, "lr": args.lr * LR_SCALE.get(method, 1),
                     "name": f"gpu proof {method} seed {seed}",
                     "db": str(work / "stores" / f"{key}.duckdb"),
                     "checkpoint_dir": str(work / "ckpt" / key)}
    return start, runs


def run(args) -> int:
    """The proof; exit 0 with the table printed, 1 when a phase failed, 2 for a failed check."""
    mode = MODES["rehearse" if args.rehearse else "gpu"]
    into, out = Path(args.into), Path(args.out)
    site = into / "site"
    if not (into / "READY.json").is_file():
        sys.exit(f"error: {into}/READY.json missing: receive every part of the pack first "
                 "(python3 bench/gpu_proof.py receive .gpu-pack/part-N)")
    env = gpu_checks.child_env(site, into / "cache")
    if os.environ.get("GPU_PROOF_SITE") != str(site):
        # this process reads the stores too (merge, table): it runs in the environment the
        # children get, the pack's packages first (the GPU image has no duckdb of its own)
        os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *args.argv],
                  {**env, "GPU_PROOF_SITE": str(site)})
    t0, phases = time.monotonic(), {}
    work = into / "work"
    shutil.rmtree(work, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    start, runs = plan(mode, args, work)
    kids = Children(work / "logs", env)

    def phase(name: str, t: float) -> None:
        phases[name] = round(time.monotonic() - t, 1)
        print(f"== {name}: {phases[name]:.0f} s (at {time.monotonic() - t0:.0f} s of "
              f"{args.budget_s:.0f})", flush=True)

    t = time.monotonic()
    print(f"== checks ({len(runs)} runs, {mode['device']}), then the model into the cache",
          flush=True)
    try:
        done = subprocess.run([sys.executable, str(Path(__file__).with_name("gpu_checks.py")),
                               str(site), str(work), mode["model"], mode["device"],
                               str(len(runs)), str(args.gib_per_run), "--prepare"], cwd=ROOT,
                              env=env, timeout=args.budget_s * 0.25)
    except subprocess.TimeoutExpired:
        return _failed(work, out, f"checks and the model took over {args.budget_s * 0.25:.0f} s",
                       None)
    phase("checks + model", t)
    if done.returncode:
        return 2
    t = time.monotonic()
    # no cap by default: the runs evaluate at the same steps, so their peaks coincide and a cap
    # of 1/N only fails a run whose peak the card could have held
    fraction = 0.95 / len(runs) if mode["device"] == "cuda" and args.memory_cap else 0
    kids.start("start", [__file__, "child", "0", "--",
                         *train_args(start)])
    sft_end = t0 + args.budget_s * 0.5
    if kids.wait(sft_end, sft_end + 20, 30, {"start": start["db"]})["start"]:
        return _failed(work, out, f"the SFT start failed or took past {args.budget_s * 0.5:.0f}"
                       " s: lower --sft-steps", "start")
    phase("SFT start", t)
    ckpt = next((work / "ckpt" / "start").glob("*/checkpoint.pt")).parent
    t = time.monotonic()
    for key, fields in runs.items():
        kids.start(key, [__file__, "child", str(fraction), "--",
                         *train_args({**fields, "init_from": str(ckpt)})])
    # the stop leaves a running step time to finish (and evaluate, if due) before the kill
    codes = kids.wait(t0 + args.budget_s - args.reserve_s,
                      t0 + args.budget_s - max(20.0, args.reserve_s / 4),
                      30 if mode["device"] == "cuda" else 10, {k: f["db"] for k, f in runs.items()})
    phase("RL", t)
    t = time.monotonic()
    gpu_store = _sibling("gpu_store")
    store = work / "proof.duckdb"
    for src in [Path(start["db"])] + [Path(f["db"]) for f in runs.values()]:
        try:  # one bad file (a run killed mid-write) must not cost the others' table
            gpu_store.merge([src], store)
        except Exception as exc:
            print(f"-- {src.name} not merged: {type(exc).__name__}: {exc}", flush=True)
    from storage import queries
    start_id = queries.runs(str(store)).set_index("name").loc[start["name"], "run_id"]
    fig = gpu_store.figures(store, (start_id, args.sft_steps))
    text = gpu_store.table(fig)
    names = {r["name"] for r in fig["rows"]}
    for key, fields in runs.items():
        if fields["name"] not in names:
            text += f"\n{key}: no run recorded (exit {codes[key]}; logs/{key}.log in logs.tar.xz)"
    for key, code in codes.items():  # what went wrong, where the device tool's tail shows it
        if code:
            _tail(work, key, f"exited {code}")
    if kids.samples:  # the whole card, all processes together, while the RL runs ran
        used, util = [x[1] for x in kids.samples], [x[2] for x in kids.samples]
        text += (f"\nGPU (nvidia-smi every 2 s, SFT and RL): peak {max(used):.0f} MiB used, "
                 f"utilisation mean {sum(util) / len(util):.0f}%, max {max(util):.0f}%")
    print(text, flush=True)
    (out / "table.txt").write_text(text + "\n")
    slim, level = gpu_store.slim(store, out / "store.duckdb", OUT_CAP)
    phase("merge + table", t)
    gpu_store.write_json(out / "proof.json", {
        "mode": "rehearse" if args.rehearse else "gpu", "args": vars(args), "phases_s": phases,
        "exit_codes": codes, "figures": fig, "gpu_samples": kids.samples,
        "gpu_peak_used_mib": max((s[1] for s in kids.samples), default=None),
        "checks": json.loads((work / "checks.json").read_text()),
        "store_back": {"file": slim.name, "bytes": slim.stat().st_size, "slim_level": level}})
    _logs(work, out)
    print(f"== {out}: table.txt, proof.json, {slim.name} ({slim.stat().st_size / 1e6:.1f} MB, "
          f"slim level {level}), logs.tar.xz; whole store {store.stat().st_size / 1e6:.0f} MB "
          f"at {store}; {time.monotonic() - t0:.0f} s in all", flush=True)
    return 0 if all(c == 0 for c in codes.values()) else 1


def _tail(work: Path, key: str, what: str, lines: int = 12) -> None:
    log = work / "logs" / f"{key}.log"
    text = log.read_text(errors="replace").splitlines()[-lines:] if log.is_file() else []
    print(f"-- {key} {what}; the end of its log:\n" + "\n".join(text), flush=True)


def _failed(work: Path, out: Path, why: str, key: str | None) -> int:
    if key:
        _tail(work, key, "failed", 30)
    _logs(work, out)
    print(f"error: {why}; the logs are in {out / 'logs.tar.xz'}", file=sys.stderr)
    return 1


def _logs(work: Path, out: Path) -> None:
    with tarfile.open(out / "logs.tar.xz", "w:xz") as tar:
        for path in sorted((work / "logs").glob("*.log")) + [work / "checks.json"]:
            if path.is_file():
                tar.add(path, arcname=path.name)


def child(fraction: float, argv: list[str]) -> int:
    """One run through the real CLI (python -m core.train); ``fraction`` > 0 caps its CUDA
    memory at that share of the GPU (``--memory-cap``: a run's excess fails that run alone)."""
    if fraction > 0:
        import torch
        if torch.cuda.is_available():
            torch.cuda.set_per_process_memory_fraction(fraction, 0)
    from core.commands.train import main as train_main
    return train_main(argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("pack", "stash", "restore", "travel", "procedure",
                                         "receive", "check", "run", "rehearse"))
    parser.add_argument("what", nargs="*", help="receive: the parts")
    parser.add_argument("--rehearse", action="store_true", help="the CPU rehearsal's sizes")
    parser.add_argument("--dest", default=str(gpu_pack.PACK), help="pack: where the parts go")
    parser.add_argument("--wheels", default=str(gpu_pack.PACK / "wheels"))
    parser.add_argument("--part-mib", type=int, default=gpu_pack.PART_BYTES // 2**20)
    parser.add_argument("--carry", nargs="*", default=[], help="travel: carried paths")
    parser.add_argument("--into", default=str(INTO), help="there: where parts, the unpacked "
                        "pack, the model cache and the runs go")
    parser.add_argument("--out", default="runs/gpu-proof-out", help="run: the table, store, logs")
    parser.add_argument("--machine", action="store_true", help="check: the machine only")
    parser.add_argument("--work", help="rehearse: the folder (default: a new temp folder)")
    parser.add_argument("--sft-steps", type=int)
    parser.add_argument("--rl-steps", type=int)
    parser.add_argument("--eval-every", type=int)
    parser.add_argument("--eval-tasks", type=int)
    parser.add_argument("--budget-s", type=float)
    parser.add_argument("--reserve-s", type=float)
    parser.add_argument("--gib-per-run", type=float)
    parser.add_argument("--lr", type=float, default=4e-4, help="RL lr (information gain: half)")
    parser.add_argument("--memory-cap", action="store_true",
                        help="cap each RL run's CUDA memory at 0.95 / runs of the GPU")
    parser.add_argument("--runs", help="METHOD-sSEED,... (default: every method, seeds 0 and 1; "
                        "the rehearsal: every method with seed 0 and grpo-s1)")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["rehearse"] and "--" in argv:  # flags after -- go on to the calls' run
        argv, pass_on = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    else:
        pass_on = []
    if argv[:1] == ["child"]:  # FRACTION -- flags: core.train parses the flags
        return child(float(argv[1]), argv[3:])
    args = parser.parse_args(argv)
    args.pass_on, args.argv = pass_on, argv
    mode = MODES["rehearse" if args.rehearse else "gpu"]
    for key in ("sft_steps", "rl_steps", "eval_every", "eval_tasks", "budget_s", "reserve_s",
                "gib_per_run", "runs"):
        if getattr(args, key) is None:
            setattr(args, key, mode[key])
    try:
        args.runs = [(k.rsplit("-s", 1)[0], int(k.rsplit("-s", 1)[1]))
                     for k in args.runs.split(",") if k]
    except (IndexError, ValueError):
        parser.error(f"--runs {args.runs!r}: expected METHOD-sSEED,... e.g. grpo-s0,prm-s1")
    bad = sorted({m for m, _ in args.runs} - set(METHODS))
    if bad or not args.runs:
        parser.error(f"--runs: unknown methods {bad}; known: {', '.join(METHODS)}")
    try:
        if args.mode == "pack":
            gpu_calls.pack(args)
        elif args.mode == "stash":
            moved = gpu_pack.stash()
            print(f"stashed {len(moved)} files into {gpu_pack.PACK / 'stash'}; the checkout now "
                  f"sends {gpu_pack.travel_bytes() / 2**20:.1f} MiB; `restore` after the calls")
        elif args.mode == "restore":
            print(f"restored {len(gpu_pack.restore())} files")
        elif args.mode == "travel":
            size = gpu_pack.travel_bytes(ROOT, args.carry)
            print(f"a call would send {size / 2**20:.1f} MiB (limit 64)")
            return 0 if size <= gpu_pack.LIMIT_BYTES else 2
        elif args.mode == "procedure":
            gpu_calls.procedure(args)
        elif args.mode == "receive":
            for part in args.what:
                gpu_pack.receive(Path(part), Path(args.into))
        elif args.mode == "check":
            into = Path(args.into)
            site = "-" if args.machine else str(into / "site")
            env = gpu_checks.child_env(None if args.machine else into / "site", into / "cache")
            return subprocess.run([sys.executable, str(Path(__file__).with_name("gpu_checks.py")),
                                   site, str(into / "work"), mode["model"], mode["device"],
                                   str(len(args.runs)), str(args.gib_per_run)]
                                  + (["--machine"] if args.machine else []),
                                  cwd=ROOT, env=env, timeout=300).returncode
        elif args.mode == "run":
            return run(args)
        elif args.mode == "rehearse":
            return gpu_calls.rehearse(args)
    except gpu_pack.PackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
