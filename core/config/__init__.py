"""Configuration: the one flat ``TrainConfig``, its validation, presets, memory budget, environment
options, and the algorithm names from the algorithm registry (core.algorithms). Torch-free:
the web app's pages import core through this package and the registry's torch-free modules.
"""
from core.config import budget
from core.algorithms import estimators
from core.algorithms.catalog import ALGOS, GROUP_ALGOS, REGISTRY
from core.config.budget import ConfigError, available_memory, rollout_memory
from core.config.env_options import (ENV_OPTIONS, Environments, describe_options, env_kwargs,
                                     parse_env_options)
from core.config.presets import PRESETS, preset
from core.config.train_config import TrainConfig, by_algo
from core.config.validation import (CLIP_MODES, DEVICE, ENDPOINT_PREFIX, ENVS, KL_REFERENCES,
                                    LOSS_AGGS, MODELS, RL_MOMENTS, USER_ENV, validate)
from core.envs import plugins as env_plugins

__all__ = [
    "ALGOS", "REGISTRY", "estimators", "CLIP_MODES", "ConfigError", "DEVICE", "ENDPOINT_PREFIX", "ENVS",
    "ENV_OPTIONS", "Environments", "GROUP_ALGOS", "KL_REFERENCES", "LOSS_AGGS", "MODELS", "PRESETS", "RL_MOMENTS",
    "TrainConfig", "USER_ENV", "available_memory", "budget", "by_algo",
    "describe_options", "env_kwargs", "env_plugins", "parse_env_options", "preset",
    "rollout_memory", "validate",
]
