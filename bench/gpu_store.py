"""The GPU proof's store and table: each run's own DuckDB file merged into one, a slim copy small
enough to come back from the lent machine, and the table read from the merged store.

Each run is its own process with its own file, because DuckDB lets one process write a file at
a time; run ids are unique (time + random), so merging is appending every table's rows.
"""
from __future__ import annotations

import json
import lzma
import math
import shutil
from pathlib import Path

from storage import db, evaldiff, queries
from storage.migrations import SCHEMA_VERSION, prepare

TWO_HOP = ">"
"""A two-hop task id names two relations ('capital>mayor:...'); single-hop ids have one."""


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")


def merge(sources: list[Path], dest: Path, where: dict[str, str] | None = None) -> dict[str, int]:
    """Append every table of each source store to ``dest`` (created with the current schema),
    one transaction per source, so a bad source leaves ``dest`` as it was before it. ``where``:
    table -> SQL condition on the rows ``x`` to keep (``{src}``: the source's alias), e.g.
    ``"false"`` for no token rows. Returns rows per table.
    A source of another schema version, or a run id already in ``dest``, is refused by name."""
    prepare(dest)
    counts: dict[str, int] = {}
    for i, src in enumerate(sources):
        alias = f"src{i}"
        with db.writing(dest) as con:
            # DuckDB 1.5 detaches no database inside the transaction that read it: attach and
            # detach around an explicit one of our own (db.writing's own is left empty)
            con.execute("COMMIT")
            con.execute(f"ATTACH '{_quoted(Path(src).resolve())}' AS {alias} (READ_ONLY)")
            try:
                con.execute("BEGIN TRANSACTION")
                try:
                    _merge_one(con, alias, src, dest, where, counts)
                    con.execute("COMMIT")
                except BaseException:
                    con.execute("ROLLBACK")
                    raise
            finally:
                con.execute(f"DETACH {alias}")
                con.execute("BEGIN TRANSACTION")      # what db.writing commits on leaving
    return counts


def _merge_one(con, alias: str, src, dest, where, counts: dict) -> None:
    version = con.execute(f"SELECT coalesce(max(version), 0) FROM {alias}._migrations"
                          ).fetchone()[0]
    if version != SCHEMA_VERSION:
        raise db.StoreError(f"{src}: schema version {version}, this code writes "
                            f"{SCHEMA_VERSION}: merge with the code that wrote it")
    clash = con.execute(f"SELECT run_id FROM {alias}.runs WHERE run_id IN "
                        "(SELECT run_id FROM main.runs)").fetchall()
    if clash:
        raise db.StoreError(f"{src}: run {clash[0][0]} is already in {dest}")
    have = {r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = ? "
        "AND table_schema = 'main'", [alias]).fetchall()}
    for table in _tables(con):
        if table in have:
            cond = (" WHERE " + where[table].format(src=alias)
                    if where and table in where else "")
            n = con.execute(f"INSERT INTO main.{table} BY NAME SELECT x.* FROM "
                            f"{alias}.main.{table} AS x{cond}").fetchone()[0]
            counts[table] = counts.get(table, 0) + int(n)


def _tables(con) -> list[str]:
    return [r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database() "
        "AND table_schema = 'main' AND table_name <> '_migrations' ORDER BY table_name").fetchall()]


EVAL_ROWS = ("x.traj_id IN (SELECT t.traj_id FROM {src}.main.trajectories t "
             "WHERE t.run_id = x.run_id AND t.split <> 'train')")
SLIM_LEVELS = ({"tokens": "false"},
               {"tokens": "false", "trajectories": "x.split <> 'train'", "turns": EVAL_ROWS,
                "rewards": EVAL_ROWS, "turn_signals": EVAL_ROWS, "test_results": EVAL_ROWS})
"""What the copy that comes back leaves out, level by level until it fits: first the token rows
(millions: 64 rollouts x ~1,000 tokens per step per run); then training trajectories with their
turns, rewards and signals (the held-out evaluations, metrics and runs stay whole)."""


def slim(store: Path, out: Path, cap_bytes: int) -> tuple[Path, int]:
    """``store`` without what ``SLIM_LEVELS`` leaves out, compacted and xz'd to ``out`` + .xz,
    at the first level under ``cap_bytes``. Returns (file, level used); level = len(levels)
    means even the last level did not fit (the file is written all the same)."""
    from storage.compact import compact
    for level, where in enumerate(SLIM_LEVELS):
        tmp = out.with_suffix(".slim.duckdb")
        tmp.unlink(missing_ok=True)
        merge([store], tmp, where=dict(where))
        compact(tmp)
        xz = out.with_name(out.name + ".xz")
        with open(tmp, "rb") as f, lzma.open(xz, "wb", preset=6) as g:
            shutil.copyfileobj(f, g, 1 << 20)
        tmp.unlink()
        if xz.stat().st_size <= cap_bytes:
            return xz, level
    return xz, len(SLIM_LEVELS)


# -- the table -------------------------------------------------------------------------------------
def run_figures(store: Path, run_id: str, after_step: int) -> dict:
    """Per run, from its metrics: RL steps done (> ``after_step``), RL steps per second of step
    time (n / sum of time/step_s; evaluations excluded), and the peak of
    torch.cuda.max_memory_allocated over its steps (MiB; None on the CPU)."""
    m = queries.metrics(store, run_id)
    rl = m[m["step"] > after_step]
    step_s = rl[rl["name"] == "time/step_s"]["value"]
    mem = m[m["name"] == "gpu/max_memory_allocated_mb"]["value"]
    return {"rl_steps": int(step_s.size),
            "steps_per_s": step_s.size / step_s.sum() if step_s.sum() > 0 else float("nan"),
            "peak_gpu_mib": float(mem.max()) if mem.size else None}


def figures(store: Path, start: tuple[str, int]) -> dict:
    """Everything the table prints, as data: the start's evaluation and, per RL run, its
    evaluation at the last step every RL run evaluated (``common``; each run's own last when
    they share none), paired with the start by task and episode seed (storage/evaldiff.py,
    Compare's pairing), plus each run's held-out curve."""
    evals = evaldiff.evaluations(store)
    runs = queries.runs(store).set_index("run_id")
    s_run, s_step = start
    rl = evals[(evals["run_id"] != s_run) & (evals["step"] > s_step)]
    steps = [set(g["step"]) for _, g in rl.groupby("run_id")]
    common = max(set.intersection(*steps)) if steps and set.intersection(*steps) else None
    rows = [_row(store, start, start, runs, "start")]
    for run_id, g in rl.groupby("run_id", sort=False):
        step = common if common is not None else int(g["step"].max())
        row = _row(store, start, (run_id, step), runs, "rl")
        row["curve"] = [(int(s), float(v)) for s, v in zip(g["step"], g["solved"])]
        rows.append(row)
    for run_id in runs.index.difference(list(evals["run_id"].unique())):
        rows.append({"run_id": run_id, "name": runs.at[run_id, "name"], "step": None,
                     "status": runs.at[run_id, "status"], "n": 0, **run_figures(
                         store, run_id, s_step)})
    return {"start": {"run_id": s_run, "step": s_step}, "common_step": common, "rows": rows}


def _row(store: Path, start: tuple[str, int], at: tuple[str, int], runs, kind: str) -> dict:
    d = evaldiff.diff(store, start, at)
    p = d["paired"]
    two = p["task_id"].str.contains(TWO_HOP, regex=False)
    row = {"run_id": at[0], "name": str(runs.at[at[0], "name"]), "step": int(at[1]),
           "status": str(runs.at[at[0], "status"]), "n": int(len(p)),
           "solved": int(d["solved"]["B"]), "two_hop": (int(p.loc[two, "solved_b"].sum()),
                                                         int(two.sum())),
           "one_hop": (int(p.loc[~two, "solved_b"].sum()), int((~two).sum())),
           "same_tasks": bool(d["coverage"]["same"]), **run_figures(store, at[0], start[1])}
    if kind == "rl":
        row.update(gained=d["counts"]["gained"], lost=d["counts"]["lost"], p=d["p_value"])
    return row


def table(fig: dict, goal_pct: float = 90.0, goal_two_hop: float = 66 / 75,
          goal_gain: float = 15.0) -> str:
    """The proof's table as text: one line per run (held-out %, two-hop, single-hop, gained /
    lost against the start with the two-sided sign test p, RL steps, steps/s, peak GPU MiB),
    each run's held-out curve, and the goal read off it (best run >= ``goal_pct``, its two-hop
    >= ``goal_two_hop`` of the two-hop tasks, >= ``goal_gain`` points over the start)."""
    head = (f"{'run':36}{'step':>5}{'held-out':>10}{'two-hop':>10}{'single':>8}{'gained':>8}"
            f"{'lost':>6}{'sign p':>8}{'RL steps':>9}{'steps/s':>9}{'GPU MiB':>9}  status")
    lines, start = [head], None
    for r in fig["rows"]:
        if r["step"] is None:
            lines.append(f"{r['name'][:35]:36}    -   no held-out evaluation"
                         f"{'':>38}{r['rl_steps']:>9}{'':>18}  {r['status']}")
            continue
        pct = 100 * r["solved"] / r["n"] if r["n"] else float("nan")
        start = start or r
        pair = (f"{r['gained']:>8}{r['lost']:>6}{r['p']:>8.3f}" if "gained" in r else f"{'':22}")
        mem = f"{r['peak_gpu_mib']:>9.0f}" if r["peak_gpu_mib"] is not None else f"{'-':>9}"
        sps = f"{r['steps_per_s']:>9.4f}" if not math.isnan(r["steps_per_s"]) else f"{'-':>9}"
        lines.append(f"{r['name'][:35]:36}{r['step']:>5}{pct:>9.1f}%"
                     f"{'%d/%d' % r['two_hop']:>10}{'%d/%d' % r['one_hop']:>8}{pair}"
                     f"{r['rl_steps']:>9}{sps}{mem}  {r['status']}"
                     + ("" if r["same_tasks"] else "  (NOT the start's tasks)"))
    lines.append(f"(held-out: n = {start['n'] if start else 0} tasks, the start's tasks and "
                 "episode seeds; gained / lost: paired with the start, sign p two-sided; "
                 f"rows at step {fig['common_step']}, the last step every RL run evaluated)")
    for r in fig["rows"]:
        if r.get("curve"):
            lines.append(f"  {r['name'][:40]}: " + ", ".join(
                f"step {s} {100 * v:.1f}%" for s, v in r["curve"]))
    rl = [r for r in fig["rows"] if "gained" in r and r["n"]]
    if start and rl:
        best = max(rl, key=lambda r: r["solved"])
        pct, base = 100 * best["solved"] / best["n"], 100 * start["solved"] / start["n"]
        two = best["two_hop"][0] / best["two_hop"][1] if best["two_hop"][1] else 0.0
        ok = pct >= goal_pct and two >= goal_two_hop and pct - base >= goal_gain
        lines.append(f"goal ({goal_pct:.0f}% held-out, two-hop >= {100 * goal_two_hop:.0f}%, "
                     f"+{goal_gain:.0f} points over the start): best {best['name']} at "
                     f"{pct:.1f}%, two-hop {100 * two:.1f}%, {pct - base:+.1f} points over the "
                     f"start's {base:.1f}%: {'MET' if ok else 'not met'}")
    return "\n".join(lines)


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=1, default=str))

