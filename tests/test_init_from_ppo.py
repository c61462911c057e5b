"""--init-from an SFT checkpoint of a run without a value head (e.g. grpo) into PPO, which adds
one: the adapter and the SFT moments of the LoRA weights are loaded, the value head's moments
start fresh, and RL trains from the checkpoint's adapter."""
from __future__ import annotations

import pytest
import torch

from core.model import checkpoint
from storage import queries
from tests.test_init_from import _cfg, _train


@pytest.mark.parametrize("moments", ["sft", "fresh"])
def test_ppo_starts_from_an_sft_checkpoint_without_a_value_head(tmp_path, moments):
    sft_run = _train(_cfg(tmp_path, sft_steps=1, steps=0, db=str(tmp_path / "sft.duckdb")))
    start = checkpoint.checkpoint_dir(_cfg(tmp_path), sft_run)
    ckpt = checkpoint.load(start)
    assert (ckpt.phase, ckpt.step, ckpt.value_head) == ("sft", 1, None)
    assert ckpt.optimizer["state"]  # SFT stepped: there are moments to carry

    cfg = _cfg(tmp_path, algo="ppo", sft_steps=1, rl_moments=moments, init_from=str(start),
               db=str(tmp_path / "ppo.duckdb"))
    run = _train(cfg)
    assert set(queries.trajectories(cfg.db, run)["step"]) == {2}
    # the policy the PPO run started from is the checkpoint's adapter, not a fresh LoRA
    kept = checkpoint.load_adapter(checkpoint.checkpoint_dir(cfg, run), 1)
    assert kept["value_head"] is not None
    assert all(torch.equal(kept["adapter"][k], ckpt.adapter[k]) for k in ckpt.adapter)
    after = checkpoint.load(checkpoint.checkpoint_dir(cfg, run))
    assert (after.phase, after.step) == ("rl", 2) and after.value_head is not None
    # the RL optimizer covers the LoRA weights and the value head; with rl_moments=sft the
    # LoRA weights' AdamW went on from SFT's step count (loaded from the checkpoint), the value
    # head's started fresh; with fresh, every weight took its first step
    lora = len(ckpt.optimizer["param_groups"][0]["params"])
    ids = after.optimizer["param_groups"][0]["params"]
    assert len(ids) == lora + 2
    steps = [float(after.optimizer["state"][i]["step"]) for i in ids]
    assert steps[:lora] == [2.0 if moments == "sft" else 1.0] * lora
    assert steps[lora:] == [1.0, 1.0]


def test_an_sft_checkpoint_with_a_value_head_goes_on_without_one(tmp_path):
    sft_run = _train(_cfg(tmp_path, algo="ppo", sft_steps=1, steps=0))
    start = checkpoint.checkpoint_dir(_cfg(tmp_path), sft_run)
    ckpt = checkpoint.load(start)
    assert ckpt.value_head is not None
    cfg = _cfg(tmp_path, sft_steps=1, init_from=str(start), db=str(tmp_path / "grpo.duckdb"))
    run = _train(cfg)
    kept = checkpoint.load_adapter(checkpoint.checkpoint_dir(cfg, run), 1)
    assert kept["value_head"] is None
    assert all(torch.equal(kept["adapter"][k], ckpt.adapter[k]) for k in ckpt.adapter)
    after = checkpoint.load(checkpoint.checkpoint_dir(cfg, run))
    lora = len(after.optimizer["param_groups"][0]["params"])
    assert lora == len(ckpt.optimizer["param_groups"][0]["params"]) - 2
    assert {float(s["step"]) for s in after.optimizer["state"].values()} == {2.0}
