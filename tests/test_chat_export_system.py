"""`export --format messages` of a run trained here starts with the system prompt the policy saw
(issue 58, item 12): read back from the trajectory's prompt tokens, equal to the environment's."""
from __future__ import annotations

import json

from core.envs.search.env import SYSTEM_PROMPT
from storage import db
from storage.chat_export import system_prompt, write_messages
from tests.test_chat_export import SEARCH


def test_a_trained_runs_messages_start_with_the_policys_system_prompt(tmp_path):
    with db.reading(SEARCH) as con:
        run, = con.execute("SELECT run_id FROM runs WHERE source = 'trainer' AND status = "
                           "'finished'").fetchone()
        ids = [t for (t,) in con.execute("SELECT traj_id FROM trajectories WHERE run_id = ? AND "
                                         "split = 'train' ORDER BY step, traj_id LIMIT 3",
                                         [run]).fetchall()]
        prompts = dict(con.execute("SELECT traj_id, prompt FROM trajectories WHERE run_id = ?",
                                   [run]).fetchall())
    out = tmp_path / "sft.jsonl"
    assert write_messages(SEARCH, run, out, traj_ids=ids) == 3
    for line in map(json.loads, out.read_text().splitlines()):
        assert line["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert line["messages"][1] == {"role": "user", "content": prompts[line["traj_id"]]}


def test_system_turns_of_the_common_templates():
    assert system_prompt("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe "
                         "brief.<|eot_id|><|start_header_id|>user") == "Be brief."
    assert system_prompt("<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>") == "Be brief."
    assert system_prompt("[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]") == "Be brief."
    assert system_prompt("<bos><start_of_turn>user\nHi<end_of_turn>") is None
