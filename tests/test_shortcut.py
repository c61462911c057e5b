"""The search env's ``leak`` option (a reward a shallow strategy can earn) and the committed run
trained on it (sample_runs/shortcut.duckdb): the shallow-strategy alarm holds for the shortcut
and stays quiet for the behaviours the run did not learn."""
from __future__ import annotations

import pytest

from core.envs.options import OptionError
from core.envs.search.env import LEAK_NOTE, SearchEnv


def test_leak_puts_the_answer_in_train_prompts_only_and_answering_it_pays():
    clean = SearchEnv(two_hop_frac=0.0)
    env = SearchEnv(two_hop_frac=0.0, leak=0.5)
    train, plain = env.tasks("train", 200, seed=3), clean.tasks("train", 200, seed=3)
    leaked = [t for t in train if t.meta.get("leaked")]
    # The same tasks in the same order; about half carry their answer, exactly as LEAK_NOTE says.
    assert [t.task_id for t in train] == [t.task_id for t in plain]
    assert 70 <= len(leaked) <= 130
    for task, before in zip(train, plain):
        note = LEAK_NOTE.format(answer=task.golds[0])
        assert task.prompt == (before.prompt + note if task.meta.get("leaked") else before.prompt)
    # Deterministic per task: another draw that meets the same task leaks it again.
    again = {t.task_id: t.prompt for t in env.tasks("train", 200, seed=3)}
    assert all(again[t.task_id] == t.prompt for t in train)
    # The shortcut: answer the note at once, no search, and the grader pays in full.
    task = leaked[0]
    episode = env.episode(task)
    episode.step(f"<answer>{task.prompt.rsplit(': ', 1)[1].rstrip(')')}</answer>")
    outcome = episode.outcome()
    assert outcome.success and outcome.score == 1.0 and outcome.info["searches"] == 0
    # Held-out prompts never leak, whatever the share; the default leaks nothing.
    assert not any("answer key" in t.prompt for t in SearchEnv(leak=1.0).tasks("heldout", 60, 0))
    assert not any(t.meta.get("leaked") for t in clean.tasks("train", 200, seed=3))
    assert all(t.meta.get("leaked") for t in SearchEnv(leak=1.0).tasks("train", 50, seed=1))


def test_leak_outside_its_range_is_refused_by_name():
    with pytest.raises(OptionError, match="leak=1.5"):
        SearchEnv(leak=1.5)
