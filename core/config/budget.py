"""What a training configuration may ask for: an upper bound on every size, finite numbers, and
an estimate of the memory its rollout needs, checked against what this machine has, so that a
configuration that cannot run is refused by name before any work starts (config.validate calls
these). Torch-free, like core/config/train_config.py.
"""
from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

import psutil


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the field."""


INT_LIMIT = 2 ** 31 - 1
"""Every int field (seeds, intervals) stays within a 32-bit int, which numpy and torch take."""
SIZE_LIMITS: dict[str, int] = {
    "steps": 1_000_000, "sft_steps": 1_000_000, "group_size": 1024, "tasks_per_step": 4096,
    "eval_tasks": 100_000, "max_turns": 1024, "max_new_tokens": 32_768,
    "max_obs_tokens": 131_072, "max_context": 131_072, "topk": 100, "lora_rank": 4096,
    "lora_alpha": 65_536, "sft_batch_size": 4096, "ppo_epochs": 1000, "minibatches": 4096,
    "threads": 4096,
}
"""Upper bounds far above any run this trainer can do on one machine: a value above them is a
typo (or a hostile form), refused by name before the memory estimate multiplies them."""

MODEL_DIMS: dict[str, dict[str, int]] = {
    # (core/model/policy.py's TINY; SmolLM2-135M's config.json). Both use the SmolLM2 tokenizer.
    "tiny": dict(layers=2, kv_heads=2, head_dim=32, vocab=49152, params=6_700_000),
    "smollm2-135m": dict(layers=30, kv_heads=3, head_dim=64, vocab=49152, params=134_515_008),
}
RECORD_BYTES_PER_TOKEN = 336
"""Python-side bytes per context token while a step is rolled out and recorded: measured with
tracemalloc on 64 trajectories of 1,000 tokens, 195 B in the Trajectory's lists (id, text, role,
mask, logprob, turn, entropy) and 336 B once the tokens table's column lists are built. The
insert's own copies come on top, so this is a low estimate: only configurations sure not to fit
are refused."""


def _model_dims(model: str) -> dict[str, int]:
    """Known dims, or read from a local model directory's config.json (0 where unknown)."""
    if model in MODEL_DIMS:
        return MODEL_DIMS[model]
    dims = dict(layers=0, kv_heads=0, head_dim=0, vocab=0, params=0)
    try:
        conf = json.loads((Path(model) / "config.json").read_text())
        heads = int(conf.get("num_attention_heads") or 0)
        dims.update(layers=int(conf.get("num_hidden_layers") or 0),
                    kv_heads=int(conf.get("num_key_value_heads") or heads),
                    head_dim=int(conf.get("head_dim")
                                 or (int(conf.get("hidden_size") or 0) // heads if heads else 0)),
                    vocab=int(conf.get("vocab_size") or 0))
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    try:  # weight files: loaded as fp32, so at least their size (bf16 files double)
        dims["params"] = sum(p.stat().st_size for p in Path(model).glob("*.safetensors")) // 4
    except OSError:
        pass
    return dims


def _tokens_per_trajectory(cfg) -> int:
    return min(cfg.max_context, cfg.max_turns * (cfg.max_new_tokens + cfg.max_obs_tokens))


def _eval_batch(cfg) -> int:
    """Held-out evaluation rolls out eval_tasks trajectories (one per task) in one batch."""
    return cfg.eval_tasks if cfg.eval_every > 0 else 0


def rollout_memory(cfg) -> int:
    """Bytes one rollout batch needs at its longest, estimated before any work starts:

        B x T x (2 x layers x kv_heads x head_dim x 4 + RECORD_BYTES_PER_TOKEN)
        + B x vocab x 4 x 3 + params x 4

    B = max(group_size x tasks_per_step, evaluation batch), T = min(max_context, max_turns x
    (max_new_tokens + max_obs_tokens)): the fp32 KV cache the batch shares (left-padded to the
    longest row), the per-token records, the last position's logits with the sampler's copies,
    and the fp32 weights. The update runs one trajectory at a time and is not counted."""
    dims = _model_dims(cfg.model)
    batch = max(cfg.group_size * cfg.tasks_per_step, _eval_batch(cfg), 1)
    kv = 2 * dims["layers"] * dims["kv_heads"] * dims["head_dim"] * 4
    return (batch * _tokens_per_trajectory(cfg) * (kv + RECORD_BYTES_PER_TOKEN)
            + batch * dims["vocab"] * 4 * 3 + dims["params"] * 4)


def available_memory() -> int:
    """Bytes this process can still allocate: the machine's available memory, or less where a
    cgroup (a container's limit) caps it."""
    have = psutil.virtual_memory().available
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit.isdigit():
            have = min(have, int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(have, 0)


def _gib(n: int) -> str:
    return f"{n / 2 ** 30:,.1f} GiB"


def check_sizes(cfg) -> None:
    """Every number finite and every size bounded, before the range checks compare them."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{f.name}={value!r}: must be a finite number")
        if isinstance(value, int) and not isinstance(value, bool):
            limit = SIZE_LIMITS.get(f.name, INT_LIMIT)
            if abs(value) > limit:
                raise ConfigError(f"{f.name}={value!r}: must be <= {limit:,}"
                                  + (" (and >= its negative)" if f.name == "seed" else ""))


def check_memory(cfg) -> None:
    need, have = rollout_memory(cfg), available_memory()
    if need <= have:
        return
    batch, evals = cfg.group_size * cfg.tasks_per_step, _eval_batch(cfg)
    tokens = _tokens_per_trajectory(cfg)
    if evals > batch:
        fld, what = "eval_tasks", f"{evals:,} held-out trajectories (eval_tasks) in one batch"
    else:
        fld = "group_size"
        what = (f"{cfg.group_size:,} x {cfg.tasks_per_step:,} = {batch:,} trajectories "
                "(group_size x tasks_per_step) in one batch")
    raise ConfigError(
        f"{fld}={getattr(cfg, fld)!r}: the rollout cannot fit in memory: {what}, of up to "
        f"{tokens:,} tokens each (max_turns x (max_new_tokens + max_obs_tokens), at most "
        f"max_context), need about {_gib(need)} for the model, KV cache and records; "
        f"{_gib(have)} is available. Lower {fld}"
        + (" or tasks_per_step" if fld == "group_size" else "") + ", max_turns or max_context.")
