"""A small but realistic store for the app's tests, written through the real Recorder.

``make_demo_store(path)`` records four runs:

* a Search-R1-style run (SFT warm start, then StarPO-S RL steps in groups of 4): multi-turn
  trajectories with ``<search>`` actions and ``<information>`` observations, per-token roles,
  loss mask, logprobs and entropies, a gradient-norm spike at ``SPIKE_STEP`` with per-trajectory
  gradient norms, entropy and in-group std falling together near the end (a collapse), one
  trajectory whose action and observation carry ``<script>alert(1)</script>`` and HTML, one turn
  cut by the token limit and one observation token wrongly trained (for the mask lint);
* an apps-style run: code actions with state diffs, a tool error and unit-test results;
* an imported run: text only (no token logprobs, no gradients);
* a run whose trainer died: still 'running' but not updated for an hour, no trajectories.
"""
from __future__ import annotations

import random
import re
import zlib
from datetime import timedelta
from pathlib import Path

from storage import db
from storage.recorder import Recorder, now

SPIKE_STEP = 7
SPIKE_TRAJ = "s07-g1-r2"
SCRIPT_TRAJ = "s04-g0-r3"
SCRIPT_TEXT = "<script>alert(1)</script>"
LINT_TRAJ = "s05-g1-r0"
RUN_NAMES = ("demo-search-starpo", "demo-apps-rloo", "imported-verl", "crashed-run")

WORLD = {"Veloria": ("Marrenport", "1412"), "Dunmoor": ("Kestrel Bay", "1688"),
         "Ysmir": ("Thallin", "903"), "Korvath": ("Bremsk", "1544")}
BEHAVIOURS = ["good", "no_search", "wrong_evidence", "invalid", "loop"]
INVALID_FEEDBACK = ("My previous action is invalid. If I want to search, I should put the query "
                    "between <search> and </search>. If I want to give the final answer, I should "
                    "put the answer between <answer> and </answer>. Let me try again.")


def _pieces(text: str) -> list[str]:
    """Word-level pseudo tokens whose concatenation is exactly ``text``."""
    return re.findall(r"\s*\S+|\s+", text) or [text]


def _docs(country: str, with_gold: bool) -> str:
    capital, year = WORLD[country]
    other = "Ysmir" if country != "Ysmir" else "Dunmoor"
    docs = [f"Doc 1(Title: {other}) The capital of {other} is {WORLD[other][0]}."]
    if with_gold:
        docs.insert(0, f"Doc 1(Title: {country}) {capital} is the capital of {country}, "
                       f"founded in {year}.")
    return "\n\n<information>" + "\n".join(docs) + "</information>\n\n"


def _search_episode(rng: random.Random, country: str, behaviour: str):
    """(turns, answer, success, failure_class, finish_reason) of one scripted episode."""
    capital = WORLD[country][0]
    q = f"<search>capital of {country}</search>"
    if behaviour == "good":
        turns = [(q, _docs(country, True), "search", True),
                 (f"<answer>{capital}</answer>", "", "answer", True)]
        return turns, capital, True, "success", "answered"
    if behaviour == "no_search":
        solved = capital == "Bremsk"
        return [("<answer>Bremsk</answer>", "", "answer", True)], "Bremsk", solved, \
            "success" if solved else "answered_without_search", "answered"
    if behaviour == "wrong_evidence":
        turns = [(q, _docs(country, True), "search", True),
                 ("<answer>Thallin</answer>", "", "answer", True)]
        return turns, "Thallin", False, "wrong_answer_with_evidence", "answered"
    if behaviour == "invalid":
        turns = [(f"I think the capital of {country} is", INVALID_FEEDBACK, "invalid", False)] * 3
        return turns, None, False, "format_error", "max_turns"
    # a repeated-search loop whose last action is cut by the token limit
    turns = [(q, _docs(country, False), "search", True)] * 2
    cut = f"<search>capital of {country} capital of {country} capital"  # no closing tag
    turns.append((cut, "", "invalid", False))
    return turns, None, False, "repeated_action_loop", "max_turns"


def _token_rows(rng, prompt: str, turns, advantage: float, mark_obs_trained: bool) -> list[dict]:
    rows, pos = [], 0

    def add(text: str, role: str, turn: int) -> None:
        nonlocal pos
        for piece in _pieces(text):
            action = role == "action"
            lp = -abs(rng.gauss(0.6, 0.5)) if action else None
            rows.append(dict(pos=pos, token_id=zlib.crc32(piece.encode()) % 49000 + 1, text=piece,
                             role=role, trained=action, logprob=lp, turn=turn,
                             advantage=advantage if action else None,
                             entropy=abs(rng.gauss(1.2, 0.4)) if action else None,
                             new_logprob=lp + rng.gauss(0, 0.02) if action else None,
                             ref_logprob=lp + rng.gauss(0, 0.05) if action else None))
            pos += 1

    add(prompt, "prompt", -1)
    for t, (action, obs, _, _) in enumerate(turns):
        add(action, "action", t)
        if obs:
            add(obs, "observation", t)
    if mark_obs_trained:
        obs_rows = [r for r in rows if r["role"] == "observation"]
        obs_rows[0]["trained"] = True
    return rows


def _grpo(rewards: list[float]) -> list[float]:
    mean = sum(rewards) / len(rewards)
    if max(rewards) == min(rewards):
        return [0.0] * len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) ** 0.5
    return [(r - mean) / (std + 1e-6) for r in rewards]


def _search_run(rec: Recorder, rng: random.Random) -> str:
    run_id = rec.start_run({"env": "search", "model": "tiny", "algo": "starpo_s", "group_size": 4,
                            "tasks_per_step": 2, "steps": 10, "sft_steps": 2, "max_turns": 3,
                            "lr": 1e-4, "seed": 0, "starpo_keep": 0.5}, name=RUN_NAMES[0])
    for step in (0, 1):
        rec.record_step(step, metrics={"sft/loss": 2.1 - 0.7 * step, "time/step_s": 5.5})
    rec.record_step(1, metrics={"eval/success": 0.25})
    countries = list(WORLD)
    for step in range(2, 12):
        progress = (step - 2) / 9
        trajs, rewards, turns, tokens, tests = [], [], [], [], []
        group_rewards = []
        for g in range(2):
            country = countries[(step + g) % len(countries)]
            prompt = (f"Answer the question. Search with <search>query</search>, answer with "
                      f"<answer>text</answer>.\nQuestion: What is the capital of {country}?\n")
            members = []
            for k in range(4):
                traj_id = f"s{step:02d}-g{g}-r{k}"
                weights = [0.2 + 0.6 * progress, 0.25 - 0.2 * progress, 0.2,
                           0.2 - 0.15 * progress, 0.15]  # the policy improves with progress
                behaviour = rng.choices(BEHAVIOURS, weights)[0]
                if step >= 10:  # collapse: every rollout repeats the same answer
                    behaviour = "good" if g == 0 else "wrong_evidence"
                if traj_id in (SCRIPT_TRAJ, LINT_TRAJ):
                    behaviour = "good"
                ep = list(_search_episode(rng, country, behaviour))
                if traj_id == SCRIPT_TRAJ:
                    hostile = ("\n\n<information>Doc 1(Title: <b>bold</b>) "
                               f"<img src=x onerror=alert(2)> {SCRIPT_TEXT}</information>\n\n")
                    ep[0] = [(f"<search>{SCRIPT_TEXT} capital of {country}</search>", hostile,
                              "search", True)] + ep[0][-1:]
                members.append((traj_id, prompt, country, ep))
            episodes = [m[3] for m in members]  # (turns, answer, success, class, finish)
            outcome = [1.0 if ep[2] else 0.0 for ep in episodes]
            fmt = [0.0 if ep[3] == "format_error" else 1.0 for ep in episodes]
            cost = [-0.05 * len(ep[0]) for ep in episodes]  # 0.05 per turn
            total = [o + c for o, c in zip(outcome, cost)]
            adv = _grpo(total)
            group_rewards.append(total)
            for member, r, a, o, f, c in zip(members, total, adv, outcome, fmt, cost):
                traj_id, prompt, country, (tturns, answer, success, fclass, finish) = member
                grad = 4.0 if traj_id == SPIKE_TRAJ else abs(rng.gauss(0.12, 0.04))
                trajs.append(dict(traj_id=traj_id, group_id=f"s{step:02d}-g{g}",
                                  task_id=f"capital-{country}", reward=r, advantage=a,
                                  success=success, num_turns=len(tturns),
                                  finish_reason=finish, split="train", prompt=prompt, answer=answer,
                                  golds=[WORLD[country][0]], failure_class=fclass, grad_norm=grad,
                                  response_tokens=sum(len(_pieces(t[0])) for t in tturns),
                                  info={"behaviour": "scripted"}))
                for comp, v in (("outcome", o), ("format", f), ("cost", c), ("process", 0.0)):
                    rewards.append(dict(traj_id=traj_id, component=comp, value=v))
                for t, (action, obs, atype, valid) in enumerate(tturns):
                    turns.append(dict(traj_id=traj_id, turn=t, action=action, observation=obs,
                                      action_valid=valid, action_type=atype, advantage=a,
                                      action_truncated=atype == "invalid" and "<search>" in action,
                                      step_reward=0.0, latency_s=0.003))
                tokens += [dict(traj_id=traj_id, **row) for row in
                           _token_rows(rng, prompt, tturns, a, traj_id == LINT_TRAJ)]
        stds = [_std(r) for r in group_rewards]
        keep = max(range(2), key=lambda i: stds[i])
        for t in trajs:
            t["filtered"] = not t["group_id"].endswith(f"g{keep}")
        all_r = [r for rs in group_rewards for r in rs]
        collapse = max(0.0, (step - 8) / 3)
        metrics = {
            "reward/mean": sum(all_r) / len(all_r), "reward/std": _std(all_r),
            "reward/group_std_mean": sum(stds) / len(stds) * (1 - 0.9 * collapse),
            "reward/frac_zero_std": sum(s == 0 for s in stds) / len(stds),
            "success/rate": sum(t["success"] for t in trajs) / len(trajs),
            "success/pass@g": sum(any(t["success"] for t in trajs
                                      if t["group_id"].endswith(f"g{g}")) for g in range(2)) / 2,
            "grad/norm": 6.0 if step == SPIKE_STEP else 0.5 + rng.gauss(0, 0.05),
            "policy/entropy": 1.3 - 0.2 * progress - 0.8 * collapse, "policy/kl": 0.002 * step,
            "policy/clipfrac": 0.05 + 0.01 * rng.random(), "policy/clipfrac_low": 0.02,
            "policy/clipfrac_high": 0.03, "response/length_mean": 30 - 5 * progress,
            "env/turns_mean": sum(t["num_turns"] for t in trajs) / len(trajs),
            "env/valid_action_ratio": 0.7 + 0.25 * progress,
            "collapse/repeat_frac": 0.05 + 0.8 * collapse, "time/step_s": 9.0 + rng.random(),
            "time/rollout_s": 5.0, "time/reward_s": 0.1, "time/update_s": 3.5,
            "time/record_s": 0.05,
        }
        if step in (6, 11):
            metrics["eval/success"] = 0.3 + 0.4 * progress
        grads = [dict(module=m, norm=metrics["grad/norm"] * w) for m, w in
                 (("layers.0.self_attn.q_proj.lora_A", 0.4),
                  ("layers.1.mlp.down_proj.lora_B", 0.6))]
        rec.record_step(step, metrics=metrics, trajectories=trajs, rewards=rewards, turns=turns,
                        tokens=tokens, grad_stats=grads, test_results=tests)
    rec.finish("finished")
    return run_id


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def _apps_run(rec: Recorder, rng: random.Random) -> str:
    run_id = rec.start_run({"env": "apps", "model": "tiny", "algo": "rloo", "group_size": 4,
                            "tasks_per_step": 1, "steps": 3, "max_turns": 2, "lr": 5e-5},
                           name=RUN_NAMES[1])
    for step in range(3):
        trajs, turns, tokens, tests, rewards = [], [], [], [], []
        passes = [rng.random() < 0.3 + 0.3 * step for _ in range(4)]
        total = [1.0 if p else 0.5 * rng.random() for p in passes]
        mean = sum(total) / 4
        for k, (ok, r) in enumerate(zip(passes, total)):
            traj_id = f"a{step}-r{k}"
            adv = r - (sum(total) - r) / 3
            code = ('<code>api.contacts.update(name="Ada", phone="555-0100")</code>' if ok else
                    '<code>api.contacts.delete(name="Ada")</code>')
            diff = ([{"table": "contacts", "op": "update", "before": {"phone": "555-0199"},
                      "after": {"phone": "555-0100"}}] if ok else
                    [{"table": "contacts", "op": "delete", "before": {"name": "Ada"},
                      "after": None}])
            tt = [("<code>api.contacts.find(name='Ada')</code>", "KeyError: 'phone'", "code", True),
                  (code, "ok", "code", True)]
            for t, (action, obs, atype, valid) in enumerate(tt):
                turns.append(dict(traj_id=traj_id, turn=t, action=action, observation=obs,
                                  action_valid=valid, action_type=atype, advantage=adv,
                                  error="KeyError: 'phone'" if t == 0 else None,
                                  state_diff=diff if t == 1 else None))
            tests += [dict(traj_id=traj_id, name="phone_updated", passed=ok,
                           detail=None if ok else "expected phone 555-0100"),
                      dict(traj_id=traj_id, name="no_collateral_damage", passed=ok,
                           detail=None if ok else "contact Ada was deleted")]
            trajs.append(dict(traj_id=traj_id, group_id=f"a{step}-g0", task_id="update-phone",
                              reward=r, advantage=adv, success=ok, num_turns=2,
                              finish_reason="done", prompt="Update Ada's phone to 555-0100.",
                              failure_class=None if ok else "collateral_damage",
                              grad_norm=abs(rng.gauss(0.1, 0.03))))
            rewards += [dict(traj_id=traj_id, component=c, value=v) for c, v in
                        (("outcome", r), ("format", 1.0), ("cost", 0.0), ("process", 0.0))]
            prompt = "Update Ada's phone to 555-0100.\n"
            tokens += [dict(traj_id=traj_id, **row)
                       for row in _token_rows(rng, prompt, tt, adv, False)]
        rec.record_step(step, metrics={"reward/mean": mean, "success/rate": sum(passes) / 4,
                                       "grad/norm": 0.3, "policy/entropy": 1.0 - 0.1 * step},
                        trajectories=trajs, turns=turns, tokens=tokens, test_results=tests,
                        rewards=rewards)
    rec.finish("finished")
    return run_id


def _imported_run(rec: Recorder, rng: random.Random) -> str:
    run_id = rec.start_run({"env": "search", "model": "verl", "algo": "grpo"}, name=RUN_NAMES[2],
                           source="import")
    for step in range(2):
        trajs, turns = [], []
        for k in range(4):
            ok = rng.random() < 0.5
            traj_id = f"imp{step}-{k}"
            trajs.append(dict(traj_id=traj_id, group_id=f"imp{step}", task_id="q-17",
                              reward=float(ok), success=ok, num_turns=1, split="import",
                              finish_reason="answered", prompt="Who wrote Kestrel Bay?"))
            answer = "Lin" if ok else "Ode"
            turns.append(dict(traj_id=traj_id, turn=0, action=f"<answer>{answer}</answer>",
                              observation="", action_valid=True, action_type="answer"))
        rec.record_step(step, metrics={"reward/mean": sum(t["reward"] for t in trajs) / 4},
                        trajectories=trajs, turns=turns)
    rec.finish("finished")
    return run_id


def _crashed_run(rec: Recorder, path: Path) -> str:
    run_id = rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo"}, name=RUN_NAMES[3])
    for step in range(2):
        rec.record_step(step, metrics={"reward/mean": 0.1 * step})
    with db.writing(path) as con:  # its trainer died an hour ago, status still 'running'
        con.execute("UPDATE runs SET updated_at = ? WHERE run_id = ?",
                    [now() - timedelta(hours=1), run_id])
    return run_id


def make_demo_store(path: str | Path) -> list[str]:
    """Record the four demo runs into the DuckDB file ``path``; return their run ids."""
    path = Path(path)
    rng = random.Random(7)
    ids = [_search_run(Recorder(path), rng), _apps_run(Recorder(path), rng),
           _imported_run(Recorder(path), rng), _crashed_run(Recorder(path), path)]
    return ids
