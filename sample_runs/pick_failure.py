"""Pick the failure a sample branch analysis is run on, by a rule, never by a hand-typed id.

    python sample_runs/pick_failure.py --db STORE --run-name NAME \
        --kind hole|collateral_damage|one_hop_answer

prints ``RUN_ID TRAJ_ID`` (exit 2 with a message when the run holds no such failure):

* ``hole``: the first RL trajectory (lowest step, then traj_id) of the run named NAME whose
  last observation says it fell into a hole, among those that fell after at least two turns
  (with one turn there is no "which turn" to ask);
* ``collateral_damage``: the first RL trajectory whose failure class (storage/failures.py) is
  ``collateral_damage``: it changed records the task did not ask it to touch.
* ``one_hop_answer``: in the run's last held-out evaluation, the first failed two-hop question
  (its task id names two relations, ``capital>mayor:...``) answered right after a single search:
  the search world's most common failure, one hop short.

``hole`` and ``collateral_damage`` take RL trajectories (split ``train``): their policy is the
adapter right before their step, kept by ``--adapter-every 1``. ``one_hop_answer`` takes a
held-out one: the trainer keeps an adapter at every evaluation. Reads through storage/ like every
page.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage import queries  # noqa: E402

HOLE_TEXT = "fell into a hole"
KINDS = ("hole", "collateral_damage", "one_hop_answer")


def pick(db: str, run_name: str, kind: str) -> tuple[str, str] | None:
    """(run_id, traj_id) of the first failure of ``kind`` in the run named ``run_name``."""
    runs = queries.runs(db)
    named = runs[runs["name"] == run_name]
    if named.empty:
        return None
    run_id = str(named.sort_values("run_id")["run_id"].iloc[0])
    trajs = queries.trajectories(db, run_id)
    if kind == "one_hop_answer":
        return _one_hop_answer(db, run_id, trajs)
    rl = trajs[trajs["split"] == "train"].sort_values(["step", "traj_id"])
    if kind == "collateral_damage":
        hits = rl[rl["failure_class"] == "collateral_damage"]
        return (run_id, str(hits["traj_id"].iloc[0])) if len(hits) else None
    rl = rl[(rl["num_turns"] >= 2) & ~rl["success"].astype(bool)]
    turns = queries.turns(db, run_id, rl["traj_id"].tolist())
    last = turns.sort_values("turn").groupby("traj_id").tail(1)
    fell = set(last[last["observation"].fillna("").str.contains(HOLE_TEXT)]["traj_id"])
    for traj_id in rl["traj_id"]:
        if traj_id in fell:
            return run_id, str(traj_id)
    return None


def _one_hop_answer(db: str, run_id: str, trajs) -> tuple[str, str] | None:
    evals = trajs[trajs["split"] == "eval"]
    if evals.empty:
        return None
    last = evals[evals["step"] == evals["step"].max()]
    failed = last[last["task_id"].str.contains(">", regex=False) & ~last["success"].astype(bool)
                  & (last["num_turns"] == 2)].sort_values("traj_id")
    if failed.empty:
        return None
    turns = queries.turns(db, run_id, failed["traj_id"].tolist())
    kinds = turns.sort_values("turn").groupby("traj_id")["action_type"].agg(list)
    for traj_id in failed["traj_id"]:
        if kinds.get(traj_id) == ["search", "answer"]:
            return run_id, str(traj_id)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--run-name", required=True)
    parser.add_argument("--kind", required=True, choices=KINDS)
    args = parser.parse_args(argv)
    found = pick(args.db, args.run_name, args.kind)
    if found is None:
        print(f"error: run {args.run_name!r} in {args.db} has no {args.kind} failure to branch",
              file=sys.stderr)
        return 2
    print(*found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
