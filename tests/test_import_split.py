"""Splits at import (`--split`, verl's validation folders): what Compare pairs on imported runs."""
from __future__ import annotations

import json
from pathlib import Path

from storage import db
from storage.ingest.follow import Follower
from storage.io import main


def _verl(folder: Path, step: int, n: int = 3) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"input": f"question {k}?", "output": f"<answer>a{k}</answer>",
                         "gts": [f"a{k}"], "score": float(k % 2), "step": step})
             for k in range(n)]
    (folder / f"{step}.jsonl").write_text("\n".join(lines) + "\n")


def _splits(store: Path) -> dict[tuple[str, str], int]:
    with db.reading(store) as con:
        return {(r, s): n for r, s, n in con.execute(
            "SELECT run_id, split, count(*) FROM trajectories GROUP BY ALL").fetchall()}


def test_verl_validation_folder_is_eval_and_split_overrides_every_format(tmp_path, capsys):
    outputs = tmp_path / "outputs"
    _verl(outputs / "rollout", 1)
    _verl(outputs / "validation", 1)  # trainer.validation_data_dir: same form, other folder
    store = tmp_path / "s.duckdb"
    assert main(["import", str(outputs), "--db", str(store), "--format", "verl",
                 "--run-id", "both"]) == 0
    assert _splits(store) == {("both", "train"): 3, ("both", "eval"): 3}
    assert main(["import", str(outputs / "rollout"), "--db", str(store), "--format", "verl",
                 "--run-id", "marked", "--split", "eval"]) == 0
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "hello"}],
                                "reward": 1.0}) + "\n")
    assert main(["import", str(chat), "--db", str(store), "--run-id", "chat",
                 "--split", "heldout"]) == 0
    splits = _splits(store)
    assert splits[("marked", "eval")] == 3 and splits[("chat", "heldout")] == 1
    assert ("marked", "train") not in splits
    # marked after the fact: a rerun skips what the run holds, --replace rewrites it
    assert main(["import", str(chat), "--db", str(store), "--run-id", "chat", "--split", "eval"]) == 0
    assert _splits(store)[("chat", "heldout")] == 1
    assert main(["import", str(chat), "--db", str(store), "--run-id", "chat", "--split", "eval",
                 "--replace"]) == 0
    assert _splits(store)[("chat", "eval")] == 1 and ("chat", "heldout") not in _splits(store)
    assert main(["import", str(chat), "--db", str(store), "--split", "no way"]) == 2
    assert "--split 'no way' must be" in capsys.readouterr().err


def test_follow_takes_the_split_and_knows_a_validation_folder(tmp_path):
    store = tmp_path / "s.duckdb"
    _verl(tmp_path / "val_generations", 0)
    _verl(tmp_path / "rollout", 2)
    for folder, split, run in (("val_generations", None, "val"), ("rollout", "eval", "r")):
        follower = Follower(tmp_path / folder, store, "verl", run, log=lambda m: None,
                            split=split)
        try:
            follower.poll_once()  # the first look sees the file, the second finds it stable
            follower.poll_once()
        finally:
            follower.close()
    assert _splits(store) == {("val", "eval"): 3, ("r", "eval"): 3}
