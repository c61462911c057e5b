"""Environment options: the ``key=value,key=value`` text of ``env_options`` (and its SFT and
evaluation layers), which environment takes which option, and the keyword arguments a run's
environments are built with. Torch-free, like core/config.py, which re-exports these names.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.budget import ConfigError

if TYPE_CHECKING:
    from core.config import TrainConfig


ENV_OPTIONS: dict[str, tuple[str, ...]] = {
    "search": ("two_hop_frac", "templates", "world_seed"),
    "apps": ("templates", "code_cpu_s", "code_wall_s", "code_mem_mb"),
    "frozenlake": ("size", "slip", "max_actions", "actions_per_turn"),
    "sokoban": ("size", "max_actions", "actions_per_turn"),
    "bandit": ("arms", "expert"),
}
"""Options each environment's constructor takes through env_options (topk and outcome_metric
have their own fields; the env checks the values)."""


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
