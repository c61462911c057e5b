"""A checkpoint of a LoRA adapter on ``lm_head`` (the workshop-demo preset's targets): saved
without peft's per-step warning, holding the adapter only, and restored exactly."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from core.model import checkpoint  # noqa: E402
from core.model.policy import load_policy  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TARGETS = "q_proj,v_proj,lm_head"


def test_lm_head_adapter_checkpoint_is_quiet_small_and_restores(tmp_path):
    policy = load_policy("tiny", lora_rank=4, lora_targets=TARGETS, seed=0)
    with torch.no_grad():                               # a trained adapter: B no longer zero
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    trained = {n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" in n}
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checkpoint.save(tmp_path, policy, opt, step=3, phase="rl", config={"model": "tiny"})
    assert [str(w.message) for w in caught] == []
    saved = checkpoint.load(tmp_path)
    assert saved.adapter and all("lora_" in k for k in saved.adapter), \
        [k for k in saved.adapter if "lora_" not in k][:3]   # no copy of the frozen embeddings

    fresh = load_policy("tiny", lora_rank=4, lora_targets=TARGETS, seed=1)
    checkpoint.restore(saved, fresh, torch.optim.AdamW(fresh.trainable_parameters(), lr=1e-3))
    restored = {n: p for n, p in fresh.model.named_parameters() if "lora_" in n}
    assert restored.keys() == trained.keys()
    for name, value in trained.items():
        assert torch.equal(restored[name], value), name
