"""The model: loading a base LM (tiny, SmolLM2, a local directory or GGUF) with its LoRA adapter,
scoring tokens, the KV cache rollouts share, the device, and adapter checkpoints.

    models      where each named model's files are and how they load (no hub downloads)
    policy      the LoRA policy: logprobs, generation, token text
    kv_cache    the batched KV cache the episode engine grows turn by turn
    device      CPU or CUDA, threads, the sampling pass's precision
    checkpoint  the adapter snapshots kept for branch and evaluation jobs
"""
from core.faces import lazy_face

__getattr__, __all__ = lazy_face(__name__, {
    "Batch": "core.model.kv_cache",
    "ModelNotAvailable": "core.model.models",
    "Policy": "core.model.policy",
    "load_base_model": "core.model.models",
    "load_policy": "core.model.policy",
    "load_tokenizer": "core.model.models",
    "policy_from_config": "core.model.policy",
    "resolve": "core.model.device",
    "token_logprobs": "core.model.policy",
})
