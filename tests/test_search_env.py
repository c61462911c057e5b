import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from core.envs.base import REGISTRY, make_env
from core.envs.search.env import (INVALID_FEEDBACK, SearchEnv, contains_answer, format_information,
                              parse_action)
from core.envs.search.world import RELATIONS, Doc, generate_world
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def env():
    return make_env("search")


def run_expert(env, task, max_turns=6):
    ep = env.episode(task, 0)
    ep.reset()
    for _ in range(max_turns):
        if ep.step(ep.expert_action()).done:
            break
    return ep


# ---- protocol parsing --------------------------------------------------------------------------
@pytest.mark.parametrize("text, parsed", [
    ("<think>hmm</think>\n<search> capital of Osk </search>", ("search", "capital of Osk")),
    ("<answer>Varno</answer>", ("answer", "Varno")),
    ("<answer>two\nlines</answer>", ("answer", "two\nlines")),
    # the first action counts; text after its closing tag is not part of it
    ("<search>a</search><answer>b</answer>", ("search", "a")),
    ("<answer>b</answer> trailing <search>a</search>", ("answer", "b")),
    # nested: the outer search runs up to its own closing tag
    ("<search>x <answer>y</answer></search>", ("search", "x <answer>y</answer>")),
    # unbalanced: a mismatched closing tag is not an action; a later well-formed one is
    ("<search>x</answer> <answer>z</answer>", ("answer", "z")),
    ("<search></search>", ("search", "")),
    ("<search>x</answer>", None),
    ("<answer>never closed", None),
    ("<think>only thinking</think>", None),
    ("<SEARCH>x</SEARCH>", None),
    ("", None),
    (None, None),
])
def test_parse_action(text, parsed):
    assert parse_action(text) == parsed


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("<>/searchnwt xy\n")) | st.characters(), max_size=60))
def test_parse_action_never_raises(text):
    parsed = parse_action(text)
    assert parsed is None or (parsed[0] in ("search", "answer") and isinstance(parsed[1], str))


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80))
def test_step_never_raises_on_arbitrary_text(env, text):
    ep = env.episode(env.tasks("train", 1, 0)[0], 0)
    ep.reset()
    result = ep.step(text)
    assert isinstance(result.observation, str) and result.valid in (True, False)
    assert 0.0 <= ep.outcome().score <= 1.0


def test_information_format_is_search_r1s():
    docs = [Doc("city/a", "Alpha", "Alpha is a city in Osk."), Doc("city/b", "Beta", "Beta text.")]
    assert format_information(docs) == ("\n\n<information>Doc 1(Title: Alpha) Alpha is a city in "
                                        "Osk.\nDoc 2(Title: Beta) Beta text.</information>\n\n")
    assert format_information([]) == ("\n\n<information>No document matches the query."
                                      "</information>\n\n")


# ---- episodes ----------------------------------------------------------------------------------
def test_search_answer_and_outcome(env):
    task = SearchEnv(templates="capital").tasks("train", 1, 0)[0]
    ep = env.episode(task, 0)
    assert ep.reset() == task.prompt and task.meta["question"] in task.prompt
    subject, gold = task.meta["subject"], task.golds[0]
    res = ep.step(f"<think>look it up</think>\n<search>capital of {subject}</search>")
    assert res.valid and not res.done and res.action_type == "search"
    assert res.observation.startswith("\n\n<information>Doc 1(Title: ")
    assert res.observation.endswith("</information>\n\n")
    assert res.parsed["doc_ids"][0] == task.meta["supporting_docs"][0]
    res = ep.step(f"<answer> the {gold.upper()}! </answer>")
    assert res.done and res.valid and res.action_type == "answer" and res.observation == ""
    out = ep.outcome()
    assert (out.score, out.success, out.process) == (1.0, True, 1.0)
    assert out.info == {"retrieved_gold": True, "searches": 1, "hops": 1}
    with pytest.raises(RuntimeError, match="over"):
        ep.step("<answer>again</answer>")


def test_invalid_actions_get_search_r1_feedback(env):
    ep = env.episode(env.tasks("train", 1, 0)[0], 0)
    ep.reset()
    res = ep.step("I think the answer is Varno.")
    assert (res.valid, res.done, res.action_type) == (False, False, "invalid")
    assert res.observation == INVALID_FEEDBACK
    assert "My previous action is invalid." in res.observation
    empty = ep.step("<search>   </search>")
    assert (empty.valid, empty.action_type, empty.error) == (False, "search", "empty search query")
    assert ep.outcome().info["searches"] == 0


def test_answer_without_search_gets_no_process_credit(env):
    task = env.tasks("heldout", 1, 3)[0]
    ep = env.episode(task, 0)
    ep.reset()
    ep.step(f"<answer>{task.golds[0]}</answer>")
    out = ep.outcome()
    assert out.success and out.process == 0.0 and out.info["retrieved_gold"] is False
    wrong = env.episode(task, 0)
    wrong.reset()
    wrong.step("<answer>Nowhere</answer>")
    assert (wrong.outcome().score, wrong.outcome().success) == (0.0, False)
    unanswered = env.episode(task, 0)
    unanswered.reset()
    assert unanswered.outcome().answer is None and unanswered.outcome().score == 0.0


def test_f1_outcome_metric():
    env = SearchEnv(outcome_metric="f1", templates="river")
    task = env.tasks("train", 1, 0)[0]
    ep = env.episode(task, 0)
    ep.reset()
    ep.step(f"<answer>the great {task.golds[0]}</answer>")  # 'great X river' vs 'X river'
    out = ep.outcome()
    assert out.score == pytest.approx(0.8) and not out.success


@pytest.mark.parametrize("k", [1, 3, 5])
def test_topk(k):
    env = SearchEnv(topk=k)
    ep = env.episode(env.tasks("train", 1, 0)[0], 0)
    ep.reset()
    res = ep.step("<search>capital founded river</search>")
    assert res.observation.count("(Title: ") == k == len(res.parsed["doc_ids"])
    assert f"Doc {k}(Title: " in res.observation and f"Doc {k + 1}(" not in res.observation


def test_query_of_unknown_words_returns_no_documents(env):
    ep = env.episode(env.tasks("train", 1, 0)[0], 0)
    ep.reset()
    res = ep.step("<search>qqqxz zzyq</search>")
    assert res.valid and "No document matches" in res.observation and res.parsed["doc_ids"] == []


def test_contains_answer_uses_whole_words():
    assert contains_answer("Varno was founded in 1243.", ["1243"])
    assert not contains_answer("Varno was founded in 1243.", ["124"])
    assert contains_answer("The Lenna River flows", ["lenna river"])


# ---- tasks, splits, determinism ----------------------------------------------------------------
def test_world_is_deterministic_and_seeded():
    a, b, c = generate_world(7, n_countries=20), generate_world(7, n_countries=20), \
        generate_world(8, n_countries=20)
    assert a.docs == b.docs and a.facts == b.facts
    assert a.docs != c.docs
    names = list(a.kind)
    assert len(names) == len(set(names)) and len(a.docs) == len(names)
    assert all(d.title and d.text for d in a.docs)


def test_default_world_size(env):
    kinds = [d.doc_id.split("/")[0] for d in env.world.docs]
    assert 3000 <= len(kinds) <= 20000
    assert {"country", "city", "company", "person"} == set(kinds)


def test_tasks_deterministic_and_mixed(env):
    a, b = env.tasks("train", 40, 5), env.tasks("train", 40, 5)
    assert [t.task_id for t in a] == [t.task_id for t in b]
    assert [t.task_id for t in a] != [t.task_id for t in env.tasks("train", 40, 6)]
    assert len({t.task_id for t in a}) == 40
    assert sum(t.meta["hops"] == 2 for t in a) == 20
    three_quarters = SearchEnv(two_hop_frac=0.75).tasks("heldout", 40, 0)
    assert sum(t.meta["hops"] == 2 for t in three_quarters) == 30
    assert all(t.split == "heldout" for t in three_quarters)


def test_train_and_heldout_share_no_task_or_entity(env):
    train, held = env.tasks("train", 400, 0), env.tasks("heldout", 400, 0)
    assert not {t.task_id for t in train} & {t.task_id for t in held}
    assert not {t.meta["question"] for t in train} & {t.meta["question"] for t in held}

    def entities(tasks):
        return {e for t in tasks for _, s, o in t.meta["chain"] for e in (s, o) if not o.isdigit()}
    assert not entities(train) & entities(held)
    pools = env.pools()
    homes = {split: {env.world.home[s] for subjects in pools[split].values() for s in subjects}
             for split in pools}
    assert not homes["train"] & homes["heldout"] and homes["heldout"]


def test_template_option_restricts_questions():
    env = SearchEnv(templates="capital,capital>city_founded")
    tasks = env.tasks("train", 10, 0)
    assert {t.meta["template"] for t in tasks} == {"capital", "capital>city_founded"}
    two_hop = next(t for t in tasks if t.meta["hops"] == 2)
    assert two_hop.meta["question"].startswith("In what year was the capital of ")


@pytest.mark.parametrize("kwargs, message", [
    ({"topk": 0}, "topk"), ({"two_hop_frac": 1.5}, "two_hop_frac"),
    ({"outcome_metric": "bleu"}, "outcome_metric"), ({"templates": "capitol"}, "capitol"),
])
def test_bad_options_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SearchEnv(**kwargs)


def test_bad_task_requests_are_refused(env):
    with pytest.raises(ValueError, match="split"):
        env.tasks("test", 1, 0)
    with pytest.raises(ValueError, match="only"):
        SearchEnv(templates="capital", two_hop_frac=0.0).tasks("heldout", 10_000, 0)


# ---- the scripted expert -----------------------------------------------------------------------
@pytest.mark.parametrize("split", ["train", "heldout"])
def test_expert_solves_every_task(env, split):
    for task in env.tasks(split, 300, 11):
        ep = run_expert(env, task)
        out = ep.outcome()
        assert out.success and out.process == 1.0, (task.task_id, ep.queries)
        # one search per hop, each finding its supporting document first and its fact in it
        assert out.info["searches"] == task.meta["hops"]
        for query, doc_id, (rel, subj, obj) in zip(ep.queries, task.meta["supporting_docs"],
                                                    task.meta["chain"]):
            docs = env.retriever.search(query, env.topk)
            assert docs[0].doc_id == doc_id
            assert RELATIONS[rel].sentence.format(s=subj, o=obj) in docs[0].text


def test_expert_queries_are_short_and_read_the_bridge_from_evidence(env):
    task = next(t for t in env.tasks("train", 50, 2) if t.meta["template"] == "capital>city_founded")
    ep = env.episode(task, 0)
    ep.reset()
    first = ep.expert_action()
    country = task.meta["subject"]
    assert first.endswith(f"<search>capital of {country}</search>") and first.startswith("<think>")
    ep.step(first)
    capital = task.meta["chain"][0][2]
    second = ep.expert_action()
    assert f"The capital of {country} is {capital}." in second
    assert second.endswith(f"<search>{capital} founded</search>")
    ep.step(second)
    assert ep.expert_action().endswith(f"<answer>{task.golds[0]}</answer>")


def test_expert_takes_over_a_partial_trajectory(env):
    task = next(t for t in env.tasks("train", 50, 4) if t.meta["hops"] == 2)
    ep = env.episode(task, 0)
    ep.reset()
    ep.step("<search>something unrelated</search>")
    ep.step("no action here")
    for _ in range(4):
        if ep.step(ep.expert_action()).done:
            break
    assert ep.outcome().success


def test_registered_and_torch_free():
    assert "search" in REGISTRY and make_env("search", topk=2, seed=3).topk == 2
    code = "import sys, core.envs.search.env, core.credit.rewards; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_expert_refuses_a_task_from_elsewhere(env):
    from core.envs.base import Task
    ep = env.episode(Task(task_id="x", prompt="Question: What is 2+2?", golds=("4",)), 0)
    ep.reset()
    assert ep.step("<answer>4</answer>").done and ep.outcome().success
    other = env.episode(Task(task_id="y", prompt="Question: ?", golds=("4",)), 0)
    other.reset()
    with pytest.raises(ValueError, match="not made by this world"):
        other.expert_action()


def test_the_retriever_keeps_jax_off_the_gpu_unless_the_user_chose():
    """bm25s imports JAX (when installed) and runs an op at import; on a GPU machine JAX would
    then take 75% of the GPU's memory in each training process. The retriever makes JAX's
    platform the CPU before bm25s is first imported, and leaves a user's own choice alone."""
    code = ("import os; from core.envs.search.world import generate_world; "
            "from core.envs.search.env import Retriever; Retriever(generate_world(0).docs[:50]); "
            "print(os.environ.get('JAX_PLATFORMS'))")
    root = ROOT
    import os
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cpu"
    env["JAX_PLATFORMS"] = "cuda"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == "cuda", out.stderr
