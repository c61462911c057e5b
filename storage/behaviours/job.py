"""``agentrl behaviours --db PATH --run RUN_ID``: behaviours of a stored run's trajectories and
what the advantage paid for, written back into the store. Also the trainer's per-step entry
(``step_results``), so both write the same rows and metrics.

Writes, replacing what an earlier job wrote for the run (rerunning is idempotent):
    behaviours(run_id, step, traj_id, name, value)          one row per defined value
    metrics behaviour/<name>/rate      mean of b over the step's training trajectories
            behaviour/<name>/adv_cov   Cov(A, b) over them (payoff.py)
            behaviour/<name>/p         one-sided p-value that Cov(A, b) > 0
            alarm/behaviour/<name>     1.0 at each step where the shallow-strategy alarm holds

A trajectory's advantage A is the one the loss applied: the mean of ``tokens.advantage`` over
its trained tokens (the loss mask as the optimiser applied it), for runs trained here and imports
alike. Only where no trained token carries an advantage (an import without token advantages, a
trajectory filtered out of the update) is it the stored ``trajectories.advantage``, else it has
none and stays out of the covariance. Why not ``trajectories.advantage`` first: for GiGPO, IGPO,
SPA and PRM runs it is the episode or outcome scalar, while the loss used per-turn credit (GiGPO's
step term, IGPO's gains): on credit_gigpo every trajectory differs, and a step whose episode
advantages are all 0 still paid its tokens. Training trajectories are those whose split is not
eval, sft, expert or branch; a run with none (an evaluation log) has its non-branch trajectories
used for rates, with no advantage.

The step's rows reach this module cleaned by the recorder's rule for text (core/run/step_rows.py
``clean_columns``); and whatever the behaviours step raises, the trainer's step is recorded
without behaviours, never failed (``StepBehaviours``).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from storage import db
from storage.behaviours.measures import BEHAVIOURS, behaviour_values, kind
from storage.behaviours.payoff import ALPHA, K_STEPS, AlarmTracker, alarm_steps, step_stats
from storage.migrations import check_version, prepare
from storage.protocol import TOOL_ACTIONS
from storage.recorder import from_json

NOT_TRAINED = ("eval", "sft", "expert", "branch")
BEHAVIOURS_SCHEMA = 9
"""The schema version that brought the ``behaviours`` table (migration m009), all the job needs."""
PREFIXES = ("behaviour/", "alarm/behaviour/")


def offers_tools(turns) -> bool:
    """Whether the environment has a tool: some turn called one, or answered in Search-R1's
    ``<answer>`` vocabulary, which comes with its search (as storage/failures.py reads it). A
    bandit's pull or a grid's move is not a tool. Read over the whole run (or, in the trainer,
    every step so far): a step where no trajectory searched still had the search to skip."""
    return any(kind(t) in TOOL_ACTIONS or kind(t) == "answer" for t in turns)


def records(trajs: pd.DataFrame, turns: pd.DataFrame, gains: pd.DataFrame,
            tools_offered: bool | None = None) -> list[dict]:
    """Behaviour records (measures.py's shape) from a run's rows: ``trajs`` one per trajectory,
    ``turns`` and ``gains`` (traj_id, turn, value) keyed by traj_id. ``tools_offered`` defaults to
    whether any turn of these trajectories called a tool."""
    by_traj: dict[str, list[dict]] = defaultdict(list)
    cols = ["traj_id", "turn", "action", "observation", "action_valid", "action_type", "error",
            "query"]
    for row in zip(*(turns[c].tolist() if c in turns else [None] * len(turns) for c in cols)):
        t = dict(zip(cols, row))
        for key in ("action_valid", "error", "action_type"):
            if t[key] is not None and isinstance(t[key], float) and math.isnan(t[key]):
                t[key] = None
        t["parsed"] = {"query": t.pop("query")} if t.get("query") is not None else None
        by_traj[t["traj_id"]].append(t)
    gain_of: dict[str, dict[int, float]] = defaultdict(dict)
    for tid, turn, value in zip(gains.get("traj_id", []), gains.get("turn", []),
                                gains.get("value", [])):
        gain_of[tid][int(turn)] = float(value)
    if tools_offered is None:
        tools_offered = offers_tools(t for ts in by_traj.values() for t in ts)
    out = []
    for r in trajs.to_dict("records"):
        declared = r.get("tools_offered")
        r = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
        r["golds"] = from_json(r.get("golds"))
        r["turns"] = sorted(by_traj.get(r["traj_id"], []), key=lambda t: t["turn"])
        r["tools_offered"] = _tools_offered(declared, r["turns"], tools_offered)
        r["info_gain"] = gain_of.get(r["traj_id"]) or None
        out.append(r)
    return out


def _tools_offered(declared, turns: Sequence[Mapping], run_default: bool) -> bool:
    """Whether a tool was offered to this trajectory: yes if it called one (what the trajectory
    did beats a declaration: an import writes ``info.tools_offered = false`` for a trace whose
    tool list is empty, though its agent called ``add``), else the declaration where there is
    one, else whether the run shows a tool (``offers_tools``)."""
    if any(kind(t) in TOOL_ACTIONS for t in turns):
        return True
    if declared is None or declared != declared:  # NULL, or pandas' NaN for it
        return run_default
    return str(declared).lower() == "true"


def applied_advantage(traj_ids: Sequence[str], stored: Sequence[float | None],
                      token_traj: Sequence[str], token_trained: Sequence,
                      token_adv: Sequence[float | None]) -> list[float | None]:
    """Each trajectory's A (module docstring): the mean advantage over its trained tokens with a
    finite one, else its ``stored`` trajectory advantage. The trainer's per-step call hands the
    step's token columns; the job does the same in SQL (``_read``)."""
    tokens = pd.DataFrame({"traj_id": list(token_traj),
                           "trained": pd.array(list(token_trained), dtype="boolean"),
                           "adv": pd.to_numeric(pd.Series(list(token_adv), dtype=object),
                                                errors="coerce").astype(float)})
    keep = tokens["trained"].fillna(False).to_numpy(bool) & np.isfinite(tokens["adv"].to_numpy())
    mean = tokens[keep].groupby("traj_id")["adv"].mean().to_dict() if keep.any() else {}
    return [mean.get(tid, a) for tid, a in zip(traj_ids, stored)]


def training_mask(splits: Sequence[str | None]) -> list[bool]:
    trained = [s not in NOT_TRAINED for s in splits]
    return trained if any(trained) else [s != "branch" for s in splits]


def step_results(step_trajs: Sequence[Mapping], trained: Sequence[bool] | None = None
                 ) -> tuple[dict[str, list], dict[str, dict]]:
    """One step's behaviour rows (column lists: traj_id, name, value) and, per behaviour, its
    ``step_stats`` over the training trajectories. Behaviours are computed per split (a step's
    queries are compared with the same split's)."""
    trained = list(trained) if trained is not None else [True] * len(step_trajs)
    rows: dict[str, list] = {"traj_id": [], "name": [], "value": []}
    values: dict[str, list] = {name: [None] * len(step_trajs) for name in BEHAVIOURS}
    by_split: dict[Any, list[int]] = defaultdict(list)
    for i, t in enumerate(step_trajs):
        by_split[t.get("split")].append(i)
    for idx in by_split.values():
        for name, vals in behaviour_values([step_trajs[i] for i in idx]).items():
            for i, v in zip(idx, vals):
                values[name][i] = v
    for name, vals in values.items():
        for t, v in zip(step_trajs, vals):
            if v is not None:
                rows["traj_id"].append(t["traj_id"])
                rows["name"].append(name)
                rows["value"].append(v)
    adv = [t.get("advantage") for t, m in zip(step_trajs, trained) if m]
    stats_ = {name: step_stats(adv, [v for v, m in zip(vals, trained) if m])
              for name, vals in values.items()}
    return rows, {n: s for n, s in stats_.items() if s["n"]}


def stat_metrics(stats_: Mapping[str, dict]) -> dict[str, float]:
    """The metric rows of one step's stats (NaN covariances are left out, not written as 0)."""
    out = {}
    for name, s in stats_.items():
        out[f"behaviour/{name}/rate"] = s["rate"]
        if math.isfinite(s["adv_cov"]):
            out[f"behaviour/{name}/adv_cov"] = s["adv_cov"]
            out[f"behaviour/{name}/p"] = s["p"]
    return out


class StepBehaviours:
    """The trainer's side: each step's behaviour rows and metrics, the alarm over the steps so
    far (payoff.AlarmTracker), and whether the environment has shown a tool yet."""

    def __init__(self, k: int = K_STEPS, alpha: float = ALPHA):
        self.alarms = AlarmTracker(k, alpha)
        self.tools_offered = False

    def __call__(self, step: int, tables: Mapping[str, Mapping[str, list]]) -> tuple[dict, dict]:
        """(behaviour rows, metrics) of one step from its ``step_tables`` column lists; ({}, {})
        and a line on stderr if anything in it raises: the step is recorded without behaviours
        and training goes on."""
        try:
            return self._step(step, tables)
        except Exception as exc:  # noqa: BLE001 -- an analysis never fails the run it reads
            why = exc if type(exc) is ValueError else f"{type(exc).__name__}: {exc}"
            print(f"behaviours, step {step}: {why}; none recorded for this step",
                  file=sys.stderr)
            return {}, {}

    def _step(self, step: int, tables: Mapping[str, Mapping[str, list]]) -> tuple[dict, dict]:
        trajs = pd.DataFrame(tables.get("trajectories") or {})
        if trajs.empty:
            return {}, {}
        tokens = tables.get("tokens") or {}
        if tokens.get("advantage") is not None and "advantage" in trajs:
            trajs["advantage"] = applied_advantage(
                trajs["traj_id"].tolist(), trajs["advantage"].tolist(), tokens["traj_id"],
                tokens.get("trained") or [None] * len(tokens["traj_id"]), tokens["advantage"])
        turns = pd.DataFrame(tables.get("turns") or {})
        parsed = turns.get("parsed")
        turns["query"] = [p.get("query") if isinstance(p, Mapping) else None
                          for p in (parsed if parsed is not None else [None] * len(turns))]
        signals = pd.DataFrame(tables.get("turn_signals") or {})
        gains = signals[signals["name"] == "info_gain"] if len(signals) else signals
        self.tools_offered = self.tools_offered or offers_tools(turns.to_dict("records"))
        recs = records(trajs, turns, gains, self.tools_offered)
        mask = [s not in NOT_TRAINED for s in trajs.get("split", ["train"] * len(trajs))]
        rows, stats_ = step_results(recs, mask)
        metrics = stat_metrics(stats_)
        if any(mask):
            for name, s in stats_.items():
                if BEHAVIOURS[name].shallow and self.alarms.add(name, step, s):
                    metrics[f"alarm/behaviour/{name}"] = 1.0
        return rows, metrics


# ---- the job ------------------------------------------------------------------------------------
def _read(con, run_id: str) -> list[dict]:
    trajs = con.execute("""
        SELECT traj_id, step, split, task_id, answer, golds, success, finish_reason, num_turns,
               response_tokens, advantage, info->>'tools_offered' AS tools_offered
        FROM trajectories WHERE run_id = ? ORDER BY step, traj_id""", [run_id]).df()
    applied = con.execute("""
        SELECT traj_id, avg(advantage) AS a FROM tokens
        WHERE run_id = ? AND trained AND isfinite(advantage) GROUP BY traj_id""", [run_id]).df()
    if len(applied):  # the advantage the loss used (module docstring), else the stored one
        token_mean = trajs["traj_id"].map(dict(zip(applied["traj_id"], applied["a"])))
        trajs["advantage"] = token_mean.astype(float).fillna(trajs["advantage"])
    turns = con.execute("""
        SELECT traj_id, turn, action, observation, action_valid, action_type, error,
               parsed->>'query' AS query
        FROM turns WHERE run_id = ?""", [run_id]).df()
    gains = con.execute("""
        SELECT traj_id, turn, value FROM turn_signals
        WHERE run_id = ? AND name = 'info_gain' AND value IS NOT NULL""", [run_id]).df()
    return records(trajs, turns, gains)


def compute(recs: Sequence[Mapping], k: int = K_STEPS, alpha: float = ALPHA
            ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every step's behaviour rows and metrics (with the alarms) for one run's records."""
    mask = training_mask([r.get("split") for r in recs])
    steps: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(recs):
        steps[int(r["step"] if r.get("step") is not None else 0)].append(i)
    rows, metrics = [], []
    series: dict[str, list[tuple[int, dict]]] = defaultdict(list)
    for step in sorted(steps):
        idx = steps[step]
        cols, stats_ = step_results([recs[i] for i in idx], [mask[i] for i in idx])
        rows.append(pd.DataFrame({"step": step, **cols}))
        metrics += [(step, n, v) for n, v in stat_metrics(stats_).items()]
        for name, s in stats_.items():
            if any(mask[i] for i in idx):
                series[name].append((step, s))
    for name, points in series.items():
        if not BEHAVIOURS[name].shallow:
            continue
        st = [p for _, p in points]
        for step in alarm_steps([s for s, _ in points], [p["rate"] for p in st],
                                [p["p"] for p in st], [p["adv_cov"] for p in st], k, alpha):
            metrics.append((step, f"alarm/behaviour/{name}", 1.0))
    frame = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(
        {"step": [], "traj_id": [], "name": [], "value": []})
    return frame, pd.DataFrame(metrics, columns=["step", "name", "value"])


def run_job(path: str | Path, run_id: str, k: int = K_STEPS, alpha: float = ALPHA) -> dict:
    """Compute and store the run's behaviours, replacing the previous job's; return counts."""
    path = Path(path)
    if not path.is_file():
        raise db.StoreError(f"{path}: no such store file")
    with db.reading(path) as con:
        version = check_version(con, str(path))  # refuses a store newer than this code
    if version < BEHAVIOURS_SCHEMA:  # adds the behaviours table to a store recorded before it;
        prepare(path)                # one that has it keeps its schema (the job writes no other)
    with db.reading(path) as con:
        if not con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]:
            known = [r for (r,) in con.execute("SELECT run_id FROM runs ORDER BY 1").fetchall()]
            raise db.StoreError(f"no run {run_id!r} in {path}; runs there: {', '.join(known)}")
        recs = _read(con, run_id)
    rows, metrics = compute(recs, k, alpha)
    with db.writing(path) as con:
        con.execute("DELETE FROM behaviours WHERE run_id = ?", [run_id])
        con.execute("DELETE FROM metrics WHERE run_id = ? AND (starts_with(name, ?) OR "
                    "starts_with(name, ?))", [run_id, *PREFIXES])
        for table, frame in (("behaviours", rows), ("metrics", metrics)):
            if len(frame):
                con.register("_rows", frame)
                con.execute(f"INSERT INTO {table} BY NAME SELECT *, ?::VARCHAR AS run_id "
                            "FROM _rows", [run_id])
                con.unregister("_rows")
    alarms = metrics[metrics["name"].str.startswith("alarm/")]
    return {"trajectories": len(recs), "rows": len(rows), "metrics": len(metrics),
            "alarms": sorted({(n.split("/", 2)[2], int(s)) for s, n in
                              zip(alarms["step"], alarms["name"])})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="agentrl behaviours", description=(
        "Behaviours of a run's trajectories, their advantage covariance per step and the "
        "shallow-strategy alarms (docs/behaviours.md); rerunning replaces the run's rows."))
    ap.add_argument("--db", required=True, help="the store (a DuckDB file)")
    ap.add_argument("--run", required=True, help="the run's id")
    ap.add_argument("--k", type=int, default=K_STEPS,
                    help=f"consecutive reinforced steps that raise the alarm (default {K_STEPS})")
    ap.add_argument("--alpha", type=float, default=ALPHA,
                    help=f"one-sided level of each step's covariance test (default {ALPHA})")
    args = ap.parse_args(argv)
    if args.k < 1 or not 0 < args.alpha < 1:
        print("agentrl behaviours: --k must be >= 1 and --alpha in (0, 1)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        done = run_job(args.db, args.run, args.k, args.alpha)
    except (db.StoreError, ValueError) as exc:  # ValueError: a behaviour function raised
        print(f"agentrl behaviours: {exc}", file=sys.stderr)
        return 2
    print(f"{done['trajectories']} trajectories, {done['rows']} behaviour rows, "
          f"{done['metrics']} metric rows in {time.perf_counter() - t0:.1f} s")
    for name, step in done["alarms"]:
        print(f"alarm: {name} at step {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
