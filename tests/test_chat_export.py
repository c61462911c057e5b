"""`export --format messages`: trajectories out as a chat dataset with tool calls -- filters
(tags, a read-only query), the round trip through `import --format messages`, and one SFT step
with TRL's SFTTrainer on the file as it is written."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from storage import db
from storage.annotations import add_tag
from storage.io import main

ROOT = Path(__file__).resolve().parent.parent
SEARCH = ROOT / "sample_runs" / "search_smollm2.duckdb"  # real trained SmolLM2 search runs
GOOD = ("SELECT traj_id FROM trajectories WHERE run_id = '{run}' AND success AND num_turns = 2 "
        "AND split = 'train' ORDER BY step DESC, traj_id LIMIT 8")
"""The good ones: successful episodes that searched once, then answered (the latest steps')."""
TOOLS = [{"type": "function", "function": {"name": "add", "description": "x + y", "parameters": {
    "type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}}}}]


def _call(i: str, name: str, args: dict) -> dict:
    return {"id": i, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


CONVERSATIONS = [
    {"traj_id": "two-calls", "task_id": "sum", "reward": 1.0, "tools": TOOLS, "messages": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "What is (2+3)+(4+5)?\nShow it."},
        {"role": "assistant", "content": "Two sums first.", "tool_calls": [
            _call("a", "add", {"x": 2, "y": 3}), _call("b", "add", {"x": 4, "y": 5})]},
        {"role": "tool", "tool_call_id": "a", "content": "5"},
        {"role": "tool", "tool_call_id": "b", "content": "9"},
        {"role": "assistant", "content": None, "tool_calls": [_call("c", "add", {"x": 5, "y": 9})]},
        {"role": "tool", "tool_call_id": "c", "content": "14"},
        {"role": "assistant", "content": "14"}]},
    {"traj_id": "failed", "task_id": "sum", "reward": 0.0, "messages": [
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("d", "add", {"x": 2})]},
        {"role": "tool", "tool_call_id": "d", "content": "ERROR: y is missing", "status": "error"},
        {"role": "assistant", "content": "I cannot add."}]},
    {"traj_id": "chat", "task_id": "hello", "reward": 0.0, "messages": [
        {"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "Again, politely."}, {"role": "assistant", "content": "Hi!"}]},
]


def _turns(store: Path, run: str) -> dict:
    with db.reading(store) as con:
        trajs = con.execute("SELECT traj_id, task_id, prompt, reward, success, failure_class "
                            "FROM trajectories "
                            "WHERE run_id = ? ORDER BY traj_id", [run]).fetchall()
        turns = con.execute("SELECT traj_id, turn, action, observation, action_type, parsed, "
                            "error FROM turns WHERE run_id = ? ORDER BY traj_id, turn", [run]).fetchall()
    return {"trajectories": trajs, "turns": turns}


def test_export_selects_by_tag_and_query_and_round_trips_through_import(tmp_path, capsys):
    source, store = tmp_path / "chats.jsonl", tmp_path / "s.duckdb"
    source.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    assert main(["import", str(source), "--db", str(store), "--run-id", "a"]) == 0
    out = tmp_path / "sft.jsonl"
    assert main(["export", "--db", str(store), "--run", "a", "--format", "messages",
                 "--out", str(out)]) == 0
    lines = {line["traj_id"]: line for line in map(json.loads, out.read_text().splitlines())}
    first = lines["two-calls"]
    assert lines["failed"]["messages"][2] == {"role": "tool", "tool_call_id": "d", "name": "add",
                                              "content": "ERROR: y is missing",
                                              "error": "ERROR: y is missing"}
    assert first["tools"] == TOOLS
    assert [m["role"] for m in first["messages"]] == [
        "system", "user", "assistant", "tool", "tool", "assistant", "tool", "assistant"]
    assert first["messages"][2]["tool_calls"][1]["function"] == {
        "name": "add", "arguments": json.dumps({"x": 4, "y": 5})}
    assert first["messages"][4] == {"role": "tool", "tool_call_id": "b", "name": "add",
                                    "content": "9"}
    # export -> import: the same conversations, turn for turn
    assert main(["import", str(out), "--db", str(store), "--format", "messages",
                 "--run-id", "b"]) == 0
    assert _turns(store, "b") == _turns(store, "a")
    assert ("failed", "sum", "user: What is 2+3?\n", 0.0, False, "tool_error_unrecovered") in \
        _turns(store, "b")["trajectories"]

    add_tag(store, "a", "chat", "keep")
    for flags, expected in ((["--tag", "keep"], ["chat"]), (["--where", "reward >= 1"], ["two-calls"]),
                            (["--sql", "SELECT traj_id FROM tags WHERE tag = 'keep'"], ["chat"]),
                            (["--tag", "nobody-used-it"], [])):
        assert main(["export", "--db", str(store), "--run", "a", "--format", "messages",
                     "--out", str(out), *flags]) == 0, flags
        assert [json.loads(x)["traj_id"] for x in out.read_text().splitlines()] == expected
    capsys.readouterr()
    assert main(["export", "--db", str(store), "--run", "a", "--format", "messages",
                 "--out", str(out), "--sql", "DELETE FROM trajectories"]) == 2
    assert "only SELECT queries are allowed" in capsys.readouterr().err
    assert main(["export", "--db", str(store), "--run", "a", "--format", "messages",
                 "--out", str(out), "--sql", "SELECT 1 AS n"]) == 2
    assert "must return a traj_id column" in capsys.readouterr().err
    assert len(_turns(store, "a")["trajectories"]) == 3  # nothing recorded was touched


def test_trl_sft_trainer_trains_a_step_on_an_exported_search_run(tmp_path):
    pytest.importorskip("trl", reason="TRL is optional: make extras (make test installs it)")
    import torch
    from datasets import load_dataset
    import trl
    from trl import SFTConfig, SFTTrainer

    from core.model.policy import load_base_model, load_tokenizer

    with db.reading(SEARCH) as con:  # the store's run with the most such episodes
        run = con.execute("SELECT run_id FROM trajectories WHERE success AND num_turns = 2 "
                          "GROUP BY run_id ORDER BY count(*) DESC LIMIT 1").fetchone()[0]
    out = tmp_path / "good.jsonl"
    assert main(["export", "--db", str(SEARCH), "--run", run, "--format", "messages",
                 "--out", str(out), "--sql", GOOD.format(run=run)]) == 0
    data = load_dataset("json", data_files=str(out), split="train")
    assert len(data) >= 2 and all(line["success"] for line in data)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tok = load_tokenizer("tiny")
    model = load_base_model("tiny", vocab_size=len(tok))
    model.requires_grad_(True)  # the loader freezes the base (LoRA trains adapters)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    template = Path(trl.__file__).parent / "chat_templates" / "qwen3_training.jinja"
    args = SFTConfig(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=2,
                     learning_rate=1e-3, max_length=768, assistant_only_loss=True,
                     chat_template_path=str(template), report_to="none", save_strategy="no",
                     use_cpu=True, bf16=False, dataloader_num_workers=0, disable_tqdm=True,
                     dataset_num_proc=None, logging_steps=1, seed=0)
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    example = trainer.train_dataset[0]
    trained = tok.decode([t for t in example["labels"] if t != -100])
    context = tok.decode(example["input_ids"])
    # the model is trained on its own words and search call, never on what the search returned
    assert '"name": "search"' in trained and "<answer>" in trained
    assert "<information>" in context and "<information>" not in trained
    result = trainer.train()
    assert result.global_step == 1 and torch.isfinite(torch.tensor(result.training_loss))
    assert any(not torch.equal(before[n], p.detach()) for n, p in model.named_parameters())
