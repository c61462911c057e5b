"""The export of a branch job (core/jobs/branch.py): AgentPRM's labels, one row per analysed turn, as
JSONL or Parquet (``python -m core.branch ... --export FILE``)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from core.jobs.branch_job import Job


def export_rows(job: Job, rows: list[dict]) -> list[dict]:
    """AgentPRM's labels, one per turn: (state text, action, Q, V, A). The state is the context the
    policy saw before acting (decoded tokens of the prompt and turns before)."""
    tok = job.tokens
    out = []
    for r in rows:
        t = r["turn"]
        state = "".join(str(x) for x in tok[tok["turn"] < t]["text"])
        out.append({"run_id": job.run_id, "traj_id": job.traj_id, "turn": t, "state": state,
                    "action": str(job.recorded[t].get("action") or ""), "q": r["q"], "v": r["v"],
                    "a": r["a"], "q_lo": r["q_lo"], "q_hi": r["q_hi"], "v_lo": r["v_lo"],
                    "v_hi": r["v_hi"], "k": job.k, "checkpoint_step": job.snapshot_step})
    return out


def export(job: Job, rows: list[dict], path: str) -> Path:
    """Write ``export_rows`` as JSONL (``.jsonl``) or Parquet (``.parquet``)."""
    target = Path(path)
    data = export_rows(job, rows)
    if target.suffix == ".parquet":
        pd.DataFrame(data).to_parquet(target, index=False)
    else:
        with open(target, "w", encoding="utf-8") as f:
            for d in data:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
    return target
