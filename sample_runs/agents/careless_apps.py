"""A rule-based apps-world agent that is sometimes careless, writing the generic JSONL format.

It stands for "some other agent" that knows what to do but now and then does it sloppily. Each
episode it follows the scripted expert's plan for the task (``Template.plan``: the API calls
the task needs, each app's docs read before its first call) — and on a share of episodes
(``--slip-rate``) it makes the one slip its template invites, the way a hurried person would:

  every_match        acts on every item a search returned, not only the ones asked for
                     (archives unread newsletters too, completes todos not yet due)
  marks_read         marks each unread mail read while counting them
  ignores_condition  does the "if" branch without checking the condition (pays a request over
                     the limit, chases a request already paid, books dinner on a busy afternoon)
  skips_a_write      leaves out one of the writes (one person's payment request, one attendee's
                     mail)
  wrong_record       replies to the oldest mail of the thread instead of the newest
  skips_reading      saves the search result's preview instead of opening the mail
  stale_read         reads the balance before paying and reports that

Slips that need to see data (every_match, marks_read, wrong_record, skips_reading, stale_read)
read it from the observations the environment returned, as any agent would. The agent plays the
real environment (core/envs/apps/), whose unit tests on the final database grade every
episode, so a slip shows up the way the env reports it: a failed ``no_collateral_damage`` test
for unrequested changes, a failed state test for a missing or wrong write, or nothing at all
when the slip happened not to matter (the afternoon was free). Templates with no slip here
(add_contact, update_contact_email, paid_total, next_event_location, count_events) are always
done as the expert does them.

    python sample_runs/agents/careless_apps.py --out FILE.jsonl [--tasks 16] [--rollouts 2]
        [--steps 2] [--slip-rate 0.5] [--seed 0]

Each "step" plays a fresh batch of train tasks, ``--rollouts`` episodes per task (one group);
whether an episode slips is drawn per episode, so a group's rewards can differ. Each line keeps
the turns' API calls, errors and state diffs, the unit tests (``tests``) and the outcome's info
(``collateral``, ...), so the importer classifies failures as it does for a trainer's run.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the checkout

from core.envs.apps.env import tool_text  # noqa: E402  (environments are torch-free)
from core.envs.apps.tasks import TEMPLATES, Call  # noqa: E402
from core.envs.base import make_env  # noqa: E402

OBSERVATION = re.compile(r"<observation>(.*)</observation>", re.DOTALL)


@dataclass
class FromResult:
    """Calls decided from what the previous call returned (None when it failed or was cut)."""
    make: Callable[[Any], list[Call]]


def for_each(make: Callable[[dict], Call]) -> FromResult:
    """One call per item of the previous call's list result."""
    return FromResult(lambda result: [make(item) for item in result or []
                                      if isinstance(item, dict)])


Answer = str | Callable[[list[Any]], str]
"""The final answer, or a function of every call's result so far (in order)."""


# ---- the slips, one per template ----------------------------------------------------------------
def every_match_mail(tpl, p):
    calls, answer = tpl.plan(p)
    return [calls[0], for_each(lambda m: Call("email.archive_email", {"email_id": m["id"]}))], \
        answer


def every_match_todo(tpl, p):
    _, answer = tpl.plan(p)
    listing = Call("todo.list_todos", {"list_name": p["list_name"], "completed": False,
                                       "limit": 20})  # forgot the due_before filter
    return [listing, for_each(lambda t: Call("todo.complete_todo", {"todo_id": t["id"]}))], answer


def marks_read(tpl, p):
    calls, answer = tpl.plan(p)
    return calls + [for_each(lambda m: Call("email.mark_read", {"email_id": m["id"]}))], answer


def ignores_condition(**branch):
    """The plan of the branch the task makes conditional, without the check that picks it."""
    def slip(tpl, p):
        calls, answer = tpl.plan({**p, **branch})
        if tpl.name == "dinner_check":  # the check is the calendar search: skipped
            calls = calls[1:]
        return calls, answer
    return slip


def skips_last_write(tpl, p):
    calls, answer = tpl.plan(p)
    return calls[:-1], answer


def notifies_first_attendee(tpl, p):
    calls, answer = tpl.plan(p)
    mail = calls[-1]
    return calls[:-1] + [Call(mail.name, {**mail.arguments, "to": mail.arguments["to"][:1]})], \
        answer


def wrong_record(tpl, p):
    calls, answer = tpl.plan(p)
    text = calls[-1].arguments["body"]
    oldest = FromResult(lambda mails: [Call("email.reply_to_email", {
        "email_id": mails[-1]["id"], "body": text})] if mails else [])
    return calls[:-1] + [oldest], answer


def skips_reading(tpl, p):
    calls, answer = tpl.plan(p)
    search, note = calls[0], calls[-1]
    from_preview = FromResult(lambda mails: [Call(note.name, {
        **note.arguments, "body": mails[0]["preview"]})] if mails else [])
    return [search, from_preview], answer


def stale_read(tpl, p):
    calls, _ = tpl.plan(p)
    lookup, pay, balance = calls
    def answer(results):  # the balance shown before the payment went out
        shown = [r for r in results if isinstance(r, dict) and "balance" in r]
        return f"{shown[0]['balance']:.2f}" if shown else "unknown"
    return [lookup, balance, pay], answer


SLIPS: dict[str, tuple[str, Callable]] = {
    "archive_read_newsletters": ("every_match", every_match_mail),
    "complete_due_todos": ("every_match", every_match_todo),
    "unread_count": ("marks_read", marks_read),
    "request_decision": ("ignores_condition", ignores_condition(pay=True)),
    "chase_request": ("ignores_condition", ignores_condition(pending=True)),
    "dinner_check": ("ignores_condition", ignores_condition(count=0)),
    "split_bill": ("skips_a_write", skips_last_write),
    "reschedule_event": ("skips_a_write", notifies_first_attendee),
    "reply_latest": ("wrong_record", wrong_record),
    "save_email_as_note": ("skips_reading", skips_reading),
    "pay_and_balance": ("stale_read", stale_read),
}


# ---- playing one episode ------------------------------------------------------------------------
def result_of(observation: str) -> Any:
    """The JSON a successful call returned, or None (an error, or an observation cut short)."""
    match = OBSERVATION.search(observation or "")
    try:
        value = json.loads(match.group(1)) if match else None
    except ValueError:
        return None
    return None if isinstance(value, dict) and set(value) == {"error"} else value


def play(env, task, slip: str | None, max_turns: int) -> dict:
    """One episode as a generic-JSONL record (without ids)."""
    tpl = TEMPLATES[task.meta["template"]]
    params = task.meta["params"]
    if slip is None:
        plan, answer = tpl.plan(params)
    else:
        plan, answer = SLIPS[tpl.name][1](tpl, params)
    episode = env.episode(task, 0)
    episode.reset()
    queue, results, docs_read, turns = list(plan), [], set(), []
    finish = "max_turns"
    while len(turns) < max_turns:
        if queue and isinstance(queue[0], FromResult):
            queue[:1] = queue[0].make(results[-1] if results else None)
            continue
        if queue and queue[0].app not in docs_read:
            action = tool_text("apis.show_docs", {"app": queue[0].app})
            docs_read.add(queue[0].app)
        elif queue:
            call = queue.pop(0)
            action = tool_text(call.name, call.arguments)
        else:
            text = answer(results) if callable(answer) else answer
            action = f"<answer>{text}</answer>"
        step = episode.step(action)
        turns.append({"action": action, "observation": step.observation,
                      "action_valid": step.valid, "action_type": step.action_type,
                      "parsed": step.parsed, "error": step.error, "state_diff": step.state_diff,
                      "step_reward": step.reward})
        if step.action_type == "tool":
            results.append(result_of(step.observation))
        if step.done:
            finish = "answered" if step.action_type == "answer" else "done"
            break
    outcome = episode.outcome()
    return {"prompt": env.system_prompt + "\n\n" + task.prompt, "turns": turns,
            "reward": outcome.score,
            "rewards": {"outcome": outcome.score, "format": 0.0, "cost": 0.0,
                        "process": outcome.process},
            "success": outcome.success, "finish_reason": finish, "answer": outcome.answer,
            "golds": list(task.golds),
            "tests": [{"name": n, "passed": ok, "detail": d} for n, ok, d in outcome.tests],
            "info": {"agent": "careless_apps", "slip": slip, "template": tpl.name,
                     **outcome.info}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSONL file to write")
    p.add_argument("--tasks", type=int, default=16, help="tasks per step")
    p.add_argument("--rollouts", type=int, default=2, help="episodes per task (one group)")
    p.add_argument("--steps", type=int, default=2, help="batches of fresh tasks")
    p.add_argument("--slip-rate", type=float, default=0.5,
                   help="chance that an episode of a template with a slip makes it")
    p.add_argument("--max-turns", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not 0 <= args.slip_rate <= 1:
        p.error("--slip-rate must be between 0 and 1")
    env = make_env("apps", seed=args.seed)
    pool = env.tasks("train", args.tasks * args.steps, args.seed)
    rng = random.Random(args.seed)
    run = {"env": "apps", "model": "careless-rule-agent", "algo": "none",
           "agent": "sample_runs/agents/careless_apps.py", "seed": args.seed,
           "slip_rate": args.slip_rate}
    with open(args.out, "w", encoding="utf-8") as out:
        for step in range(args.steps):
            for i, task in enumerate(pool[step * args.tasks:(step + 1) * args.tasks]):
                for k in range(args.rollouts):
                    slips = task.meta["template"] in SLIPS and rng.random() < args.slip_rate
                    rec = play(env, task, SLIPS[task.meta["template"]][0] if slips else None,
                               args.max_turns)
                    # ids without the task id's slashes, so they read well in links
                    rec.update(traj_id=f"s{step}-t{i}-r{k}", task_id=task.task_id,
                               group_id=f"s{step}-t{i}", step=step)
                    if not out.tell():
                        rec["run"] = run
                    out.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"wrote {args.steps * args.tasks * args.rollouts} trajectories to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
