"""A failure class that needs a search applies only where the environment has one (issue #35
part 7): the two-armed bandit's missed pulls were labelled ``answered_without_search``, a class
that says the agent skipped a tool the bandit never had. The rule (storage/failures.py, rule 9)
reads the log's ``info.tools_offered`` when it is recorded, else the episode's actions: a tool
call, or an answer in Search-R1's ``<answer>`` vocabulary that comes with its search.
"""
from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from storage import queries
from storage.failures import classify

ROOT = Path(__file__).resolve().parent.parent


def turn(action: str, kind: str | None, valid: bool = True, error: str | None = None) -> dict:
    return {"action": action, "observation": "", "action_type": kind, "action_valid": valid,
            "error": error}


def test_a_bandit_pull_that_missed_is_a_wrong_answer_not_a_skipped_search():
    pull = [turn("<answer>Phoenix</answer>", "pull")]
    assert classify(pull, success=False, finish_reason="done", answer="Phoenix",
                    info={"episode_seed": 3}) == "wrong_answer"


@pytest.mark.parametrize("turns, info, cls", [
    ([turn("<answer>Paris</answer>", "answer")], {}, "answered_without_search"),  # search env
    ([turn("<answer>Paris</answer>", None)], {}, "answered_without_search"),  # imported, parsed
    ([turn("Paris", None)], {"tools_offered": True}, "answered_without_tool_call"),  # a shop's log
    ([turn("<answer>Paris</answer>", "answer")], {"tools_offered": True},
     "answered_without_tool_call"),                            # offered tools, none a search
])
def test_an_answer_without_a_tool_call_where_one_was_offered_names_the_tool(turns, info, cls):
    assert classify(turns, success=False, finish_reason="answered", answer="Paris",
                    info=info) == cls


def test_a_log_that_offered_no_tool_and_an_unmarked_answer_are_wrong_answers():
    assert classify([turn("<answer>Paris</answer>", "answer")], success=False,
                    finish_reason="answered", answer="Paris",
                    info={"tools_offered": False}) == "wrong_answer"
    assert classify([turn("Paris", None)], success=False, finish_reason="answered",
                    answer="Paris", info={}) == "wrong_answer"


def test_no_committed_run_without_a_tool_action_is_said_to_have_skipped_one():
    """Every sample store: a trajectory labelled answered_without_search answered in a run whose
    environment offers a search or tool (search, apps, an Inspect task with tools)."""
    labelled = 0
    for path in sorted((ROOT / "sample_runs").glob("*.duckdb")):
        with duckdb.connect(str(path), read_only=True) as con:
            rows = con.execute("""
                SELECT r.config, t.info, list(u.action_type) AS kinds
                FROM trajectories t JOIN runs r USING (run_id)
                JOIN turns u ON u.run_id = t.run_id AND u.traj_id = t.traj_id
                WHERE t.failure_class = 'answered_without_search'
                GROUP BY ALL""").fetchall()
        for config, info, kinds in rows:
            env = queries.run_config(config).get("env")
            assert env not in ("bandit", "frozenlake", "sokoban"), (path.name, env)
            assert '"tools_offered": false' not in (info or ""), path.name
            labelled += 1
    assert labelled >= 1          # the class still exists where it means something


def test_the_collapse_runs_missed_pulls_are_wrong_answers():
    path = str(ROOT / "sample_runs" / "collapse_bandit.duckdb")
    counts = {}
    for run_id in queries.runs(path)["run_id"]:
        for row in queries.failure_counts(path, run_id).itertuples():
            counts[row.failure_class] = counts.get(row.failure_class, 0) + int(row.n)
    assert "answered_without_search" not in counts
    assert counts == {"success": 3129, "wrong_answer": 1525, "format_error": 98}
