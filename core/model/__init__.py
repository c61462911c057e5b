"""The model: loading a base LM (tiny, SmolLM2, a local directory or GGUF) with its LoRA adapter,
scoring tokens, the KV cache rollouts share, the device, and adapter checkpoints.

    models      where each named model's files are and how they load (no hub downloads)
    policy      the LoRA policy: logprobs, generation, token text
    kv_cache    the batched KV cache the episode engine grows turn by turn
    device      CPU or CUDA, threads, the sampling pass's precision
    checkpoint  the adapter snapshots kept for branch and evaluation jobs
"""
import importlib

# Each name loads its module on first use (PEP 562), so importing one light module of this
# package (a dataclass, a pure function) does not load torch with its heavier siblings.
_EXPORTS = {
    "Batch": ("core.model.kv_cache", "Batch"),
    "ModelNotAvailable": ("core.model.models", "ModelNotAvailable"),
    "Policy": ("core.model.policy", "Policy"),
    "load_base_model": ("core.model.models", "load_base_model"),
    "load_policy": ("core.model.policy", "load_policy"),
    "load_tokenizer": ("core.model.models", "load_tokenizer"),
    "policy_from_config": ("core.model.policy", "policy_from_config"),
    "resolve": ("core.model.device", "resolve"),
    "token_logprobs": ("core.model.policy", "token_logprobs"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    return getattr(importlib.import_module(module), attr)
