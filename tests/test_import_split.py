"""Splits at import (`--split`, verl's validation folders): what Compare pairs on imported runs."""
from __future__ import annotations

import json
from pathlib import Path

from storage import db
from storage.ingest.follow import Follower
from storage.io import main
from tests.test_pages import app, demo  # noqa: F401  (fixtures)


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


def _agent(path: Path, answers: dict[str, str]) -> None:
    """One agent's conversations on three prompts, rewarded 1 when it answers 'yes'."""
    path.write_text("".join(json.dumps({
        "task_id": task, "reward": float(said == "yes"),
        "messages": [{"role": "user", "content": f"Is {task} true?"},
                     {"role": "assistant", "content": said}]}) + "\n"
        for task, said in answers.items()))


def test_compare_pairs_two_imported_runs_train_splits_when_asked(tmp_path, app):
    stores = tmp_path / "stores"
    stores.mkdir()
    store = stores / "agents.duckdb"
    _agent(tmp_path / "careful.jsonl", {"p": "yes", "q": "yes", "r": "no"})
    _agent(tmp_path / "hasty.jsonl", {"p": "yes", "q": "no", "r": "yes"})
    for name in ("careful", "hasty"):
        assert main(["import", str(tmp_path / f"{name}.jsonl"), "--db", str(store),
                     "--run-id", name]) == 0
    at = app("compare", store_dir=str(stores), store=str(store), run="careful")
    assert any("No held-out evaluation" in i.value for i in at.info)
    at.toggle(key="cmp_train").set_value(True).run()
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["gained"] == "1" and metrics["lost"] == "1" and metrics["solved in A"] == "2 / 3"
    assert any(cap.value.startswith("What is compared: the trajectories of split 'train' of A "
                                    "and of B, paired on task id: 3 in both") for cap in at.caption)
    # a link naming a train step opens with the train splits listed
    at = app("compare", store_dir=str(stores), store=str(store), run="careful", a="careful:0",
             b="hasty:0")
    assert at.toggle(key="cmp_train").value and not at.exception
    assert {m.label: m.value for m in at.metric}["lost"] == "1"
