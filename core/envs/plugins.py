"""Users' environments: ``--env package.module:Factory`` or the name of an installed plugin.

An installed package offers environments through the entry-point group ``agentrl.environments``
(in its pyproject.toml: ``[project.entry-points."agentrl.environments"] guess =
"mypkg.guess:Factory"``); ``--env guess`` then builds ``mypkg.guess:Factory``. Listing the
installed names reads package metadata only, imports nothing and needs no torch, so the web app
can offer them.

A broken plugin is refused before any work starts with a ``PluginError`` naming it and saying
what is wrong (``core.train`` exits 2): a module that cannot be imported, a missing factory, a
factory that raises, a missing or ill-typed protocol member (``check``).
"""
from __future__ import annotations

import importlib
import re
import traceback
from importlib import metadata
from typing import Any

GROUP = "agentrl.environments"
"""The entry-point group installed packages declare their environments in."""
SPEC = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_]\w*")
"""``package.module:Factory``."""
ENV_MEMBERS = ("name", "stop_tags", "system_prompt", "tasks", "episode")
EPISODE_METHODS = ("reset", "step", "outcome")


class PluginError(ValueError):
    """A user's environment that cannot be loaded or does not follow the protocol."""


def installed() -> dict[str, str]:
    """{name: "package.module:Factory"} of every installed plugin (entry-point group ``GROUP``).
    A name declared twice keeps its first declaration, as importlib.metadata lists them."""
    found: dict[str, str] = {}
    for ep in metadata.entry_points(group=GROUP):
        found.setdefault(ep.name, ep.value.replace(" ", ""))
    return found


def spec_of(name: str) -> str | None:
    """The ``package.module:Factory`` ``name`` stands for (itself, or an installed plugin's);
    None when it is neither."""
    if SPEC.fullmatch(name):
        return name
    return installed().get(name)


def load_factory(name: str):
    """The factory of plugin ``name`` (a spec or an installed plugin name), imported."""
    spec = spec_of(name)
    label = name if spec == name else f"{name} ({spec})"
    if spec is None:
        raise PluginError(f"environment {name!r}: not a built-in environment, not "
                          f"package.module:Factory, and no installed package declares it in the "
                          f"{GROUP!r} entry points")
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or any error the module raises while importing
        raise PluginError(f"cannot load environment plugin {label}: importing module "
                          f"{module_name!r} failed: {_where(exc)}") from exc
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise PluginError(f"cannot load environment plugin {label}: module {module_name!r} has "
                          f"no callable {attr!r}")
    return factory


def build(name: str, **kwargs: Any):
    """``Factory(**kwargs)`` of plugin ``name``; PluginError naming it if that fails."""
    factory = load_factory(name)
    try:
        return factory(**kwargs)
    except Exception as exc:
        raise PluginError(f"cannot load environment plugin {name}: "
                          f"{getattr(factory, '__name__', factory)}(**{kwargs!r}) failed: "
                          f"{_where(exc)}") from exc


def check(env: Any, name: str, *, need_expert: bool = False, seed: int = 0) -> None:
    """Check ``env`` follows the protocol (core/envs/base.py), running its own code once: one
    train task, its episode, ``reset()``. PluginError naming the plugin and the member.

    Only the members are checked, and that ``reset`` returns text: ``step`` is not called here
    (during training an exception there, a call past ``--env-step-timeout`` or a result that is
    not a usable StepResult / Outcome ends only that trajectory, recorded as ``env_error``:
    core/envs/guard.py)."""
    def bad(why: str) -> PluginError:
        return PluginError(f"environment plugin {name}: {why} (see docs/environments.md)")

    missing = [m for m in ENV_MEMBERS if not hasattr(env, m)]
    if missing:
        raise bad(f"{type(env).__name__} has no {', '.join(missing)}")
    for attr in ("tasks", "episode"):
        if not callable(getattr(env, attr)):
            raise bad(f"{type(env).__name__}.{attr} is not a method")
    if not isinstance(env.name, str) or not isinstance(env.system_prompt, str):
        raise bad("name and system_prompt must be text")
    tags = env.stop_tags
    if (isinstance(tags, str) or not isinstance(tags, (tuple, list)) or not tags
            or not all(isinstance(t, str) and t for t in tags)):
        raise bad(f"stop_tags must be a non-empty tuple of closing tags, got {tags!r}")
    try:
        tasks = env.tasks("train", 1, seed)
    except Exception as exc:
        raise bad(f"tasks('train', 1, {seed}) failed: {_where(exc)}") from exc
    if not isinstance(tasks, (list, tuple)) or len(tasks) != 1:
        raise bad(f"tasks('train', 1, {seed}) must return a list of 1 Task, got {tasks!r:.200}")
    try:
        episode = env.episode(tasks[0], seed)
    except Exception as exc:
        raise bad(f"episode(task, seed) failed: {_where(exc)}") from exc
    wanted = EPISODE_METHODS + (("expert_action",) if need_expert else ())
    missing = [m for m in wanted if not callable(getattr(episode, m, None))]
    if missing:
        why = " (needed for --sft-steps)" if missing == ["expert_action"] else ""
        raise bad(f"its episode {type(episode).__name__} has no method "
                  f"{', '.join(missing)}{why}")
    try:
        first = episode.reset()
    except Exception as exc:
        raise bad(f"episode.reset() failed: {_where(exc)}") from exc
    if not isinstance(first, str):
        raise bad(f"episode.reset() must return text, got {type(first).__name__}")


def _where(exc: BaseException) -> str:
    """'TypeName: message (file.py, line N)': the error and the user's line it came from."""
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if "importlib" not in f.filename and f.filename != __file__]
    at = f" ({user[-1].filename.rsplit('/', 1)[-1]}, line {user[-1].lineno})" if user else ""
    if isinstance(exc, SyntaxError) and exc.lineno:
        at = f" ({(exc.filename or '?').rsplit('/', 1)[-1]}, line {exc.lineno})"
    return f"{type(exc).__name__}: {exc}{at}"
