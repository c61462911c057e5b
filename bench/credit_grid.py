"""The credit grids (the non-slippery lake, the corridor): every method x seed from one SFT
start, read back as held-out success curves with a confidence band over seeds. A script:

    python bench/credit_grid.py table --db sample_runs/credit_grid.duckdb [--threshold 0.125]
    python bench/credit_grid.py moves --db sample_runs/credit_grid_long.duckdb
    python bench/credit_grid.py merge runs/credit_grid/*.duckdb --db OUT.duckdb \
                                     [--tokens-for "grpo seed 0"]

``table`` groups the runs named ``TASK credit METHOD seed S`` (sample_runs/credit_grid.sh) by
METHOD and prints, per method and evaluated step, the mean held-out success over seeds with a
95% Student-t interval (mean +- t(0.975, n-1) * sd / sqrt(n): with 3 seeds t = 4.30, so the band
is wide and says how little three seeds pin down); then per method the steps each seed took to
reach ``--threshold`` held-out success (the first evaluation at or above it; "-" never) and the
final held-out success (mean +- t-interval, and each seed's value). The SFT start's own
evaluation is the first point of every curve.

``moves`` reads the stores' turns: per run, the share of its last evaluation's held-out walks that
use two or more different moves and its most common move (the one-move plateau in numbers), and
the mean |advantage| of its training turns by turn index over the last quarter of its RL steps.

``merge`` copies every run of several stores (one per run, written one after another) into one
store: each table's rows are keyed by run_id, so rows are appended as they are. Token rows
(the largest table by far) are kept only for the runs whose names contain a ``--tokens-for``
text: the sample store stays under the size cap and Replay's token view still has a run of
each kind to show. The merged store is compacted (storage/compact.py).
"""
from __future__ import annotations

import argparse
import math
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NAME = re.compile(r"^(?P<task>\w+) credit (?P<method>\S+) seed (?P<seed>\d+)")
"""The run names credit_grid.sh gives, ``TASK credit METHOD seed S`` (the SFT start: ``TASK credit
start ...``; TASK lake or corridor)."""
START = re.compile(r"^\w+ credit start\b")


ORDER = ("grpo", "dr_grpo", "rloo", "starpo_s", "gigpo", "gigpo_traj", "ppo", "prm", "spa")
"""credit_grid.sh's methods, in the order the README's table lists them."""


def t975(df: int) -> float:
    """Student-t 97.5% quantile (two-sided 95% interval) for ``df`` degrees of freedom."""
    from scipy import stats
    return float(stats.t.ppf(0.975, df))


def band(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% t-interval); half-width nan with one value."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t975(n - 1) * sd / math.sqrt(n)


def curves(db: str, metric: str = "eval/success"
           ) -> tuple[dict[str, dict[int, dict[int, float]]], dict[int, float]]:
    """method -> seed -> {step: held-out success} (or another ``metric``); and the start's
    {step: value} (its SFT evaluation), which every held-out curve begins from."""
    from storage import queries
    runs = queries.runs(db)
    out: dict[str, dict[int, dict[int, float]]] = {}
    start: dict[int, float] = {}
    for _, row in runs.iterrows():
        m = queries.metrics(db, row["run_id"], [metric])
        points = {int(s): float(v) for s, v in zip(m["step"], m["value"])}
        if START.match(str(row["name"])):
            start.update(points)
            continue
        match = NAME.match(str(row["name"]))
        if match:
            out.setdefault(match["method"], {})[int(match["seed"])] = points
    return out, start


def table(db: str, threshold: float, methods: list[str] | None = None) -> None:
    by_method, start = curves(db)
    if not by_method:
        sys.exit(f"{db}: no runs named 'TASK credit METHOD seed S'")
    order = [m for m in (methods or ORDER) if m in by_method]
    order += [m for m in sorted(by_method) if m not in order]
    s0 = max(start) if start else None
    if s0 is not None:
        print(f"start (SFT, step {s0}): held-out success {start[s0]:.3f}")
    print("\nheld-out success, mean +- 95% t-interval over seeds (n = seeds at that step)")
    for method in order:
        seeds = by_method[method]
        steps = sorted({s for pts in seeds.values() for s in pts})
        cells = []
        for step in steps:
            vals = [pts[step] for pts in seeds.values() if step in pts]
            mean, half = band(vals)
            cells.append(f"{step}: {mean:.2f}" + ("" if math.isnan(half) else f"+-{half:.2f}")
                         + ("" if len(vals) == len(seeds) else f" (n={len(vals)})"))
        print(f"  {method:22} " + "  ".join(cells))
    print(f"\n{'method':22}{'seeds':>6}{'final held-out':>22}{'per seed':>24}"
          f"   steps to >= {threshold:g} (per seed)")
    for method in order:
        seeds = by_method[method]
        finals, reach = [], []
        for seed in sorted(seeds):
            pts = seeds[seed]
            if not pts:
                continue
            finals.append(pts[max(pts)])
            hit = [s for s in sorted(pts) if pts[s] >= threshold]
            reach.append(str(hit[0] - s0) if hit and s0 is not None else
                         (str(hit[0]) if hit else "-"))
        if not finals:
            continue
        mean, half = band(finals)
        spread = "" if math.isnan(half) else f" +- {half:.2f}"
        print(f"{method:22}{len(finals):>6}{mean:>15.3f}{spread:>7}"
              f"{' '.join(f'{v:.2f}' for v in finals):>24}   {' '.join(reach)}")
    # the sampled policy (temperature 1) on its training tasks: greedy held-out success moves
    # only when the most likely move changes, the sampled rate with every shift of probability
    train, _ = curves(db, "success/rate")
    print(f"\n{'method':22}training success (sampled), mean over seeds of the first 4 and the "
          "last 4 RL steps")
    for method in order:
        firsts, lasts = [], []
        for pts in train.get(method, {}).values():
            steps = sorted(pts)
            if len(steps) >= 8:
                firsts.append(sum(pts[s] for s in steps[:4]) / 4)
                lasts.append(sum(pts[s] for s in steps[-4:]) / 4)
        if firsts:
            f, fh = band(firsts)
            last, lh = band(lasts)
            print(f"{method:22}{f:.3f} +- {fh:.3f} -> {last:.3f} +- {lh:.3f}")
    # what Dynamics draws, in numbers: groups with no reward spread (no outcome gradient from
    # them), the policy's entropy at the first and the last RL step, the mean |advantage|
    cols = {name: curves(db, name)[0] for name in
            ("reward/frac_zero_std", "policy/entropy", "adv/abs_mean")}
    print(f"\n{'method':22}{'zero-std groups':>16}{'entropy first -> last':>24}{'mean |A|':>10}")
    for method in order:
        zs = [v for pts in cols["reward/frac_zero_std"].get(method, {}).values()
              for v in pts.values()]
        ent = list(cols["policy/entropy"].get(method, {}).values())
        adv = [v for pts in cols["adv/abs_mean"].get(method, {}).values() for v in pts.values()]
        if zs and ent and adv:
            e0 = sum(p[min(p)] for p in ent) / len(ent)
            e1 = sum(p[max(p)] for p in ent) / len(ent)
            print(f"{method:22}{sum(zs) / len(zs):>16.2f}{e0:>15.3f} -> {e1:.3f}"
                  f"{sum(adv) / len(adv):>10.3f}")


def walk_moves(db: str, run_id: str, step: int) -> list[list[str]]:
    """The moves of each held-out walk a run's evaluation at ``step`` made (valid answers only)."""
    import json
    from storage import queries
    t = queries.trajectories(db, run_id, step)
    t = t[t["split"] == "eval"]
    if t.empty:
        return []
    tu = queries.turns(db, run_id, t["traj_id"].tolist())
    walks: dict[str, list[str]] = {tid: [] for tid in t["traj_id"]}
    for _, turn in tu.iterrows():
        parsed = json.loads(turn["parsed"]) if isinstance(turn["parsed"], str) else None
        if turn["action_valid"] and parsed:
            walks[turn["traj_id"]].extend(parsed.get("actions") or [])
    return list(walks.values())


def moves(db: str, methods: list[str] | None = None) -> None:
    """Does the greedy policy go beyond one move repeated every turn? Per method and seed, at
    the last evaluation: the share of held-out walks that use two or more different moves, and
    the most common move with its share of all moves; the greedy policy's most common move at
    each evaluation (U D L R, - no valid move); the share of groups with no reward spread in the
    last quarter of RL steps; then the mean |advantage| of the training turns by turn index over
    that last quarter (one advantage per walk gives every turn of a walk the same; per-turn
    credit tells the turns apart)."""
    from storage import queries
    runs = queries.runs(db)
    named = [(NAME.match(str(r["name"])), r["run_id"]) for _, r in runs.iterrows()]
    named = [(m["method"], int(m["seed"]), rid) for m, rid in named if m]
    order = [m for m in (methods or ORDER) if any(n == m for n, _, _ in named)]
    order += sorted({n for n, _, _ in named} - set(order))
    print(f"\n{'method':11}{'seed':>5}{'walks >= 2 moves':>17}{'top move':>14}   "
          f"{'top move at each evaluation':28}{'zero-std':>9}   mean |A| by turn (last quarter)")
    for method in order:
        for _, seed, rid in sorted(r for r in named if r[0] == method):
            m = queries.metrics(db, rid, ["eval/success", "reward/frac_zero_std"])
            evals = sorted(int(x) for x in m.loc[m["name"] == "eval/success", "step"])
            if not evals:
                continue
            tops = []
            for step in evals:
                flat = [mv for w in walk_moves(db, rid, step) for mv in w]
                tops.append(max(set(flat), key=flat.count) if flat else "-")
            walks = walk_moves(db, rid, evals[-1])
            flat = [mv for w in walks for mv in w]
            multi = sum(len(set(w)) >= 2 for w in walks) / max(len(walks), 1)
            share = flat.count(tops[-1]) / len(flat) if flat else 0.0
            t = queries.trajectories(db, rid)
            t = t[t["split"] == "train"]
            steps = sorted(t["step"].unique())
            cut = steps[len(steps) * 3 // 4] if steps else 0
            late = t[t["step"] >= cut]
            zs = m[(m["name"] == "reward/frac_zero_std") & (m["step"] >= cut)]["value"]
            tu = queries.turns(db, rid, late["traj_id"].tolist())
            by_turn = tu.assign(a=tu["advantage"].abs()).groupby("turn")["a"].mean()
            print(f"{method:11}{seed:>5}{multi:>17.2f}{tops[-1]:>8} {share:>5.2f}   "
                  f"{' '.join(x[0] for x in tops):28}{zs.mean() if len(zs) else 0:>9.2f}   "
                  + " ".join(f"{v:.2f}" for v in by_turn.values))

def merge(sources: list[str], dest: str, tokens_for: list[str]) -> None:
    from storage import db, queries
    from storage.compact import compact
    dest_path = Path(dest)
    if dest_path.exists():
        sys.exit(f"{dest} exists: remove it first (merge never appends to a store)")
    srcs = [Path(s) for s in sources]
    shutil.copyfile(srcs[0], dest_path)
    with db.writing(dest_path) as con:
        tables = [t for (t,) in con.execute(
            "SELECT table_name FROM information_schema.columns WHERE column_name = 'run_id' "
            "AND table_schema = 'main'").fetchall()]
        for i, src in enumerate(srcs[1:]):  # each detached as the store closes: DuckDB 1.5
            con.execute(f"ATTACH '{src}' AS src{i} (READ_ONLY)")  # refuses DETACH mid-transaction
            for table_name in tables:
                con.execute(f'INSERT INTO main."{table_name}" BY NAME '
                            f'SELECT * FROM src{i}.main."{table_name}"')
    names = queries.runs(str(dest_path)).set_index("run_id")["name"]
    drop = [r for r, n in names.items() if not any(k in str(n) for k in tokens_for)]
    with db.writing(dest_path) as con:
        con.execute("DELETE FROM tokens WHERE run_id IN (SELECT unnest(?))", [drop])
    before, after = compact(dest_path)
    print(f"{dest}: {len(names)} runs, token rows kept for {len(names) - len(drop)}; "
          f"{before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("table", "moves", "merge"))
    parser.add_argument("sources", nargs="*", help="merge: the per-run stores, in order")
    parser.add_argument("--db", required=True, help="table: the store to read; merge: to write")
    parser.add_argument("--threshold", type=float, default=0.125,
                        help="held-out success to reach (default: the best single move's, "
                             "Left at every turn: 4 of the 32 held-out lakes)")
    parser.add_argument("--methods", help="table: these methods, in this order")
    parser.add_argument("--tokens-for", action="append", default=[],
                        help="merge: keep token rows of runs whose name contains this")
    args = parser.parse_args()
    if args.mode == "merge":
        if not args.sources:
            sys.exit("merge needs the per-run stores")
        merge(args.sources, args.db, args.tokens_for)
    elif args.mode == "moves":
        moves(args.db, args.methods.split(",") if args.methods else None)
    else:
        table(args.db, args.threshold, args.methods.split(",") if args.methods else None)


if __name__ == "__main__":
    main()
