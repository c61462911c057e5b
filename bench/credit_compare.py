"""Credit methods side by side on the search world: GRPO, GiGPO, GRPO + information gain, SPA
and the PRM from the same SFT start, each a real training run in its own process. A script:

    python bench/credit_compare.py run --out DIR [--device cuda] [--seeds 0,1] [--sft-steps 60]
                                       [--steps 10] [--eval-every 5] [--limit-s 420]
                                       [--init-from SFT_CHECKPOINT] [--parallel N]
                                       [--eval-seed S] [--set KEY=VALUE ...]
                                       [--variants grpo,gigpo,info_gain,spa,prm,fresh_moments,sft_curve]
    python bench/credit_compare.py load DIR --db STORE.duckdb [--tag TEXT]  # into one store
    python bench/credit_compare.py table DIR                        # held-out table (also on run)
    python bench/credit_compare.py paired --db STORE --start RUN:STEP  # paired against the start
    python bench/credit_compare.py pack DIR DEST [--tokens-for grpo-s0,...]  # xz logs to carry

Every variant is the ``search-smollm2`` preset (SmolLM2-135M, LoRA, G=8 x 4 tasks, 100 held-out
tasks of which 75 two-hop) with the same seed, SFT budget and RL budget; only the credit differs:

    grpo           the preset (outcome + 0.2 x retrieval hit, GRPO)
    gigpo          --algo gigpo (step-level groups by state)
    info_gain      --w-info-gain 1 (each turn's gain in P(gold answer), group-normalised)
    spa            --w-spa 1 (stepwise progress head)
    prm            --w-prm 1 (process reward head on Monte-Carlo Q labels)
    fresh_moments  grpo with --rl-moments fresh: the RL optimizer of before the fix (control)
    sft_curve      no RL; held-out every 20 SFT steps up to 100 (the SFT budget curve)

A machine without DuckDB (a lent GPU) can run it: each child records through ``LogRecorder``,
which appends every recorder call to a pickle log; ``load`` replays the logs into a real store
with storage's Recorder, so the store is what the trainer would have written. A run stopped at
``--limit-s`` (SIGINT: the trainer finishes its step and marks the run stopped) keeps its steps.
"""
from __future__ import annotations

import argparse
import lzma
import math
import os
import pickle
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VARIANTS = {
    "grpo": {},
    # measuring information gain without training on it is a third or more of a CPU step (207
    # of 548 s from the 100-step start): only GRPO (the baseline the gains are read against)
    # and info_gain itself record it
    "gigpo": {"algo": "gigpo", "record_info_gain": False},
    "info_gain": {"w_info_gain": 1.0},
    "spa": {"w_spa": 1.0, "record_info_gain": False},
    "prm": {"w_prm": 1.0, "record_info_gain": False},
    "fresh_moments": {"rl_moments": "fresh"},
    "sft_curve": {"steps": 0, "sft_steps": 100, "sft_eval_every": 20},
}


ONE_SEED = ("fresh_moments", "sft_curve")
"""Variants run with the first seed only (a control and the SFT curve)."""


class LogRecorder:
    """The recorder interface the trainer calls, appended to a pickle log, one call per record
    (flushed at once: a killed child keeps every step it finished)."""

    def __init__(self, path: Path):
        self.file = open(path, "ab")

    def _log(self, _method: str, *args, **kwargs) -> None:
        pickle.dump((_method, args, kwargs), self.file)
        self.file.flush()

    def start_run(self, config, name=None, run_id=None, source="trainer") -> str:
        run_id = run_id or (datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-")
                            + os.urandom(3).hex())
        self._log("start_run", dict(config), name=name, run_id=run_id, source=source)
        return run_id

    def resume_run(self, run_id, config=None):
        return None

    def __getattr__(self, name):  # record_step, log_metrics, set_status, finish, close, ...
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *a, **k: self._log(name, *a, **k)


def calls(log: Path):
    """The recorder calls of a log, in order. A record cut short (the child is writing it now,
    or was killed while writing it) ends the log: what came before it is whole."""
    with (lzma.open if log.suffix == ".xz" else open)(log, "rb") as f:
        while True:
            try:
                yield pickle.load(f)
            except (EOFError, pickle.UnpicklingError):
                return


def child(variant: str, seed: int, args, log: Path) -> None:
    from core.config import PRESETS, TrainConfig
    from core.run.trainer import train
    over = {"device": args.device, "seed": seed, "sft_steps": args.sft_steps,
            "init_from": args.init_from or "",
            "steps": args.steps, "eval_every": args.eval_every, "adapter_every": 0,
            "checkpoint_every": 10_000,  # the runs are not resumed: save only at the end
            "checkpoint_dir": str(log.with_suffix(".ckpt")), "threads": args.threads,
            "eval_seed": args.eval_seed, **overrides(args.set), **VARIANTS[variant]}
    if args.smoke:  # a seconds-long check of the plumbing on the tiny model (not a measurement)
        over.update(model="tiny", group_size=2, tasks_per_step=2, eval_tasks=4, max_turns=2,
                    max_new_tokens=12, sft_steps=min(over["sft_steps"], 2),
                    sft_eval_every=1 if variant == "sft_curve" else 0)
    cfg = TrainConfig.from_dict({**PRESETS["search-smollm2"], **over,
                                 "name": f"credit {variant} seed {seed}"})
    train(cfg, LogRecorder(log), progress=False)


def overrides(items: list[str]) -> dict:
    """``--set KEY=VALUE`` pairs as config fields (a number or true/false where VALUE reads as
    one); every run gets them, so they change the common setup, never one method's credit."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            sys.exit(f"--set {item!r}: expected KEY=VALUE")
        if value.lower() in ("true", "false"):
            value = value.lower() == "true"
        else:
            for cast in (int, float):
                try:
                    value = cast(value)
                    break
                except ValueError:
                    pass
        out[key.strip().replace("-", "_")] = value
    return out


def run(args) -> None:
    """Each variant x seed as a child process, at most ``--parallel`` at a time, in the order
    given (so a time limit that ends the session leaves the first ones finished)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    queue, procs = [], {}
    seeds = [int(s) for s in args.seeds.split(",")]
    pairs = [(v, s) for v in args.variants.split(",") for s in (seeds[:1] if v in ONE_SEED
                                                                 else seeds)]
    if args.runs:  # an explicit order, e.g. every variant's first seed before any second one
        pairs = [(key.rsplit("-s", 1)[0], int(key.rsplit("-s", 1)[1]))
                 for key in args.runs.split(",")]
    # every seed is evaluated on the first seed's held-out draw (the start's, when the runs go
    # on from a checkpoint of that seed), so Compare pairs any two of them task by task
    eval_seed = seeds[0] if args.eval_seed < 0 else args.eval_seed
    for variant, seed in pairs:
        if variant not in VARIANTS:
            sys.exit(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
        cmd = [sys.executable, __file__, "child", "--variant", variant, "--seed", str(seed),
               "--out", str(out), "--device", args.device, "--sft-steps", str(args.sft_steps),
               "--steps", str(args.steps), "--eval-every", str(args.eval_every),
               "--threads", str(args.threads), "--eval-seed", str(eval_seed)]
        cmd += [f"--set={item}" for item in args.set]
        cmd += ["--smoke"] if args.smoke else []
        cmd += ["--init-from", args.init_from] if args.init_from else []
        queue.append((f"{variant}-s{seed}", cmd))
    # the default limit suits a lent GPU's minutes, not CPU runs of 10-minute steps: say it
    print(f"every run is stopped (Ctrl-C: its step finishes) at --limit-s {args.limit_s:.0f} s "
          f"and killed {args.grace_s:.0f} s later", flush=True)
    t0, stopping = time.time(), False
    while queue or any(p.poll() is None for p in procs.values()):
        while queue and not stopping and sum(p.poll() is None for p in procs.values()) < args.parallel:
            key, cmd = queue.pop(0)
            err = open(out / f"{key}.err", "w")
            procs[key] = subprocess.Popen(cmd, cwd=ROOT, stdout=err, stderr=err)
            print(f"{key}: started at {time.time() - t0:.0f} s", flush=True)
        if stopping:
            queue.clear()
        time.sleep(2)
        if not stopping and time.time() - t0 > args.limit_s:
            stopping = True
            for p in procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGINT)  # finish the step, mark the run stopped
        if time.time() - t0 > args.limit_s + args.grace_s:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
    for key, p in procs.items():
        print(f"{key}: exit {p.returncode}, {time.time() - t0:.0f} s", flush=True)
    table(out)


def evaluations(log: Path) -> dict[int, dict]:
    """Per evaluated step: solved / n overall, single-hop and two-hop (two-hop task ids name two
    relations, 'capital>mayor:...'), and the step's wall seconds so far."""
    result, wall = {}, 0.0
    for name, args, kwargs in calls(log):
        if name != "record_step":
            continue
        step, metrics, trajs = args[0], kwargs.get("metrics") or {}, kwargs.get("trajectories")
        wall += metrics.get("time/step_s", 0.0) + metrics.get("time/eval_s", 0.0)
        if not trajs:
            continue
        rows = [(t, s) for t, s, split in zip(trajs["task_id"], trajs["success"], trajs["split"])
                if split == "eval"]
        if rows:
            two = [s for t, s in rows if ">" in t]
            one = [s for t, s in rows if ">" not in t]
            result[step] = {"n": len(rows), "ok": sum(map(bool, (s for _, s in rows))),
                            "two": (sum(map(bool, two)), len(two)),
                            "one": (sum(map(bool, one)), len(one)), "wall_s": wall}
    return result


def table(out) -> None:
    """One line per run and evaluated step: held-out exact match with its binomial standard
    error sqrt(p (1 - p) / n)."""
    print(f"{'run':22}{'step':>6}{'held-out':>10}{'+- se':>8}{'single':>9}{'two-hop':>9}"
          f"{'wall s':>8}")
    for log in sorted(Path(out).glob("*.log*")):
        for step, e in sorted(evaluations(log).items()):
            p = e["ok"] / e["n"]
            print(f"{log.name.split('.')[0]:22}{step:>6}{100 * p:>9.0f}%{100 * math.sqrt(p * (1 - p) / e['n']):>7.1f}"
                  f"{'%d/%d' % e['one']:>9}{'%d/%d' % e['two']:>9}{e['wall_s']:>8.0f}")


def pack(out, dest, tokens_for: str) -> None:
    """Each log, xz-compressed into ``dest``, with the token tables kept only for the RL and
    evaluation steps of the runs named in ``tokens_for`` (comma-separated stems; the rest keep
    trajectories, turns, rewards, signals and metrics): what comes back from a lent machine is
    size-limited."""
    keep = set(tokens_for.split(",")) if tokens_for else set()
    Path(dest).mkdir(parents=True, exist_ok=True)
    for log in sorted(Path(out).glob("*.log")):
        sft_steps = None
        with lzma.open(Path(dest) / (log.name + ".xz"), "wb", preset=6) as f:
            for name, args, kwargs in calls(log):
                if name == "start_run":
                    sft_steps = args[0].get("sft_steps", 0)
                if name == "record_step" and "tokens" in kwargs and (
                        log.stem not in keep or args[0] <= sft_steps and
                        not _has_eval(kwargs)):
                    kwargs = {k: v for k, v in kwargs.items() if k != "tokens"}
                pickle.dump((name, args, kwargs), f)


def _has_eval(kwargs) -> bool:
    trajs = kwargs.get("trajectories") or {}
    return "eval" in (trajs.get("split") or [])


def load(out, db: str, tag: str = "") -> None:
    """Replay every log into ``db`` with storage's Recorder; a run whose log ends without
    ``finish`` (killed) is marked stopped. ``tag`` goes after each run's name ("credit grpo
    seed 0 TAG"), so comparisons from several starts can share one store."""
    from storage.recorder import Recorder
    for log in sorted(Path(out).glob("*.log*")):
        rec, finished = Recorder(db), False
        for name, args, kwargs in calls(log):
            if name == "start_run":
                if tag:
                    kwargs = {**kwargs, "name": f"{kwargs.get('name') or ''} {tag}".strip()}
                print(f"{log.name.split('.')[0]}: run {rec.start_run(*args, **kwargs)}")
            elif name == "close":
                continue
            else:
                getattr(rec, name)(*args, **kwargs)
                finished |= name == "finish"
        if not finished:
            rec.finish("stopped", error="killed at the time limit before finishing its step")
        rec.close()


def paired(db: str, start: str) -> None:
    """Every run's last held-out evaluation in ``db`` against the start ``RUN:STEP`` (the SFT
    checkpoint's evaluation), paired by task and episode seed (storage/evaldiff.py, what the
    Compare page shows): tasks gained and lost, and the sign test's p."""
    from storage import evaldiff, queries
    run0, step0 = start.rsplit(":", 1)
    evals = evaldiff.evaluations(db)
    names = queries.runs(db).set_index("run_id")["name"]
    print(f"{'run':34}{'step':>6}{'held-out':>10}{'two-hop':>9}{'gained':>8}{'lost':>6}{'sign p':>8}")
    for run_id, rows in evals.groupby("run_id", sort=False):
        step = int(rows["step"].max())
        if run_id == run0 and step == int(step0):
            continue
        d = evaldiff.diff(db, (run0, int(step0)), (run_id, step))
        if d["paired"].empty:  # another seed evaluates with other episode seeds
            print(f"{str(names.get(run_id, run_id))[:33]:34}{step:>6}  not paired: no task "
                  "and episode seed in common with the start")
            continue
        two = d["paired"][d["paired"]["task_id"].str.contains(">")]
        print(f"{str(names.get(run_id, run_id))[:33]:34}{step:>6}"
              f"{'%d/%d' % (d['solved']['B'], len(d['paired'])):>10}"
              f"{int(two['solved_b'].sum()):>6}/{len(two):<2}{d['counts']['gained']:>8}"
              f"{d['counts']['lost']:>6}{d['p_value']:>8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("run", "child", "load", "table", "pack", "paired"))
    parser.add_argument("dir", nargs="?", help="load/table/pack: the run's --out folder")
    parser.add_argument("dest", nargs="?", help="pack: where the compressed logs go")
    parser.add_argument("--tokens-for", default="", help="pack: runs that keep token tables")
    parser.add_argument("--out", default="runs/credit-compare")
    parser.add_argument("--db", help="load: the store to write; paired: the store to read")
    parser.add_argument("--tag", default="", help="load: text after every run's name")
    parser.add_argument("--start", help="paired: RUN:STEP, the evaluation the runs started from")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--sft-steps", type=int, default=60)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--init-from", help="an SFT checkpoint every run starts from "
                        "(core/config/train_config.py init_from): SFT once instead of once per run")
    parser.add_argument("--eval-seed", type=int, default=-1,
                        help="the held-out draw every run is evaluated on (default: the first seed)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config field for every run, e.g. env_options=two_hop_frac=1.0")
    parser.add_argument("--parallel", type=int, default=64, help="runs at a time")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per run")
    parser.add_argument("--runs", help="VARIANT-sSEED,... in this order (instead of "
                        "--variants x --seeds)")
    parser.add_argument("--limit-s", type=float, default=420.0)
    parser.add_argument("--grace-s", type=float, default=90.0)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny model, tiny sizes: checks the plumbing in seconds")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode == "child":
        child(args.variant, args.seed, args, Path(args.out) / f"{args.variant}-s{args.seed}.log")
    elif args.mode == "run":
        run(args)
    elif args.mode == "pack":
        pack(args.dir, args.dest, args.tokens_for)
    elif args.mode == "paired":
        paired(args.db, args.start)
    elif args.mode == "table":
        table(args.dir or args.out)
    else:
        if not args.db:
            sys.exit("load needs --db STORE.duckdb")
        load(args.dir or args.out, args.db, args.tag)


if __name__ == "__main__":
    main()
