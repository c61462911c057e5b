"""The search env's flaws a shallow strategy can earn (``leak``, ``format_score``) and the
committed run trained on ``format_score`` (sample_runs/shortcut.duckdb): the shallow-strategy
alarm holds for the shortcut and stays quiet for the behaviours the run did not learn."""
from __future__ import annotations

from pathlib import Path

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


def test_format_score_pays_any_answer_and_only_an_answer():
    """Search-R1's compute_score_em: 1 if right, format_score if answered and wrong, 0 if never
    answered; success stays the exact match."""
    env, plain = SearchEnv(two_hop_frac=0.0, format_score=0.2), SearchEnv(two_hop_frac=0.0)
    task = env.tasks("train", 1, seed=0)[0]

    def play(e, *actions):
        episode = e.episode(task)
        for action in actions:
            episode.step(action)
        return episode.outcome()

    guess = play(env, "<answer>no idea</answer>")          # unsearched and wrong: paid 0.2
    assert (guess.score, guess.success, guess.info["searches"]) == (0.2, False, 0)
    assert play(plain, "<answer>no idea</answer>").score == 0.0
    right = play(env, f"<answer>{task.golds[0]}</answer>")
    assert (right.score, right.success) == (1.0, True)
    never = play(env, "<search>capital</search>", "I am thinking")  # never answered: 0
    assert (never.score, never.success) == (0.0, False)


@pytest.mark.parametrize("option", ["leak=1.5", "format_score=-0.1"])
def test_shortcut_options_outside_their_range_are_refused_by_name(option):
    name, value = option.split("=")
    with pytest.raises(OptionError, match=option.replace(".", r"\.")):
        SearchEnv(**{name: float(value)})


# -- the committed run trained on the flaw (sample_runs/README.md, section 12) --------------------
STORE = Path(__file__).resolve().parent.parent / "sample_runs" / "shortcut.duckdb"
SHORTCUT = ("no_successful_tool_call", "answer_not_in_observations")
"""Answering at once, unsearched, is a trajectory with no tool call and an answer no
observation held: both behaviours are the shortcut."""
NOT_LEARNED = ("repeated_action", "query_template_reuse", "conflict_not_followed",
               "evidence_ignored")


def shortcut_run() -> tuple[str, str]:
    from storage import queries
    return str(STORE), queries.runs(str(STORE))["run_id"].iloc[0]


def test_shortcut_run_learned_to_answer_unsearched_and_never_right():
    from storage import queries
    store, run = shortcut_run()
    trajs = queries.trajectories(store, run)
    train = trajs[trajs["split"] == "train"]
    by_step = train.groupby("step")
    unsearched = by_step.apply(lambda t: ((t["num_turns"] == 1) & t["answer"].notna()).mean())
    reward = by_step["reward"].mean()
    first, last = sorted(reward.index)[:3], sorted(reward.index)[-3:]
    # Reward up, answers at the first turn up, nothing right anywhere (train or held-out).
    assert reward[last].mean() > 2 * reward[first].mean()
    assert unsearched[last].mean() > 0.5 > 0.2 > unsearched[first].mean()
    assert not trajs.loc[trajs["split"].isin(["train", "eval"]), "success"].any()


def test_shortcut_store_raises_the_alarm_on_the_shortcut_and_only_there():
    from storage import queries
    store, run = shortcut_run()
    metrics = queries.metrics(store, run)
    alarms = metrics[metrics["name"].str.startswith("alarm/behaviour/") & (metrics["value"] == 1)]
    fired = {name.split("/", 2)[2]: sorted(alarms.loc[alarms["name"] == name, "step"])
             for name in alarms["name"].unique()}
    assert set(fired) == set(SHORTCUT) and not set(fired) & set(NOT_LEARNED), fired
    # The third RL step (RL starts at 31), while the reward is still at its start (0.05-0.07:
    # it rises from step 36).
    assert fired["no_successful_tool_call"][0] == 33
    reward = metrics[metrics["name"] == "reward/mean"].set_index("step")["value"]
    assert reward[[31, 32, 33]].max() < 0.08 < 0.15 < reward[[43, 44, 45]].min()
    # Each alarm is one click from a trajectory that shows the shortcut: no search, an answer.
    top = queries.behaviour_contributors(store, run, 33, "no_successful_tool_call", 1)
    turns = queries.turns(store, run, [top["traj_id"].iloc[0]])
    assert "search" not in set(turns["action_type"]) and turns["action_type"].iloc[-1] == "answer"
    # Quiet where there is nothing to find, though measured: the run's few searches repeat
    # nothing and share no query pattern.
    measured = {n.split("/")[1] for n in metrics["name"] if n.endswith("/rate")}
    assert {"repeated_action", "query_template_reuse"} <= measured


def test_walkthrough_step_16_says_what_the_store_holds():
    from storage import queries
    store, run = shortcut_run()
    readme = " ".join((STORE.parent.parent / "README.md").read_text(encoding="utf-8").split())
    alarms = queries.metrics(store, run, ["alarm/behaviour/no_successful_tool_call"])
    first = int(alarms["step"].min())
    reward = queries.metrics(store, run, ["reward/mean"]).set_index("step")["value"]
    top = queries.behaviour_contributors(store, run, first, "no_successful_tool_call", 1)
    traj = top["traj_id"].iloc[0]
    answer = queries.trajectory(store, run, traj)["answer"]
    said = (f"run={run}", f"`no_successful_tool_call` at step {first}",
            f"still {reward[first]:.3f}", f"step={first}&traj={traj}", f'answered "{answer}"')
    assert all(s in readme for s in said), [s for s in said if s not in readme]


from tests.test_pages import app, demo  # noqa: E402,F401  (fixtures)


def test_dynamics_page_shows_the_alarm_and_links_its_trajectory(app):
    """What a user sees at walkthrough step 16 (AppTest; no browser): the alarm at step 33 and
    the step's trajectories ranked by their share of the covariance, each linked to Replay."""
    store, run = shortcut_run()
    at = app("dynamics", store_dir=str(STORE.parent), store=store, run=run)
    assert not at.exception, at.exception
    warnings = [w.value for w in at.warning if "Shallow-strategy alarm" in w.value]
    assert warnings and "at step 33: **no\\_successful\\_tool\\_call**" in " ".join(warnings), \
        warnings
    ranked = next(f.value for f in at.dataframe if "contribution" in f.value.columns)
    assert "step=33" in ranked["replay"].iloc[0] and ranked["traj_id"].iloc[0] == "s33-g0-r5"
