"""The CUDA path, on a machine with a GPU (skipped elsewhere; the CPU side of --device is
tests/test_device.py): weights, adapters, value head, KV cache and rollout on the GPU, bf16
autocast with fp32 logprobs that agree with the CPU's, and the GPU metrics in a real training
step. No DuckDB here (the GPU machine may lack it): the run is kept by bench/gpu.py's in-memory
recorder."""
import math

import pytest
import torch

from core.envs.base import make_env
from core.model.policy import load_policy, token_logprobs
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_policy_lives_on_the_gpu_and_agrees_with_the_cpu():
    cpu = load_policy("tiny", seed=0, value_head=True)
    gpu = load_policy("tiny", seed=0, value_head=True, device="cuda")
    assert gpu.device.type == "cuda" and gpu.value_head.weight.device.type == "cuda"
    assert all(p.device.type == "cuda" for p in gpu.trainable_parameters())
    ids = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids, dtype=torch.bool)
    a = token_logprobs(cpu, ids, mask, with_values=True)
    b = token_logprobs(gpu, ids, mask, with_values=True)
    assert b["logprobs"].device.type == "cpu" and b["logprobs"].dtype == torch.float32
    diff = (a["logprobs"] - b["logprobs"]).abs().max().item()
    print(f"max |logprob cpu fp32 - gpu bf16 autocast| = {diff:.4f}")
    assert diff < 0.1


def test_gpu_rollout_logprobs_match_a_full_forward():
    policy = load_policy("tiny", seed=0, device="cuda")
    env = make_env("bandit")
    tasks = env.tasks("train", 2, 0)
    trajs = rollout(policy, env, tasks, group_size=2, sampling=Sampling(max_turns=1,
                    max_new_tokens=12), seed=0)
    for t in trajs:
        scored = [i for i, tr in enumerate(t.trained) if tr]
        assert scored and all(math.isfinite(t.logprobs[i]) for i in scored)
        ids = torch.tensor([t.token_ids])
        out = token_logprobs(policy, ids, torch.tensor([t.trained]))["logprobs"][0]
        worst = max(abs(out[i].item() - t.logprobs[i]) for i in scored)
        assert worst < 0.1, worst


def test_training_step_on_the_gpu_records_gpu_metrics(tmp_path):
    from bench.gpu import MemoryRecorder
    from core.config import TrainConfig
    from core.run.trainer import train
    rec = MemoryRecorder()
    cfg = TrainConfig(env="bandit", model="tiny", algo="ppo", steps=2, sft_steps=1,
                      group_size=2, tasks_per_step=2, max_turns=1, max_new_tokens=8,
                      eval_every=0, device="cuda", db=str(tmp_path / "unused.duckdb"))
    train(cfg, rec, progress=False)
    assert rec.config["device_resolved"] == "cuda:0"
    for step in (1, 2, 3):
        m = rec.metrics[step]
        assert m["gpu/max_memory_allocated_mb"] > 0 and m["gpu/step_s"] > 0, m
    assert math.isfinite(rec.metrics[3]["grad/norm"])
