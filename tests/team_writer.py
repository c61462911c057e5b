"""One trainer-like writer for tests/test_team_store.py: ``python -m tests.team_writer STORE
NAME STEPS`` records STEPS steps of 16 trajectories and 3,200 token rows each through the
Recorder, as the trainer does, then finishes the run."""
from __future__ import annotations

import sys

from storage.recorder import Recorder


def step_tables(step: int, n: int = 16, tokens: int = 200) -> dict[str, dict[str, list]]:
    ids = [f"s{step}-r{i}" for i in range(n)]
    trajs = {"traj_id": ids, "group_id": [f"g{i // 4}" for i in range(n)],
             "task_id": [f"t{i // 4}" for i in range(n)], "reward": [float(i % 2) for i in range(n)],
             "advantage": [0.0] * n, "success": [bool(i % 2) for i in range(n)],
             "num_turns": [1] * n, "finish_reason": ["answered"] * n, "split": ["train"] * n}
    cols = ("traj_id", "pos", "token_id", "text", "role", "trained", "logprob", "advantage")
    toks: dict[str, list] = {c: [] for c in cols}
    for tid in ids:
        for pos in range(tokens):
            for c, v in zip(cols, (tid, pos, 7, "x", "action", True, -1.0, 0.5)):
                toks[c].append(v)
    return {"trajectories": trajs, "tokens": toks}


def main(store: str, name: str, steps: int) -> None:
    rec = Recorder(store)
    rec.start_run({"env": "team-writer"}, name=name)
    for step in range(1, steps + 1):
        rec.record_step(step, metrics={"reward/mean": 0.5}, **step_tables(step))
    rec.finish()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
