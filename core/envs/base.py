"""The environment protocol every env implements. Torch-free.

An ``Environment`` is built once per run (corpus, task generator). For each trajectory it makes a
fresh ``Episode`` (all per-trajectory state lives there, so a group's G rollouts never share
state). The rollout talks to an episode only through text:

    text = episode.reset()                 # the user message: task + first observation
    while not done:
        action_text = policy(context)      # generation stops at one of env.stop_tags
        result = episode.step(action_text) # result.observation goes into the context, untrained
    outcome = episode.outcome()            # graded on the final state

Environments produce plain text and never a chat template's markers: the rollout renders the
prompt, and each observation when ``observation_role == "user"``, with the policy tokenizer's own
chat template, so an environment works with any chat model.

Optional members (the rollout uses them when present):

    Environment.observation_role   "inline" (default; Search-R1: the observation continues the
                                   model's own message) | "user" (RAGEN's games: each observation
                                   is a new user message)
    Environment.is_answer(text)    True when text is a final answer (``final_answer_turn``)
    Environment.split_size(split)  how many distinct tasks ``tasks(split, n, seed)`` can return;
                                   None when they are generated without bound (``task_pool``)
    Episode.state_key()            the current state's key (the start's, before the first step)
    Episode.render()               a picture of the current state for Replay: SVG text, PNG
                                   bytes, or a table (a list of row dicts); None for none. Called
                                   after reset and after every step; checked and capped
                                   (core/envs/render.py); one that raises or is too big is a
                                   note on the trajectory, never its end

Everything is deterministic from (task, seed), so a recorded trajectory can be replayed.

This protocol is the public API for users' environments (docs/environments.md, examples/guess.py):
``--env package.module:Factory`` or an installed plugin's name (core/envs/plugins.py).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from core.envs import plugins


@dataclass(frozen=True)
class Task:
    task_id: str
    """Unique within the env and split, stable across runs with the same seed."""
    prompt: str
    """The instruction the model is given (the user message)."""
    golds: tuple[str, ...] = ()
    """Gold answers, where the task has a final answer."""
    split: str = "train"
    """train | heldout: the two splits never share a task."""
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    """Env-specific parameters (hops, level layout, template name, ...)."""


@dataclass
class StepResult:
    observation: str
    """Text appended to the context after the action (already wrapped, e.g. in <information>).
    Empty when the episode ends without one."""
    done: bool
    """True when the episode has ended (answer given, goal reached, unrecoverable)."""
    valid: bool
    """False when the action could not be parsed or executed (counts against format)."""
    action_type: str = "invalid"
    """search | answer | tool | code | docs | move | invalid ..."""
    parsed: dict[str, Any] | None = None
    """The parsed action arguments, for the record."""
    reward: float = 0.0
    """Per-step env reward (grid worlds), used for step returns (GiGPO) and process reward."""
    error: str | None = None
    """Tool/env error text when the action failed for a reason other than format."""
    state_diff: list[dict[str, Any]] | None = None
    """Rows changed by a mutating action (apps), for replay."""
    info: dict[str, Any] = field(default_factory=dict)
    """Anything else worth keeping (slips, sandbox layers, counters): JSON-serialisable; stored
    on the turn and shown in Replay."""
    state_key: str | None = None
    """The environment state this step left the episode in, as a stable text key (FrozenLake's
    position, Sokoban's board, the apps database's content hash, search's retrieved documents).
    GiGPO's anchor: turns of one group that act from equal keys form a step group, whatever turn
    they were reached at. Never the observation text (it holds turn counters). None: the env
    offers none, and the anchor falls back to a hash of the observation."""


@dataclass
class Outcome:
    score: float
    """Outcome reward in [0, 1] (exact match, tests passed / total, goal reached)."""
    success: bool
    """Sparse success."""
    answer: str | None = None
    """The final answer given, if any."""
    process: float = 0.0
    """Process/progress reward in [0, 1] (retrieval hit, subgoals, tests passing so far)."""
    tests: list[tuple[str, bool, str]] = field(default_factory=list)
    """(test name, passed, detail) for unit-test graded envs."""
    info: dict[str, Any] = field(default_factory=dict)


class Episode(Protocol):
    task: Task

    def reset(self) -> str: ...
    def step(self, action_text: str) -> StepResult: ...
    def outcome(self) -> Outcome: ...
    def expert_action(self) -> str:
        """The scripted expert's next action text from the current state (for SFT demos)."""
        ...
    # Optional: def state_key(self) -> str -- the current state's key (the start's after reset),
    # which anchors the first turn; later turns take the previous StepResult.state_key.
    # Optional: def render(self) -> str | bytes | list[dict] | None -- the current state as SVG
    # text, PNG bytes or table rows, for Replay (module docstring; core/envs/render.py).


class Environment(Protocol):
    name: str
    stop_tags: tuple[str, ...]
    """Closing tags that end a turn's generation; the action text is cut right after one."""
    system_prompt: str
    """Instructions for the model: action format and tags."""
    # Optional: observation_role: str = "inline" | "user"; is_answer(action_text) -> bool;
    # split_size(split) -> int | None (see the module docstring).

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        """n tasks of ``split`` (train | heldout), deterministic from seed."""
        ...

    def episode(self, task: Task, seed: int) -> Episode:
        """A fresh episode of task; seed drives env randomness (slippery moves, bandit pulls)."""
        ...


REGISTRY: dict[str, Callable[..., Environment]] = {}


def register(name: str):
    """Class decorator: make ``--env name`` build this environment."""
    def wrap(factory):
        REGISTRY[name] = factory
        return factory
    return wrap


def observation_role(env: Environment) -> str:
    """``env.observation_role``, "inline" when the env does not say."""
    role = getattr(env, "observation_role", "inline")
    if role not in ("inline", "user"):
        raise ValueError(f"{getattr(env, 'name', env)!r}: observation_role must be 'inline' or "
                         f"'user', got {role!r}")
    return role


BUILTIN: dict[str, str] = {
    "search": "core.envs.search.env", "apps": "core.envs.apps.env",
    "frozenlake": "core.envs.games.frozenlake", "sokoban": "core.envs.games.sokoban",
    "bandit": "core.envs.games.bandit", "corridor": "core.envs.games.corridor"}
"""The built-in environments' names and the modules that register them (imported on demand:
apps and search pull in SQLite worlds and a BM25 index)."""


def make_env(name: str, **kwargs: Any) -> Environment:
    """Build env ``name``; kwargs are env options (e.g. topk, seed for the world).

    ``name`` is a registered or built-in name, ``package.module:Factory`` for a user's
    environment written against this protocol (``Factory(**kwargs)`` builds it), or the name an
    installed package declares in the ``agentrl.environments`` entry points
    (core/envs/plugins.py). A plugin that cannot be built raises ``PluginError`` (a ValueError)
    naming it."""
    if name not in REGISTRY and name not in BUILTIN and (
            ":" in name or name in plugins.installed()):
        return plugins.build(name, **kwargs)
    if name not in REGISTRY:
        try:
            importlib.import_module(BUILTIN.get(name, f"core.envs.{name}"))
        except ModuleNotFoundError as exc:
            raise ValueError(f"unknown environment {name!r}") from exc
    if name not in REGISTRY:
        raise ValueError(f"unknown environment {name!r}")
    return REGISTRY[name](**kwargs)
