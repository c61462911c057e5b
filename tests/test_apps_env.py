"""The apps environment: world, endpoints, tasks, unit-test grading, state diffs, the expert."""
import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from core.envs.apps.env import MAX_OBS_CHARS, AppsEnv, tool_text
from core.envs.apps.api import ENDPOINTS, TYPES
from core.envs.apps.tasks import COLLATERAL_TEST, TEMPLATES
from core.envs.base import REGISTRY, make_env
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def env():
    return make_env("apps")


@pytest.fixture(scope="module")
def tasks(env):
    """Every template at least 3 times per split, from two task seeds."""
    n = 3 * len(TEMPLATES)
    return {split: env.tasks(split, n, seed=0) + env.tasks(split, len(TEMPLATES), seed=1)
            for split in ("train", "heldout")}


def first(tasks, template, split="train"):
    return next(t for t in tasks[split] if t.meta["template"] == template)


def run_expert(env, task, max_turns=25):
    ep = env.episode(task, 0)
    ep.reset()
    results = []
    for _ in range(max_turns):
        results.append(ep.step(ep.expert_action()))
        if results[-1].done:
            break
    return ep, results


def tool(ep, name, **arguments):
    return ep.step(tool_text(name, arguments))


def payload(result):
    """The JSON inside a step's <observation> wrapper."""
    text = result.observation
    assert text.startswith("\n<observation>") and text.endswith("</observation>\n")
    return json.loads(text[len("\n<observation>"):-len("</observation>\n")])


# ---- registration, splits, determinism -----------------------------------------------------------
def test_registered_with_protocol_attributes(env):
    assert "apps" in REGISTRY and isinstance(env, AppsEnv)
    assert env.stop_tags == ("</tool>", "</code>", "</answer>")
    assert "<tool>" in env.system_prompt and "apis.show_docs" in env.system_prompt


def test_at_least_ten_templates_of_each_kind():
    assert len(TEMPLATES) >= 10
    kinds = [t.kind for t in TEMPLATES.values()]
    assert kinds.count("conditional") >= 3 and kinds.count("answer") >= 3


def test_splits_share_no_task_and_tasks_are_deterministic(env, tasks):
    train, held = tasks["train"], tasks["heldout"]
    assert not {t.task_id for t in train} & {t.task_id for t in held}
    assert not {t.meta["world_seed"] for t in train} & {t.meta["world_seed"] for t in held}
    assert {t.meta["template"] for t in train} == set(TEMPLATES) == {t.meta["template"] for t in held}
    again = env.tasks("train", len(train) - len(TEMPLATES), seed=0)
    assert [(t.task_id, t.prompt, t.golds) for t in again] == \
        [(t.task_id, t.prompt, t.golds) for t in train[:len(again)]]
    assert len({t.task_id for t in train}) == len(train)


def test_user_message_has_instruction_clock_apps_and_docs_hint(env, tasks):
    task = first(tasks, "paid_total")
    text = env.episode(task, 0).reset()
    assert text == task.prompt and "How much money did I send" in text
    assert "Now: " in text and "apis.show_docs" in text
    for app in ("contacts", "calendar", "email", "notes", "todo", "wallet"):
        assert app in text


def test_same_task_same_world_and_same_expert_trajectory(env, tasks):
    task = first(tasks, "reschedule_event")
    a, ra = run_expert(env, task)
    b, rb = run_expert(env, task)
    assert a.initial == b.initial
    assert [r.observation for r in ra] == [r.observation for r in rb]
    assert a.world.store.snapshot() == b.world.store.snapshot()


# ---- grading --------------------------------------------------------------------------------------
def test_expert_solves_every_task_of_both_splits(env, tasks):
    for split in ("train", "heldout"):
        for task in tasks[split]:
            ep, results = run_expert(env, task)
            out = ep.outcome()
            assert results[-1].done and out.success, (task.task_id, out.tests)
            assert out.score == 1.0 and out.process == 1.0 and not out.info["collateral"]
            assert all(r.valid and r.error is None for r in results), task.task_id
            # the expert reads an app's docs before first using it
            assert out.info["doc_lookups"] >= 1 and out.info["errors"] == 0


def test_doing_nothing_fails_every_task(env, tasks):
    for task in tasks["train"] + tasks["heldout"]:
        ep = env.episode(task, 0)
        ep.reset()
        assert ep.step("<answer></answer>").done
        out = ep.outcome()
        assert not out.success and out.score < 1.0 and out.process == 0.0, task.task_id
        assert dict((n, ok) for n, ok, _ in out.tests)[COLLATERAL_TEST]  # nothing was damaged
        assert out.info["num_tests"] == len(out.tests) >= 2


def test_right_actions_plus_an_unrelated_deletion_fail_the_collateral_test(env, tasks):
    for template in ("dinner_check", "split_bill", "paid_total"):
        task = first(tasks, template)
        ep = env.episode(task, 0)
        ep.reset()
        note_id = min(ep.world.store.snapshot()["notes"])  # no task touches notes here
        deleted = tool(ep, "notes.delete_note", note_id=note_id)
        assert deleted.error is None
        while not ep.step(ep.expert_action()).done:
            pass
        out = ep.outcome()
        result = {n: ok for n, ok, _ in out.tests}
        assert not out.success and not result[COLLATERAL_TEST] and out.info["collateral"]
        assert all(ok for n, ok in result.items() if n != COLLATERAL_TEST)
        assert out.score == pytest.approx((len(out.tests) - 1) / len(out.tests))
        assert f"delete notes#{note_id}" in dict((n, d) for n, _, d in out.tests)[COLLATERAL_TEST]


def test_marking_a_mail_read_is_collateral_but_reading_it_is_not(env, tasks):
    task = first(tasks, "unread_count")
    ep = env.episode(task, 0)
    ep.reset()
    unread = [k for k, m in ep.initial["emails"].items() if not m["is_read"]][0]
    assert tool(ep, "email.show_email", email_id=unread).state_diff is None
    assert ep.world.store.snapshot() == ep.initial
    tool(ep, "email.mark_read", email_id=unread)
    ep.step(f"<answer>{task.golds[0]}</answer>")
    tests = {n: ok for n, ok, _ in ep.outcome().tests}
    assert tests["answer_matches"] and not tests[COLLATERAL_TEST]


def test_conditional_template_grades_each_branch(env, tasks):
    """dinner_check: a busy afternoon needs the count and no mail; a free one needs both writes."""
    busy = [t for t in tasks["train"] + tasks["heldout"]
            if t.meta["template"] == "dinner_check" and t.meta["params"]["count"]]
    free = [t for t in env.tasks("train", 120, seed=5)
            if t.meta["template"] == "dinner_check" and not t.meta["params"]["count"]]
    assert busy and free
    ep = env.episode(free[0], 0)
    ep.reset()
    ep.step("<answer>0</answer>")
    names = {n: ok for n, ok, _ in ep.outcome().tests}
    assert not names["dinner_event_created"] and "answer_matches" not in names
    ep = env.episode(busy[0], 0)
    ep.reset()
    p = busy[0].meta["params"]
    tool(ep, "email.send_email", to=[p["email"]], subject="Dinner?", body="Still on?")
    ep.step(f"<answer>{p['count']}</answer>")
    names = {n: ok for n, ok, _ in ep.outcome().tests}
    assert names["answer_matches"] and not names[COLLATERAL_TEST]


def test_money_answers_accept_both_spellings(env, tasks):
    task = first(tasks, "paid_total")
    cents = task.meta["params"]["total_cents"]
    for text in (f"{cents / 100:.2f}", f"${cents / 100:.2f}"):
        ep = env.episode(task, 0)
        ep.reset()
        ep.step(f"<answer>{text}</answer>")
        assert ep.outcome().success, text


# ---- actions, errors, docs, diffs -----------------------------------------------------------------
@pytest.fixture()
def episode(env, tasks):
    ep = env.episode(first(tasks, "add_contact"), 0)
    ep.reset()
    return ep


@pytest.mark.parametrize("text", ["no tags at all", "<tool>{not json}</tool>",
                                  '<tool>["calendar.search_events"]</tool>',
                                  '<tool>{"arguments": {}}</tool>', "<tool>{}</tool>"])
def test_unparseable_actions_are_invalid_format(episode, text):
    r = episode.step(text)
    assert not r.valid and not r.done and r.error
    assert "error" in payload(r)
    assert episode.world.store.snapshot() == episode.initial


@pytest.mark.parametrize("name, arguments, message", [
    ("calendar.no_such_thing", {}, "unknown endpoint"),
    ("nope", {}, "unknown endpoint"),
    ("contacts.show_contact", {}, "missing required argument 'contact_id'"),
    ("contacts.show_contact", {"contact_id": "3"}, "must be integer"),
    ("contacts.show_contact", {"contact_id": True}, "must be integer"),
    ("contacts.show_contact", {"contact_id": 99999}, "no contact with id 99999"),
    ("contacts.search_contacts", {"qery": "x"}, "unknown argument 'qery'"),
    ("email.send_email", {"to": "a@b.test", "subject": "s", "body": "b"}, "array of strings"),
    ("email.send_email", {"to": ["not an address"], "subject": "s", "body": "b"}, "not an email"),
    ("calendar.create_event", {"title": "x", "start": "tomorrow", "end": "later"}, "YYYY-MM-DD"),
    ("wallet.send_money", {"to_email": "a@b.test", "amount": -5, "description": "x"}, "positive"),
    ("wallet.send_money", {"to_email": "a@b.test", "amount": 10 ** 7, "description": "x"},
     "insufficient balance"),
])
def test_bad_calls_are_valid_actions_with_a_clear_error(episode, name, arguments, message):
    r = tool(episode, name, **arguments)
    assert r.valid and not r.done and r.error and message in r.error
    assert message in payload(r)["error"]
    assert r.state_diff is None and episode.world.store.snapshot() == episode.initial


def test_arguments_that_are_not_an_object_are_an_error(episode):
    r = episode.step('<tool>{"name": "contacts.search_contacts", "arguments": [1]}</tool>')
    assert r.valid and "must be a JSON object" in r.error


def test_every_endpoint_is_documented(episode):
    assert len(ENDPOINTS) >= 30
    for ep in ENDPOINTS.values():
        assert ep.description and ep.returns
        for p in ep.params:
            assert p.type in TYPES and p.description and isinstance(p.required, bool)
    r = tool(episode, "apis.show_docs")
    apps = {a["app"] for a in payload(r)}
    assert {"contacts", "calendar", "email", "notes", "todo", "wallet"} <= apps
    r = tool(episode, "apis.show_docs", app="email")
    listing = payload(r)
    assert r.action_type == "docs" and any(s.startswith("email.send_email(to, subject, body)")
                                           for s in listing)
    r = tool(episode, "apis.show_docs", endpoint="email.send_email")
    doc = payload(r)
    assert doc["name"] == "email.send_email"
    assert {"name": "to", "type": "array", "required": True,
            "description": "Recipient emails."} in doc["parameters"]
    assert "unknown endpoint" in tool(episode, "apis.show_docs", endpoint="email.fly").error
    assert episode.outcome().info["doc_lookups"] == 4


def test_a_mutating_call_records_its_state_diff(episode):
    sent = tool(episode, "email.send_email", to=["x.y@mail.test"], subject="Hi", body="Hello")
    [entry] = sent.state_diff
    assert entry["table"] == "emails" and entry["op"] == "insert" and entry["before"] is None
    assert entry["after"]["recipients"] == ["x.y@mail.test"] and entry["after"]["folder"] == "sent"
    cid = min(episode.initial["contacts"])
    changed = tool(episode, "contacts.update_contact", contact_id=cid, phone="555-000-0000")
    [entry] = changed.state_diff
    assert (entry["op"], entry["key"]) == ("update", cid)
    assert entry["before"]["phone"] != "555-000-0000" == entry["after"]["phone"]
    gone = tool(episode, "contacts.delete_contact", contact_id=cid)
    assert gone.state_diff[0]["op"] == "delete" and gone.state_diff[0]["after"] is None
    assert tool(episode, "contacts.search_contacts", query="a").state_diff is None
    json.dumps([sent.state_diff, changed.state_diff, gone.state_diff])  # replayable as JSON


def test_long_observations_are_shortened_with_a_note(episode):
    r = tool(episode, "email.search_emails", limit=20)
    body = r.observation[len("\n<observation>"):-len("</observation>\n")]
    assert len(body) <= MAX_OBS_CHARS + 80
    assert "more not shown" in body or len(json.loads(body)) <= 20


def test_answer_ends_the_episode_and_later_steps_are_refused(episode):
    r = episode.step("I am sure. <answer> done </answer> trailing")
    assert r.done and r.action_type == "answer" and episode.outcome().answer == "done"
    with pytest.raises(RuntimeError):
        episode.step("<answer>again</answer>")


def test_expert_takes_over_a_partial_trajectory(env, tasks):
    task = first(tasks, "split_bill")
    ep = env.episode(task, 0)
    ep.reset()
    p = task.meta["params"]
    tool(ep, "apis.show_docs", app="wallet")
    tool(ep, "wallet.request_money", from_email=p["a_email"], amount=p["share_cents"] / 100,
         description=p["reason"])
    while not ep.step(ep.expert_action()).done:
        pass
    assert ep.outcome().success  # it did not request A's share a second time


# ---- the <code> action ----------------------------------------------------------------------------
def test_code_gives_the_same_database_as_the_same_tool_calls(env, tasks):
    task = first(tasks, "reschedule_event")
    p = task.meta["params"]
    calls = env.episode(task, 0).template.plan(p)[0]
    by_tool = env.episode(task, 0)
    by_tool.reset()
    tool_diffs = []
    for call in calls:
        tool_diffs += tool(by_tool, call.name, **call.arguments).state_diff or []
    by_code = env.episode(task, 0)
    by_code.reset()
    script = "\n".join(f"r = apis.{c.name}(**{c.arguments!r})\n"
                       "print('list' if isinstance(r, list) else 'dict')"
                       for c in calls) + "\nprint(apis.show_docs(app='todo')[0])"
    r = by_code.step(f"<code>{script}</code>")
    assert r.valid and r.error is None and r.action_type == "code"
    assert payload(r)["output"].startswith("list\ndict\ndict\n")
    assert r.parsed["api_calls"] == len(calls) + 1 and r.state_diff == tool_diffs
    assert by_code.world.store.snapshot() == by_tool.world.store.snapshot()
    by_code.step("<answer>done</answer>")
    assert by_code.outcome().success


def test_code_sees_api_errors_as_exceptions_it_can_catch(episode):
    r = episode.step("<code>try:\n    apis.contacts.show_contact(contact_id=-1)\n"
                     "except ApiError as e:\n    print('caught', e)\n"
                     "apis.contacts.show_contact(contact_id='x')</code>")
    out = payload(r)
    assert "caught no contact with id -1" in out["output"]
    assert "ApiError (line 5)" in out["error"] and "must be integer" in out["error"]
    assert r.valid and episode.outcome().info["errors"] == 2 + 1  # two API errors + the code's


def test_code_with_a_syntax_error_is_invalid(episode):
    r = episode.step("<code>print(</code>")
    assert not r.valid and "SyntaxError" in r.error


def test_environments_do_not_import_torch():
    code = "import sys, core.envs.apps.env; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# ---- property: no text and no arguments crash the environment -------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**12) | st.floats(allow_nan=False)
    | st.text(max_size=30), lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=10), inner, max_size=3), max_leaves=8)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(ENDPOINTS)), arguments=st.dictionaries(
    st.sampled_from(["query", "limit", "email_id", "contact_id", "to", "amount", "start", "end",
                     "title", "body", "subject", "event_id", "todo_id", "x"]), json_values,
    max_size=4))
def test_any_json_arguments_give_a_result_or_a_clear_error(episode, name, arguments):
    if episode.done:
        episode.reset()
    before = len(episode.world.store.log)
    r = tool(episode, name, **arguments)
    assert r.valid and not r.done
    assert r.error is None or "internal error" not in r.error, r.error
    if r.error is not None:  # a failed call changes nothing
        assert len(episode.world.store.log) == before


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.sampled_from(list('<>/{}":, toolanswercde') + ["\ud800", "é"]),
                    max_size=60))
def test_any_action_text_gives_a_step_result(episode, text):
    if episode.done:
        episode.reset()
    r = episode.step(text)
    assert isinstance(r.observation, str) and isinstance(r.valid, bool)


def test_text_that_is_not_valid_unicode_is_a_clear_error(episode):
    r = episode.step('<tool>{"name": "email.send_email", "arguments": {"to": ["a@b.test"], '
                     '"subject": "\\ud800", "body": "x"}}</tool>')
    assert r.valid and "not valid Unicode" in r.error
    r.observation.encode("utf-8")  # the observation itself is valid UTF-8
