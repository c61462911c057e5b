"""Behaviours measured on what the update applied (issue 58): A is the advantage the loss used,
query reuse is across tasks, what a trajectory did beats a missing tool declaration, a measure
never contradicts the trajectory's own grade, and a lone surrogate in a step's rows cannot fail
a run. Hand-made stores and records whose answers are known; the trainer's path fed directly."""
from __future__ import annotations

import numpy as np
import pytest

from storage import queries
from storage.behaviours import StepBehaviours, run_job
from storage.behaviours import measures as m
from storage.behaviours.job import records
from storage.recorder import Recorder
from tests.test_behaviours import grpo

import pandas as pd

COV = "behaviour/no_successful_tool_call/adv_cov"


def metric(path, run_id: str, name: str) -> dict[int, float]:
    df = queries.metrics(path, run_id)
    return df[df["name"] == name].set_index("step")["value"].to_dict()


# ---- 1. A is the trained-token mean of the advantage the loss used ------------------------------
def credit_step(step: int) -> dict[str, dict[str, list]]:
    """One step of 8 trajectories (2 groups of 4) whose episode advantage is 0 everywhere (every
    group's outcome equal: GiGPO's steps 32-36 on credit_gigpo) while the per-token credit the loss
    used is +1 on the four that answered without searching and -1 on the searchers."""
    ids = [f"s{step}-r{i}" for i in range(8)]
    shallow = [i % 2 == 0 for i in range(8)]
    trajs = {"traj_id": ids, "group_id": [f"g{i // 4}" for i in range(8)],
             "task_id": [f"t{i // 4}" for i in range(8)], "reward": [1.0] * 8,
             "advantage": [0.0] * 8, "success": [True] * 8,
             "num_turns": [1 if s else 2 for s in shallow],
             "finish_reason": ["answered"] * 8, "split": ["train"] * 8,
             "answer": ["Paris"] * 8, "golds": [["Paris"]] * 8}
    turns = {k: [] for k in ("traj_id", "turn", "action", "observation", "action_valid",
                             "action_type")}
    tokens = {k: [] for k in ("traj_id", "pos", "token_id", "text", "role", "trained",
                              "logprob", "advantage")}
    for tid, s in zip(ids, shallow):
        acts = [("<answer>Paris</answer>", "", "answer")] if s else [
            ("<search>capital of France</search>", "Paris is the capital.", "search"),
            ("<answer>Paris</answer>", "", "answer")]
        for k, (action, obs, kind) in enumerate(acts):
            for col, v in zip(turns, (tid, k, action, obs, True, kind)):
                turns[col].append(v)
        # a prompt token (untrained, no advantage), then three trained action tokens
        for pos, (role, trained, adv) in enumerate(
                [("prompt", False, None)] + [("action", True, 1.0 if s else -1.0)] * 3):
            for col, v in zip(tokens, (tid, pos, 7, "x", role, trained, -1.0, adv)):
                tokens[col].append(v)
    return {"trajectories": trajs, "turns": turns, "tokens": tokens}


def test_adv_cov_is_over_the_advantage_the_loss_applied(tmp_path):
    path = tmp_path / "credit.duckdb"
    rec = Recorder(path)
    rec.start_run({"env": "search", "model": "tiny", "algo": "gigpo"}, run_id="credit")
    tracker, trainer_cov = StepBehaviours(), {}
    for step in (1, 2):
        tables = credit_step(step)
        rec.record_step(step, **tables)
        _, paid = tracker(step, tables)
        trainer_cov[step] = paid[COV]
    run_job(path, "credit")
    job_cov = metric(path, "credit", COV)
    # A = +1 on the 4 shallow, -1 on the 4 searchers; b = 1 on the shallow: sum(A (b - 0.5)) / 7
    want = float(np.sum(np.array([1, -1] * 4) * (np.array([1, 0] * 4) - 0.5)) / 7)
    assert job_cov == pytest.approx({1: want, 2: want})     # not 0: the update paid the shortcut
    assert trainer_cov == pytest.approx(job_cov)             # the trainer measures the same A


def test_without_token_advantages_the_stored_one_is_used(tmp_path):
    path = tmp_path / "plain.duckdb"
    rec = Recorder(path)
    rec.start_run({"env": "search", "model": "tiny", "algo": "grpo"}, run_id="plain")
    tables = credit_step(1)
    tables["trajectories"]["advantage"] = [0.5, -0.5] * 4
    tables["tokens"]["advantage"] = [None] * len(tables["tokens"]["advantage"])
    rec.record_step(1, **tables)
    run_job(path, "plain")
    assert metric(path, "plain", COV) == pytest.approx({1: 4 * 0.5 / 7})
    _, paid = StepBehaviours()(1, tables)
    assert paid[COV] == pytest.approx(4 * 0.5 / 7)


# ---- 2. query reuse is across tasks -------------------------------------------------------------
RIGHT = {"t0": "capital of Osk", "t1": "who founded Varnia", "t2": "river through Telith",
         "t3": "year Brask was born"}


def converging_run(rec: Recorder, run_id: str, right: dict[str, str]) -> None:
    """4 tasks x 8 rollouts per step; at step s, 2 + s rollouts of each task search their task's
    right query (``right``) and are paid 1, the rest search words of their own (0)."""
    rec.start_run({"env": "search", "model": "tiny", "algo": "grpo"}, run_id=run_id)
    for step in range(1, 6):
        ids, tasks, hits = [], [], []
        for task in right:
            for r in range(8):
                ids.append(f"s{step}-{task}-r{r}")
                tasks.append(task)
                hits.append(r < 2 + step)
        reward = np.array(hits, dtype=float)
        adv = grpo(reward, np.array(tasks))
        trajs = {"traj_id": ids, "group_id": tasks, "task_id": tasks, "reward": reward.tolist(),
                 "advantage": adv.tolist(), "success": hits, "num_turns": [2] * 32,
                 "finish_reason": ["answered"] * 32, "split": ["train"] * 32,
                 "answer": ["x"] * 32, "golds": [["y"]] * 32}
        turns = {k: [] for k in ("traj_id", "turn", "action", "observation", "action_valid",
                                 "action_type")}
        for n, (tid, task, hit) in enumerate(zip(ids, tasks, hits)):
            # a miss's words are its own: lower-case letters (no entity) unique in the step
            query = right[task] if hit else "look " + "".join(chr(97 + int(c)) for c in f"{n:02d}")
            for k, (action, kind) in enumerate([(f"<search>{query}</search>", "search"),
                                                ("<answer>x</answer>", "answer")]):
                for col, v in zip(turns, (tid, k, action, "-", True, kind)):
                    turns[col].append(v)
        rec.record_step(step, trajectories=trajs, turns=turns)


def test_groups_converging_on_their_own_query_raise_no_alarm(tmp_path):
    path = tmp_path / "queries.duckdb"
    rec = Recorder(path)
    converging_run(rec, "own", RIGHT)
    # the same template filled with each task's entity: RAGEN's templating, which still alarms
    converging_run(rec, "template", {t: f"capital of {q.split()[-1]}" for t, q in RIGHT.items()})
    own, template = run_job(path, "own")["alarms"], run_job(path, "template")["alarms"]
    assert [s for n, s in own if n == "query_template_reuse"] == []
    assert metric(path, "own", "behaviour/query_template_reuse/rate") == {
        s: 0.0 for s in range(1, 6)}
    assert [s for n, s in template if n == "query_template_reuse"] == [3, 4, 5]


# ---- 3. what the trajectory did beats a missing declaration -------------------------------------
def test_tool_behaviours_of_traces_that_called_tools(tmp_path):
    from storage.ingest import import_file
    from tests.test_behaviours import ROOT
    store = tmp_path / "vf.duckdb"
    rep = import_file(ROOT / "tests" / "fixtures" / "verifiers" / "traces.jsonl", store)
    declared = queries.trajectories(store, rep.run_id)
    assert declared["traj_id"].size == 4      # each trace's tool list is empty: tools_offered false
    run_job(store, rep.run_id)
    import duckdb
    con = duckdb.connect(str(store), read_only=True)
    got = dict(((a, n), v) for a, n, v in con.execute(
        "SELECT t.answer, b.name, b.value FROM behaviours b JOIN trajectories t USING (run_id, "
        "traj_id) WHERE b.name IN ('no_successful_tool_call', 'answer_not_in_observations', "
        "'tool_calls', 'conflict_not_followed')").fetchall())
    con.close()
    # every rollout called add -> 5; two answered 5 (seen), two answered 6 (from no observation)
    assert got == {("5", "no_successful_tool_call"): 0.0, ("6", "no_successful_tool_call"): 0.0,
                   ("5", "tool_calls"): 1.0, ("6", "tool_calls"): 1.0,
                   ("5", "answer_not_in_observations"): 0.0,
                   ("6", "answer_not_in_observations"): 1.0}


def test_a_declaration_still_counts_where_the_trajectory_called_nothing():
    trajs = pd.DataFrame({"traj_id": ["a", "b"], "answer": ["5", "5"], "golds": [None, None],
                          "tools_offered": ["false", None], "success": [True, True]})
    turns = pd.DataFrame({"traj_id": ["a", "b"], "turn": [0, 0], "action": ["5", "5"],
                          "observation": ["", ""], "action_type": ["answer", "answer"]})
    recs = records(trajs, turns, pd.DataFrame(), tools_offered=True)
    assert [r["tools_offered"] for r in recs] == [False, True]   # declared; else the run's


# ---- 4. free-text answers and the trajectory's own grade ----------------------------------------
def inspect_like(answer: str, success, observation: str = "add -> 5") -> dict:
    return {"traj_id": "s", "answer": answer, "golds": ["5"], "success": success,
            "tools_offered": True,
            "turns": [{"turn": 0, "action": "add(x=2, y=3)", "observation": observation,
                       "action_type": "tool", "action_valid": True, "error": None},
                      {"turn": 1, "action": answer, "observation": "", "action_type": "answer",
                       "action_valid": True, "error": None}]}


def test_a_free_text_answer_graded_right_is_never_a_conflict_or_a_guess():
    right = inspect_like("The answer is 5", True)
    assert m.conflict_not_followed(right) is None
    assert m.answer_not_in_observations(right) == 0.0
    # graded right in words the observation does not hold: the gold it was graded equal to was seen
    assert m.answer_not_in_observations(inspect_like("five", True)) == 0.0
    # without a grade the stated form is read: "The answer is 5" -> "5", a gold
    assert m.conflict_not_followed(inspect_like("The answer is 5", None)) is None
    assert m.answer_not_in_observations(inspect_like("The answer is 5.", None)) == 0.0
    # a wrong answer after seeing the gold still conflicts, and a guess is still a guess
    wrong = inspect_like("The answer is 6", False)
    assert m.conflict_not_followed(wrong) == 1.0
    assert m.answer_not_in_observations(wrong) == 1.0
    assert m.answer_not_in_observations(inspect_like("The answer is 5", True, "add -> ?")) == 1.0
    assert m.answer_forms({"answer": "so \\boxed{42}."}) == ["so \\boxed{42}.", "42"]


# ---- 7. a lone surrogate in a step's rows -------------------------------------------------------
def test_a_lone_surrogate_in_an_apps_error_never_fails_the_step(tmp_path, capsys):
    """The apps env's real error text for ``raise ValueError(chr(55296))`` holds U+D800; the step
    goes through the trainer's own writer (core/run/trainer.py ``_StepWriter``) into a real
    store."""
    from types import SimpleNamespace
    from core.envs.apps.env import AppsEnv
    from core.learn.distributed import ONE
    from core.rollout.trajectory import Trajectory, Turn
    from core.run.step_rows import step_tables
    from core.run.steps import StepRecord
    from core.run.trainer import _StepWriter
    env = AppsEnv()
    task = env.tasks("train", 1, 0)[0]
    episode = env.episode(task)
    episode.reset()
    action = "<code>raise ValueError(chr(55296))</code>"
    r = episode.step(action)
    assert "\ud800" in r.error                                   # the env's own text
    turn = Turn(turn=0, action=action, observation=r.observation, valid=r.valid,
                action_type=r.action_type, parsed=r.parsed, error=r.error, info=r.info)
    trajs = [Trajectory(traj_id=f"t{i}", group_id="g", task=task, turns=[turn],
                        advantage=float(i % 2)) for i in range(4)]
    # the raw rows (before cleaning) make the behaviours step raise inside: it says so, no more
    raw = {"trajectories": {"traj_id": ["t0"], "split": ["train"], "answer": [None]},
           "turns": {"traj_id": ["t0"], "turn": [0], "action": [action],
                     "observation": ["x"], "error": [r.error], "parsed": [None]}}
    assert StepBehaviours()(1, raw) == ({}, {})
    assert "behaviours, step 1: UnicodeEncodeError" in capsys.readouterr().err
    # the trainer's rows are cleaned before any consumer: U+FFFD, as the recorder stores it
    tables = step_tables(trajs)
    assert tables["turns"]["error"][0] == r.error.replace("\ud800", "\ufffd")
    path = tmp_path / "apps.duckdb"
    rec = Recorder(path)
    run_id = rec.start_run({"env": "apps", "model": "tiny", "algo": "grpo"})
    writer = _StepWriter(SimpleNamespace(ranks=ONE), rec)
    metrics = writer(1, StepRecord(trajs=trajs, work_s=0.1))
    assert metrics["behaviour/tool_calls/rate"] == 1.0           # the behaviours were measured
    stored = queries.turns(path, run_id, ["t0"])
    assert stored["error"].iloc[0] == r.error.replace("\ud800", "\ufffd")
    import duckdb
    con = duckdb.connect(str(path), read_only=True)
    assert con.execute("SELECT count(*) FROM behaviours WHERE run_id = ?",
                       [run_id]).fetchone()[0] > 0
    con.close()


def test_a_steps_contributors_rank_by_the_applied_advantage(tmp_path):
    """Dynamics' ranking of a step's trajectories takes the same A as the job."""
    path = tmp_path / "credit.duckdb"
    rec = Recorder(path)
    rec.start_run({"env": "search", "model": "tiny", "algo": "gigpo"}, run_id="credit")
    rec.record_step(1, **credit_step(1))
    run_job(path, "credit")
    top = queries.behaviour_contributors(path, "credit", 1, "no_successful_tool_call", 8)
    # the episode advantage is 0: A is each trajectory's tokens' +1 (shallow, even) or -1
    assert top.set_index("traj_id")["advantage"].to_dict() == {
        f"s1-r{i}": 1.0 if i % 2 == 0 else -1.0 for i in range(8)}
    assert top["contribution"].sum() / 7 == pytest.approx(metric(path, "credit", COV)[1])


def test_the_job_keeps_a_stores_schema(tmp_path):
    """A committed store stays at the schema it was recorded with when the job reruns on it."""
    import duckdb
    from storage.migrations import MIGRATIONS, current_version, migrate
    path = tmp_path / "v9.duckdb"
    con = duckdb.connect(str(path))
    migrate(con)
    con.execute("DELETE FROM _migrations WHERE version > 9")
    con.execute("ALTER TABLE tokens DROP COLUMN rejected")
    con.close()
    con = duckdb.connect(str(path))  # rows as a schema-9 trainer wrote them
    tables = credit_step(1)
    con.execute("INSERT INTO runs (run_id, name, status) VALUES ('r', 'r', 'finished')")
    for name in ("trajectories", "turns", "tokens"):
        frame = pd.DataFrame(tables[name])
        con.register("_f", frame)
        con.execute(f"INSERT INTO {name} BY NAME SELECT *, 'r' AS run_id, 1 AS step FROM _f")
        con.unregister("_f")
    con.close()
    assert run_job(path, "r")["rows"] > 0
    con = duckdb.connect(str(path), read_only=True)
    assert current_version(con) == 9 < len(MIGRATIONS)
    con.close()


from tests.test_pages import app, demo  # noqa: E402,F401  (fixtures)


def test_dynamics_says_which_advantage_it_reads(app, tmp_path):
    store = tmp_path / "stores" / "credit.duckdb"
    store.parent.mkdir()
    rec = Recorder(store)
    rec.start_run({"env": "search", "model": "tiny", "algo": "gigpo"}, run_id="credit")
    for step in (1, 2):
        rec.record_step(step, **credit_step(step))
    run_job(store, "credit")
    at = app("dynamics", store_dir=str(store.parent), store=str(store), run="credit")
    assert not at.exception, at.exception
    captions = " ".join(c.value for c in at.caption)
    assert "A is the advantage the loss applied" in captions
    ranked = next(f.value for f in at.dataframe if "contribution" in f.value.columns)
    assert set(ranked["advantage"]) == {1.0, -1.0}               # the tokens', not the episode's 0
