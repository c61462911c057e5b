"""Imported runs labelled by what their files say (issue 51, item 5): the model, environment and
algorithm a record names instead of "unknown", a step-numbered file named after its folder, and
an Inspect-style "answered without a tool call" where the tools offered are not a search."""
from __future__ import annotations

import json

from storage import ingest, queries


def _write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_a_verl_step_file_is_named_after_its_folder_and_keeps_its_data_source(tmp_path):
    dump = _write(tmp_path / "search_r1_rollouts" / "1.jsonl", [
        {"input": "Q: capital of Osk?", "output": "<answer>Varno</answer>", "score": 1.0,
         "step": 1, "data_source": "nq", "adv_estimator": "grpo"},
        {"input": "Q: capital of Osk?", "output": "<answer>Lenna</answer>", "score": 0.0,
         "step": 1, "data_source": "nq", "adv_estimator": "grpo"}])
    store = tmp_path / "s.duckdb"
    report = ingest.import_file(dump, store, "verl")
    run = queries.runs(str(store)).set_index("run_id").loc[report.run_id]
    assert run["name"] == "search_r1_rollouts · 1.jsonl"        # not "1"
    config = queries.run_config(run["config"])
    assert (config["env"], config["algo"], config["model"]) == ("nq", "grpo", "unknown")
    named = ingest.import_file(dump, store, "verl", run_name="mine", run_id="other")
    assert queries.runs(str(store)).set_index("run_id").loc[named.run_id, "name"] == "mine"


def test_a_chat_log_names_its_model_and_a_skipped_tool_is_not_a_skipped_search(tmp_path):
    tools = [{"type": "function", "function": {"name": "catalogue", "parameters": {}}}]
    log = _write(tmp_path / "shop.jsonl", [
        {"model": "gpt-4o-mini", "tools": tools, "reward": 0.0, "success": False,
         "messages": [{"role": "user", "content": "What do 3 kiwis cost?"},
                      {"role": "assistant", "content": "About 3.00."}]}])
    store = tmp_path / "s.duckdb"
    report = ingest.import_file(log, store, "messages")
    run = queries.runs(str(store)).set_index("run_id").loc[report.run_id]
    assert queries.run_config(run["config"])["model"] == "gpt-4o-mini"
    classes = queries.failure_counts(str(store), report.run_id)
    assert list(classes["failure_class"]) == ["answered_without_tool_call"]
