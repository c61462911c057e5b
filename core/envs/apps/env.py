"""An AppWorld-style stateful environment: a small digital world of apps (contacts, calendar,
email, notes, todo, wallet; 40 endpoints) acted on through API calls, graded by unit tests on
the final database (LOOP's reward: passed tests / total tests). Torch-free.

Actions (the first complete one in the turn's text counts; text around it is ignored):
    <tool>{"name": "calendar.search_events", "arguments": {"query": "review"}}</tool>
    <code>for e in apis.calendar.search_events(limit=3): print(e["title"])</code>
    <answer>42.50</answer>                 ends the episode
Observations come back as ``\\n<observation>JSON</observation>\\n``. A tool call that fails
(unknown endpoint, missing or mistyped argument, missing record) is a valid action with an error
observation and ``StepResult.error``; text with no action, unparseable JSON or Python that does
not parse is an invalid action. ``apis.show_docs`` is the documentation lookup (action_type
"docs"). ``<code>`` runs in the isolated subprocess of sandbox/; its API calls are
executed here, exactly like tool calls, so both paths leave the same database.

Each episode has its own in-memory SQLite world built from the task (``Task.meta``: template,
world_seed, params): the G rollouts of a group see the same world, every write is logged as a
row-level state diff (``StepResult.state_diff``) and grading diffs the final database against the
initial one, so unrequested changes fail ``no_collateral_damage``. The episode's ``seed`` is not
used: nothing in this world is random once the task is fixed.

Outcome: ``score`` = passed / total tests, ``success`` = all passed, ``process`` = the fraction
of the task's own tests that pass (required changes and the answer, without the collateral
test, so doing nothing earns no process reward), ``tests`` = every (name, passed, detail).
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from core.envs.apps import endpoints, templates  # noqa: F401  (register endpoints and templates)
from core.envs.apps.api import APPS, ENDPOINTS, ApiError, call_api
from core.envs.apps.sandbox.parent import SandboxResult, run_code
from core.envs.apps.tasks import COLLATERAL_TEST, TEMPLATES, build, grade, rng_of
from core.envs.base import Outcome, StepResult, Task, register
from core.envs.options import Option, take_options

SPLITS = ("train", "heldout")
ACTION = re.compile(r"<(tool|code|answer)>(.*?)</\1>", re.DOTALL)
MAX_OBS_CHARS = 1500
"""Observations longer than this are shortened (lists lose their last items first)."""
MAX_CODE_OUTPUT = 1000
"""Printed output kept from one <code> action, so its observation stays whole JSON."""

SYSTEM_PROMPT = (
    "You act for a user inside a world of apps (contacts, calendar, email, notes, todo, wallet). "
    "Each turn, reason briefly if you like, then take exactly one action:\n"
    '<tool>{"name": "app.endpoint", "arguments": {...}}</tool> calls one API endpoint;\n'
    "<code>python</code> runs Python where apis.app.endpoint(arg=value) calls the same endpoints "
    "and print() shows results;\n"
    "<answer>text</answer> finishes: give the requested answer, or 'done' when nothing is asked.\n"
    'Read an app\'s endpoints first with <tool>{"name": "apis.show_docs", "arguments": '
    '{"app": "email"}}</tool>. Results come back inside <observation></observation>. Change only '
    "what the task asks for.")


def observation(payload: Any) -> str:
    # Echoed model text may hold lone surrogates; the context and the store need valid UTF-8.
    text = _shorten(payload).encode("utf-8", "replace").decode("utf-8")
    return f"\n<observation>{text}</observation>\n"


def _shorten(payload: Any) -> str:
    text = json.dumps(payload, ensure_ascii=False)
    if len(text) <= MAX_OBS_CHARS:
        return text
    if isinstance(payload, list):
        for keep in range(len(payload) - 1, -1, -1):
            note = f"... {len(payload) - keep} more not shown; narrow the search or lower limit"
            text = json.dumps(payload[:keep] + [note], ensure_ascii=False)
            if len(text) <= MAX_OBS_CHARS:
                return text
    return text[:MAX_OBS_CHARS] + f" ... [cut: {len(text)} characters in all]"


def tool_text(name: str, arguments: dict[str, Any]) -> str:
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool>{call}</tool>"


def user_message(world, instruction: str) -> str:
    me = world.me
    return (f"{instruction}\n\nNow: {world.now.strftime('%A %Y-%m-%d %H:%M')}. I am "
            f"{me['first']} {me['last']} ({me['email']}).\nApps: "
            + ", ".join(a for a in APPS if a != "apis")
            + '. List an app\'s endpoints with {"name": "apis.show_docs", "arguments": {"app": '
            '"<app>"}}; one endpoint\'s parameters with {"endpoint": "<app>.<endpoint>"}.')


# ---- environment ---------------------------------------------------------------------------------
@register("apps")
class AppsEnv:
    """Options: ``OPTIONS`` below. ``seed`` and ``topk`` are the arguments every environment is
    built with (core/config/env_options.py's env_kwargs); tasks take their own seed and there is no
    retrieval here, so neither changes anything."""

    name = "apps"
    stop_tags = ("</tool>", "</code>", "</answer>")
    system_prompt = SYSTEM_PROMPT
    OPTIONS = {
        "templates": Option((str, list, tuple), doc="only these template names: "
                            "comma-separated, or ';'-separated inside env_options"),
        "code_cpu_s": Option(int, 1, 60, default=2, doc="CPU seconds one <code> action may use"),
        "code_wall_s": Option(float, 1, 60, default=6.0,
                              doc="wall-clock seconds one <code> action may take"),
        "code_mem_mb": Option(int, 64, 1024, default=256,
                              doc="MB of address space one <code> action's process may map"),
    }
    """The <code> sandbox's limits (sandbox/parent.py) are bounded on both sides. Floors: the
    sandboxed interpreter alone maps about 20 MB (a trivial action fails at 16 MB and runs at
    24 MB; 64 MB leaves it room), and one second of CPU or wall time (starting the sandbox
    takes 0.1-0.2 s of it on a quiet machine) is the least that still runs the code. Caps: 4x
    the default memory (1024 MB) and a minute of CPU or wall time (30x and 10x the defaults):
    ample for a few dozen API calls and their loops, while each action's process maps memory
    of its own and several may run on one machine at once (a 1.5 GB allocation is refused at
    the cap); and a minute stays under --env-step-timeout's default of 120 s, so the sandbox's
    own deadline, with its clear error, comes first."""

    def __init__(self, seed: int = 0, topk: int = 3, **options: Any):
        opts = take_options(self.name, self.OPTIONS, options)
        templates = opts["templates"]
        if isinstance(templates, str):
            templates = [t.strip() for t in templates.split(",") if t.strip()]
        unknown = sorted(set(templates or ()) - set(TEMPLATES))
        if unknown:
            raise ValueError(f"unknown apps templates {unknown}; known: {', '.join(TEMPLATES)}")
        self.seed = seed
        self.templates = list(templates) if templates else list(TEMPLATES)
        self.limits = {"cpu_s": opts["code_cpu_s"], "wall_s": opts["code_wall_s"],
                       "mem_mb": opts["code_mem_mb"]}

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        """n distinct tasks, templates in turn (shuffled); train worlds have even world seeds,
        heldout worlds odd ones, so the splits never share a task."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = rng_of("apps-tasks", split, seed)
        order = sorted(self.templates)
        rng.shuffle(order)
        out, seen = [], set()
        while len(out) < n:
            name = order[len(out) % len(order)]
            world_seed = 2 * rng.randrange(2 ** 30) + SPLITS.index(split)
            if (name, world_seed) not in seen:
                seen.add((name, world_seed))
                out.append(make_task(name, world_seed, split))
        return out

    def episode(self, task: Task, seed: int = 0) -> "AppsEpisode":
        return AppsEpisode(self, task)

    def is_answer(self, action_text: str) -> bool:
        """True when the first action is ``<answer>...</answer>`` (``final_answer_turn``)."""
        match = ACTION.search(action_text or "")
        return match is not None and match.group(1) == "answer"


def make_task(template_name: str, world_seed: int, split: str) -> Task:
    tpl = TEMPLATES[template_name]
    world, params = build(template_name, world_seed)
    return Task(task_id=f"apps/{split}/{template_name}/{world_seed}",
                prompt=user_message(world, tpl.instruction(params)), golds=tpl.golds(params),
                split=split, meta={"template": template_name, "world_seed": world_seed,
                                   "kind": tpl.kind, "params": params})


class AppsEpisode:
    def __init__(self, env: AppsEnv, task: Task):
        self.env, self.task = env, task
        self.template = TEMPLATES[task.meta["template"]]
        self.reset()

    def reset(self) -> str:
        self.world, self.params = build(self.task.meta["template"], self.task.meta["world_seed"])
        self.initial = self.world.store.snapshot()
        self.done, self.answer = False, None
        self.counts = {"calls": 0, "doc_lookups": 0, "errors": 0, "code_runs": 0}
        self.succeeded: list[tuple[str, str]] = []
        """(endpoint, canonical JSON arguments) of every call that succeeded, for the expert."""
        self.docs_seen: set[str] = set()
        self._key: tuple[int, str] | None = None
        return self.task.prompt

    def state_key(self) -> str:
        """A hash of the database's content: read-only calls and docs lookups leave it as it
        was, so GiGPO compares every turn that acted on the same data. Recomputed only after a
        write (the store's log grew)."""
        writes = len(self.world.store.log)
        if self._key is None or self._key[0] != writes:
            content = json.dumps(self.world.store.snapshot(), sort_keys=True, default=str)
            self._key = (writes, "db:" + hashlib.sha256(content.encode()).hexdigest()[:16])
        return self._key[1]

    # -- acting --------------------------------------------------------------------------------
    def _call(self, name: Any, arguments: Any) -> tuple[bool, Any]:
        """Execute one API call (from a tool action or from code); (ok, result or message)."""
        self.counts["calls"] += 1
        if name == "apis.show_docs":
            self.counts["doc_lookups"] += 1
        try:
            result = call_api(self.world, name, arguments)
        except ApiError as exc:
            self.counts["errors"] += 1
            return False, str(exc)
        except Exception as exc:  # an endpoint bug must not end the run: report it like an error
            self.counts["errors"] += 1
            return False, f"internal error in {name}: {type(exc).__name__}: {exc}"
        if name == "apis.show_docs" and isinstance(arguments, dict):
            target = arguments.get("app") or str(arguments.get("endpoint") or "").split(".")[0]
            self.docs_seen.add(str(target))
        self.succeeded.append((name, json.dumps(arguments or {}, sort_keys=True)))
        return True, result

    def step(self, action_text: str) -> StepResult:
        result = self._step(action_text)
        result.state_key = self.state_key()
        return result

    def _step(self, action_text: str) -> StepResult:
        if self.done:
            raise RuntimeError(f"episode of task {self.task.task_id} is over; reset() it first")
        match = ACTION.search(action_text or "")
        if match is None:
            return StepResult(observation({"error": "no action found: write <tool>{...}</tool>, "
                                           "<code>...</code> or <answer>...</answer>"}),
                              done=False, valid=False, error="no action")
        kind, body = match.group(1), match.group(2)
        if kind == "answer":
            self.done, self.answer = True, body.strip()
            return StepResult("", done=True, valid=True, action_type="answer",
                              parsed={"answer": self.answer})
        log_start = len(self.world.store.log)
        result = self._tool(body) if kind == "tool" else self._code(body)
        diff = self.world.store.log[log_start:]
        result.state_diff = list(diff) if diff else None
        result.info.update(self.counts)
        return result

    def _tool(self, body: str) -> StepResult:
        try:
            call = json.loads(body)
        except ValueError as exc:
            return StepResult(observation({"error": f"the tool call is not valid JSON: {exc}"}),
                              done=False, valid=False, action_type="tool", error="invalid JSON")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return StepResult(observation({"error": 'a tool call is {"name": "app.endpoint", '
                                           '"arguments": {...}}'}),
                              done=False, valid=False, action_type="tool", error="no endpoint name")
        name, arguments = call["name"], call.get("arguments", {})
        ok, value = self._call(name, arguments)
        kind = "docs" if name == "apis.show_docs" else "tool"
        parsed = {"name": name, "arguments": arguments}
        if not ok:
            return StepResult(observation({"error": value}), done=False, valid=True,
                              action_type=kind, parsed=parsed, error=value)
        return StepResult(observation(value), done=False, valid=True, action_type=kind,
                          parsed=parsed, info={"mutating": ENDPOINTS[name].mutates})

    def _code(self, body: str) -> StepResult:
        self.counts["code_runs"] += 1
        limits = self.env.limits
        run: SandboxResult = run_code(body, self._call, cpu_s=limits["cpu_s"],
                                      wall_s=limits["wall_s"], mem_mb=limits["mem_mb"],
                                      max_output=MAX_CODE_OUTPUT)
        payload = {"output": run.output}
        if run.error:
            payload["error"] = run.error
            self.counts["errors"] += 1
        valid = not (run.error or "").startswith("SyntaxError")
        return StepResult(observation(payload), done=False, valid=valid, action_type="code",
                          parsed={"code": body, "api_calls": run.calls}, error=run.error,
                          info={"sandbox_layers": run.layers, "wall_s": round(run.wall_s, 3)})

    # -- grading -------------------------------------------------------------------------------
    def outcome(self) -> Outcome:
        """The task's unit tests on the current database (callable at any time; the rollout
        calls it once the episode ends). See the module docstring for score and process."""
        tests = grade(self.task.meta["template"], self.params, self.task.golds, self.initial,
                      self.world.store.snapshot(), self.answer)
        passed = sum(ok for _, ok, _ in tests)
        own = [ok for name, ok, _ in tests if name != COLLATERAL_TEST]
        collateral = not dict((n, ok) for n, ok, _ in tests)[COLLATERAL_TEST]
        return Outcome(score=passed / len(tests), success=passed == len(tests), answer=self.answer,
                       process=sum(own) / len(own) if own else 0.0, tests=tests,
                       info={"collateral": collateral, "num_tests": len(tests),
                             **{k: self.counts[k] for k in ("calls", "doc_lookups", "errors")},
                             "template": self.template.name})

    def expert_action(self) -> str:
        """The scripted expert: the template's plan of API calls, each preceded by a docs lookup
        the first time its app is used, skipping calls that already succeeded (so it can take
        over a partial trajectory), then the answer. It knows the planted facts, but each value
        it uses (ids, addresses) was shown by one of its earlier calls."""
        if self.done:
            raise RuntimeError("the episode is over: the expert has nothing to do")
        calls, answer = self.template.plan(self.params)
        done = set(self.succeeded)
        for call in calls:
            if call.app not in self.docs_seen:
                return tool_text("apis.show_docs", {"app": call.app})
            if (call.name, json.dumps(call.arguments, sort_keys=True)) not in done:
                return tool_text(call.name, call.arguments)
        return f"<answer>{answer}</answer>"
