"""Environment options: the ``key=value,key=value`` text of ``env_options`` (and its SFT and
evaluation layers), which options each environment declares (its class's ``OPTIONS``,
core/envs/options.py) and the keyword arguments a run's environments are built with. Torch-free,
like core/config/train_config.py, which re-exports these names.
"""
from __future__ import annotations

import importlib
from functools import cached_property
from typing import Any, Iterator, Mapping

from core.config.budget import ConfigError
from core.config.train_config import TrainConfig
from core.envs.base import BUILTIN, REGISTRY, Environment, make_env
from core.envs.options import Option, OptionError, take_options


def declared_options(env: str) -> dict[str, Option] | None:
    """The options built-in environment ``env`` declares (its class's ``OPTIONS``); None for a
    user's or a plugin's environment, whose module is imported only where the run builds it
    (core/commands/train.py's checked_env): its constructor is the authority on its options, and
    ``take_options`` there checks any it declares the same way."""
    if env not in BUILTIN:
        return None
    if env not in REGISTRY:
        importlib.import_module(BUILTIN[env])  # torch-free: registers the class
    return dict(getattr(REGISTRY[env], "OPTIONS", {}))


def check_env_options(env: str, text: str, field_name: str = "env_options") -> dict[str, Any]:
    """``text`` parsed and checked against ``env``'s declared options: ConfigError naming
    ``field_name`` and, from core/envs/options.py, an unknown option (with the known ones) or
    the option, its value and its bounds. Options of an environment that declares none pass
    as parsed."""
    opts = parse_env_options(text, field_name)
    declared = declared_options(env)
    if declared is not None:
        try:
            take_options(env, declared, opts)
        except OptionError as exc:
            raise ConfigError(f"{field_name}={text!r}: {exc}") from exc
    return opts


def describe_options(env: str) -> str:
    """One line per declared option ('code_mem_mb: integer in 64..1024, default 256 (...)'),
    for help texts; a sentence where the environment declares none here."""
    declared = declared_options(env)
    if declared is None:
        return f"{env}: options go to the environment's own constructor, which checks them"
    if not declared:
        return f"{env} takes no options"
    return "\n".join(f"{name}: {opt.describe()}" + (f" ({opt.doc})" if opt.doc else "")
                     for name, opt in declared.items())


class _DeclaredNames(Mapping):
    """``ENV_OPTIONS[env]``: the option names built-in ``env`` declares, read from its class on
    first use (so this table never restates a constructor)."""

    def __getitem__(self, env: str) -> tuple[str, ...]:
        declared = declared_options(env)
        if declared is None:
            raise KeyError(env)
        return tuple(declared)

    def __iter__(self) -> Iterator[str]:
        return iter(BUILTIN)

    def __len__(self) -> int:
        return len(BUILTIN)


ENV_OPTIONS: Mapping[str, tuple[str, ...]] = _DeclaredNames()
"""Option names per built-in environment (topk and outcome_metric have their own fields)."""


def parse_env_options(text: str, field_name: str = "env_options") -> dict[str, Any]:
    """'a=1,b=0.5,c=true,d=text' -> {'a': 1, 'b': 0.5, 'c': True, 'd': 'text'}; '' -> {}.

    Values are tried as int, then float, then true/false, else kept as text. A value holding a
    comma cannot be written (search/apps ``templates`` take ';' between names instead).
    ConfigError, naming ``field_name``, for a malformed item or a repeated key."""
    out: dict[str, Any] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key.isidentifier() or not raw:
            raise ConfigError(f"{field_name}={text!r}: {item!r} is not key=value "
                              "(write options as key=value,key=value)")
        if key in out:
            raise ConfigError(f"{field_name}={text!r}: {key} given twice")
        out[key] = _option_value(raw)
    return out


def _option_value(raw: str) -> Any:
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    return raw.replace(";", ",")


def env_kwargs(cfg: TrainConfig, sft: bool = False, eval: bool = False) -> dict[str, Any]:
    """Keyword arguments for make_env(cfg.env, ...): seed, topk, the search outcome metric,
    env_options, and over them sft_env_options for the SFT demonstrations' env or
    eval_env_options for the held-out evaluation's env."""
    kwargs: dict[str, Any] = {"seed": cfg.seed, "topk": cfg.topk}
    if cfg.env == "search":
        kwargs["outcome_metric"] = cfg.outcome_metric
    kwargs.update(parse_env_options(cfg.env_options, "env_options"))
    if sft:
        kwargs.update(parse_env_options(cfg.sft_env_options, "sft_env_options"))
    if eval:
        kwargs.update(parse_env_options(cfg.eval_env_options, "eval_env_options"))
    return kwargs


class Environments:
    """A run's environments, each built once and only when first asked for: ``train``; ``sft``
    (the SFT demonstrations') and ``eval`` (held-out evaluation's) are the train environment
    itself unless ``sft_env_options`` / ``eval_env_options`` give them options of their own.
    The trainer, the endpoint collection, branch jobs and cross-evaluation all build them here."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg

    @cached_property
    def train(self) -> Environment:
        return make_env(self.cfg.env, **env_kwargs(self.cfg))

    @cached_property
    def sft(self) -> Environment:
        if not self.cfg.sft_env_options:
            return self.train
        return make_env(self.cfg.env, **env_kwargs(self.cfg, sft=True))

    @cached_property
    def eval(self) -> Environment:
        if not self.cfg.eval_env_options:
            return self.train
        return make_env(self.cfg.env, **env_kwargs(self.cfg, eval=True))

    def of_split(self, split: str) -> Environment:
        """The environment a trajectory of ``split`` (train, sft, eval) was played in."""
        return self.eval if split == "eval" else self.sft if split == "sft" else self.train
