"""A JSONL file exported before a turn's ``info`` was a field of the generic record still imports
whole: that export wrote each turn's stored info as its JSON text (a string), where the current
one writes the object (storage/interchange.py ``from_rows``). A trainer's run records an info per
turn (the environment's step info), so every line of such a file carried one.
"""
from __future__ import annotations

import json

import pytest

from storage import ingest, queries
from storage.interchange import LineError, validate

INFO = {"slips": 1, "moved": True}


def _as_exported_before(info) -> dict:
    """One line as the former ``agentrl export`` wrote it (turns: the stored row, ``parsed`` and
    ``state_diff`` read back, ``info`` left as the stored JSON text)."""
    return {"traj_id": "s0-g0-r0", "task_id": "lake-3", "group_id": "s0-g0", "step": 0,
            "split": "train", "reward": 1.0, "success": True, "num_turns": 1,
            "finish_reason": "done", "info": {"env": "frozenlake"},
            "turns": [{"action": "<move>right</move>", "observation": "you slid",
                       "action_valid": True, "action_type": "move", "state_key": "r0c1",
                       "info": info}],
            "rewards": {"outcome": 1.0, "format": 0.0, "cost": 0.0, "process": 0.0}}


def test_a_turn_info_exported_as_json_text_imports_as_its_object(tmp_path):
    src = tmp_path / "old-export.jsonl"
    src.write_text(json.dumps(_as_exported_before(json.dumps(INFO))) + "\n")
    report = ingest.import_file(src, tmp_path / "s.duckdb", run_id="old")
    assert (report.imported, report.failed) == (1, 0), report.errors
    turn = queries.turns(tmp_path / "s.duckdb", "old", ["s0-g0-r0"]).iloc[0]
    assert json.loads(turn["info"]) == INFO
    assert turn["state_key"] == "r0c1"


@pytest.mark.parametrize("info", ["not json", "[1, 2]", '{"x": NaN}'])
def test_a_turn_info_text_that_is_no_object_is_still_refused_named(info):
    with pytest.raises(LineError, match=r"turns\[0\]\.info' must be an object, got str"):
        validate(_as_exported_before(info))
