"""What a training configuration may hold: the names each choice field accepts and ``validate``,
which refuses out-of-range values by name before any work starts. Torch-free, like
core/config/train_config.py, which re-exports every name here (pages import them from there).

Sizes and the memory estimate are core/config/budget.py's; environment options core/config/env_options.py's.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from core.config import budget
from core.algorithms.catalog import ALGOS, GROUP_ALGOS
from core.config.budget import ConfigError
from core.config.env_options import check_env_options
from core.envs.base import BUILTIN
from core.envs import plugins as env_plugins  # torch-free: reads package metadata only

if TYPE_CHECKING:
    from core.config.train_config import TrainConfig
from urllib.parse import urlsplit

ENVS = tuple(BUILTIN)
"""The built-in environments, as core/envs/base.py lists them (one list: a new env is added there)."""
GAMES = tuple(name for name, module in BUILTIN.items() if module.startswith("core.envs.games."))
"""RAGEN-style text games: every action is a move, none an answer."""
USER_ENV = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_]\w*")
"""``--env package.module:Factory``: a user's environment (core/envs/base.py's protocol)."""
MODELS = ("tiny", "smollm2-135m")
ENDPOINT_PREFIX = "openai:"
"""``--model openai:URL``: an OpenAI-compatible server as the policy (core/run/collection.py)."""
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
"""``--device``: auto (CUDA when present, else CPU) | cpu | cuda | cuda:N (core/model/device.py)."""
LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
CLIP_MODES = ("ppo", "log")
KL_REFERENCES = ("sft", "base")
RL_MOMENTS = ("sft", "fresh")
GIGPO_NORMS = ("std", "none")
"""GiGPO's normalisation: verl-agent's mean_std_norm (std) and mean_norm (none)."""


def validate(cfg: TrainConfig) -> TrainConfig:
    """Refuse values that cannot work, naming the field. Returns cfg for chaining."""
    def need(cond: bool, fld: str, why: str) -> None:
        if not cond:
            raise ConfigError(f"{fld}={getattr(cfg, fld)!r}: {why}")

    budget.check_sizes(cfg)
    for check in (_check_what, _check_endpoint, _check_rollout, _check_evaluation, _check_model,
                  _check_optimiser, _check_credit, _check_system):
        check(cfg, need)
    budget.check_memory(cfg)
    return cfg


def _check_what(cfg: TrainConfig, need) -> None:
    """What is trained: the environment, the model, the algorithm, steps and group sizes."""
    need(cfg.env in ENVS or USER_ENV.fullmatch(cfg.env) is not None
         or cfg.env in env_plugins.installed(), "env",
         f"must be one of {', '.join(ENVS)}, package.module:Factory (a user's environment) or "
         f"an installed plugin's name ({env_plugins.GROUP} entry points)")
    need(cfg.model.startswith(ENDPOINT_PREFIX) or cfg.model in MODELS or Path(cfg.model).is_dir()
         or (cfg.model.endswith(".gguf") and Path(cfg.model).is_file()), "model",
         f"must be one of {', '.join(MODELS)}, an existing local model directory or a .gguf file")
    need(cfg.algo in ALGOS, "algo", f"must be one of {', '.join(ALGOS)}")
    need(cfg.steps >= 0, "steps", "must be >= 0")
    need(cfg.sft_steps >= 0, "sft_steps", "must be >= 0")
    need(cfg.group_size >= 1, "group_size", "must be >= 1")
    # an endpoint policy trains nothing: one rollout per task is a plain evaluation
    need(cfg.group_size >= 2 or cfg.algo not in GROUP_ALGOS
         or cfg.model.startswith(ENDPOINT_PREFIX), "group_size",
         f"{cfg.algo} compares rollouts within a group: needs group_size >= 2")
    need(cfg.tasks_per_step >= 1, "tasks_per_step", "must be >= 1")
    need(cfg.max_turns >= 1, "max_turns", "must be >= 1")


def _check_rollout(cfg: TrainConfig, need) -> None:
    """How rollouts sample: the task pool, turns, tokens, temperature."""
    need(cfg.task_pool >= 0, "task_pool", "must be >= 0 (0 = the whole train split)")
    need(not cfg.final_answer_turn or cfg.env not in GAMES,
         "final_answer_turn", f"{cfg.env} has no answer action: every action is a move")
    need(cfg.max_new_tokens >= 1, "max_new_tokens", "must be >= 1")
    need(cfg.max_obs_tokens >= 1, "max_obs_tokens", "must be >= 1")
    need(cfg.max_context >= 64, "max_context", "must be >= 64")
    need(cfg.temperature >= 0, "temperature", "must be >= 0")
    need(0 < cfg.top_p <= 1, "top_p", "must be in (0, 1]")


def _check_evaluation(cfg: TrainConfig, need) -> None:
    """Held-out evaluation, warm starts and checkpoints."""
    need(cfg.eval_temperature >= 0, "eval_temperature", "must be >= 0")
    need(cfg.eval_every >= 0, "eval_every", "must be >= 0")
    need(cfg.sft_eval_every >= 0, "sft_eval_every", "must be >= 0")
    need(cfg.eval_tasks >= 0, "eval_tasks", "must be >= 0")
    need(cfg.eval_seed >= -1, "eval_seed", "must be >= 0, or -1 for the run's seed")
    # "checkpoint.pt" is core/model/checkpoint.py's FILE (that module imports torch; this one must not)
    need(not cfg.init_from or Path(cfg.init_from).is_file()
         or (Path(cfg.init_from) / "checkpoint.pt").is_file(), "init_from",
         "must be a run's checkpoint directory or its checkpoint.pt file")
    need(cfg.checkpoint_every >= 1, "checkpoint_every", "must be >= 1")
    need(cfg.adapter_every >= 0, "adapter_every", "must be >= 0")


def _check_model(cfg: TrainConfig, need) -> None:
    """Retrieval depth and the LoRA adapter."""
    need(cfg.topk >= 1, "topk", "must be >= 1")
    need(cfg.lora_rank >= 1, "lora_rank", "must be >= 1")
    need(cfg.lora_alpha > 0, "lora_alpha", "must be > 0")
    need(0 <= cfg.lora_dropout < 1, "lora_dropout", "must be in [0, 1)")
    need(bool(cfg.lora_targets.strip()), "lora_targets", "must name at least one module")


def _check_optimiser(cfg: TrainConfig, need) -> None:
    """Learning rates, the loss, clipping, KL, the critic and the update's guards."""
    need(0 < cfg.lr < 1, "lr", "must be in (0, 1)")
    need(0 < cfg.sft_lr < 1, "sft_lr", "must be in (0, 1)")
    need(cfg.sft_batch_size >= 1, "sft_batch_size", "must be >= 1")
    need(cfg.rl_moments in RL_MOMENTS, "rl_moments", f"must be one of {', '.join(RL_MOMENTS)}")
    need(cfg.kl_coef >= 0, "kl_coef", "must be >= 0")
    need(cfg.kl_reference in KL_REFERENCES, "kl_reference",
         f"must be one of {', '.join(KL_REFERENCES)}")
    need(0 <= cfg.clip_eps_low < 1, "clip_eps_low", "must be in [0, 1)")
    need(cfg.clip_eps_high >= 0, "clip_eps_high", "must be >= 0")
    need(cfg.clip_mode in CLIP_MODES, "clip_mode", f"must be one of {', '.join(CLIP_MODES)}")
    need(cfg.dual_clip == 0 or cfg.dual_clip > 1, "dual_clip", "must be 0 (off) or > 1")
    need(cfg.loss_agg in LOSS_AGGS, "loss_agg", f"must be one of {', '.join(LOSS_AGGS)}")
    need(cfg.ppo_epochs >= 1, "ppo_epochs", "must be >= 1")
    need(cfg.minibatches >= 1, "minibatches", "must be >= 1")
    need(cfg.max_grad_norm > 0, "max_grad_norm", "must be > 0")
    need(cfg.min_abs_advantage >= 0, "min_abs_advantage", "must be >= 0")
    need(0 < cfg.starpo_keep <= 1, "starpo_keep", "must be in (0, 1]")
    need(0 <= cfg.gigpo_gamma <= 1, "gigpo_gamma", "must be in [0, 1]")
    need(cfg.gigpo_norm in GIGPO_NORMS, "gigpo_norm",
         "must be std (divide by the group's std) or none (only centre)")
    need(cfg.gigpo_episode_stats in ("steps", "trajectories"), "gigpo_episode_stats",
         "must be steps (one entry per turn, verl-agent's default) or trajectories (the paper's)")
    need(0 <= cfg.gamma <= 1, "gamma", "must be in [0, 1]")
    need(0 <= cfg.lam <= 1, "lam", "must be in [0, 1]")
    need(cfg.vf_coef >= 0, "vf_coef", "must be >= 0")
    need(cfg.value_clip >= 0, "value_clip", "must be >= 0 (0 = no value clip; verl uses 0.5)")
    need(cfg.kl_abort > 0, "kl_abort", "must be > 0")
    need(cfg.max_bad_steps >= 1, "max_bad_steps", "must be >= 1")


def _check_credit(cfg: TrainConfig, need) -> None:
    """Rewards, dense per-turn credit and rollout correction."""
    need(cfg.outcome_metric in ("em", "f1"), "outcome_metric", "must be em or f1")
    need(cfg.w_info_gain >= 0, "w_info_gain", "must be >= 0")
    need(0 <= cfg.info_gain_gamma <= 1, "info_gain_gamma", "must be in [0, 1]")
    need(cfg.info_gain_type in ("prob", "log_prob"), "info_gain_type",
         "must be 'prob' (IGPO's paper) or 'log_prob' (its released script)")
    need(0 < cfg.env_step_timeout <= 86_400, "env_step_timeout",
         "must be in (0, 86400] seconds (one env.step / outcome call's deadline)")
    need(cfg.rollout_dtype in ("auto", "fp32", "bf16"), "rollout_dtype",
         "must be auto, fp32 or bf16")
    need(cfg.rollout_correction in ("none", "tis", "mis", "rs"), "rollout_correction",
         "must be none, tis, mis or rs")
    need(cfg.rollout_is_cap >= 1, "rollout_is_cap", "must be >= 1 (the band is [1/C, C])")
    need(cfg.rollout_correction_level in ("token", "sequence"), "rollout_correction_level",
         "must be token or sequence")
    need(cfg.w_spa >= 0, "w_spa", "must be >= 0")
    need(cfg.w_prm >= 0, "w_prm", "must be >= 0")
    need(0 <= cfg.prm_gamma <= 1, "prm_gamma", "must be in [0, 1] (AgentPRM's discount)")
    need(cfg.spa_l2 >= 0, "spa_l2", "must be >= 0 (0: the exact least-squares fit)")


def _check_system(cfg: TrainConfig, need) -> None:
    """Environment options, threads, the device and the store."""
    for fld in ("env_options", "sft_env_options", "eval_env_options"):
        check_env_options(cfg.env, getattr(cfg, fld), fld)  # ConfigError naming fld and option
    need(cfg.threads >= 0, "threads", "must be >= 0")
    need(DEVICE.fullmatch(cfg.device.strip().lower()) is not None, "device",
         "must be auto, cpu, cuda or cuda:N")
    need(bool(cfg.db.strip()), "db", "must name a database file")




def _check_endpoint(cfg: TrainConfig, need) -> None:
    """The endpoint fields' ranges; for ``--model openai:URL`` an http(s) URL that carries no
    credentials (the key comes from the environment only, so it never reaches the store) and a
    model name."""
    need(1 <= cfg.endpoint_concurrency <= 256, "endpoint_concurrency", "must be in 1..256")
    need(cfg.endpoint_timeout > 0, "endpoint_timeout", "must be > 0")
    need(0 <= cfg.endpoint_retries <= 20, "endpoint_retries", "must be in 0..20")
    need(cfg.endpoint_backoff >= 0, "endpoint_backoff", "must be >= 0")
    need(0 <= cfg.endpoint_top_logprobs <= 20, "endpoint_top_logprobs", "must be in 0..20")
    if not cfg.model.startswith(ENDPOINT_PREFIX):
        return
    try:
        url = urlsplit(cfg.model[len(ENDPOINT_PREFIX):])
        port_ok = url.port is None or url.port > 0
    except ValueError:
        url, port_ok = None, False
    need(url is not None and port_ok and url.scheme in ("http", "https") and bool(url.hostname),
         "model", "openai:URL needs an http:// or https:// URL, e.g. "
         "openai:http://127.0.0.1:8000/v1")
    need(url.username is None and url.password is None and not url.query, "model",
         "the URL must not carry credentials or a query: put the API key in "
         "AGENTRL_OPENAI_API_KEY (or OPENAI_API_KEY)")
    need(bool(cfg.model_name.strip()), "model_name",
         "--model openai:URL needs --model-name, the server's name of the model")
