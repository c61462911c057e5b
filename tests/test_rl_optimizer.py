"""The first RL step after SFT must move the adapter in proportion to the RL gradient.

A fresh AdamW's first step is lr * g / |g| = lr * sign(g) on every weight with any gradient: its
size does not depend on the gradient's. One RL step on mostly zero-variance groups (gradient norm
0.07) at lr 2e-4 then halved a sharp post-SFT search policy's held-out success (DESIGN, "One GRPO
step then halved it"). The trainer now starts the RL optimizer from SFT's second moments
(``rl_moments='sft'``, core/learn/update.py ``carry_second_moments``): a small RL gradient takes a
small step.
"""
import copy
import dataclasses

import pytest
import torch

from core.config import PRESETS, ConfigError, TrainConfig, validate
from core.credit.assign import assign
from core.envs.base import make_env
from core.learn.distributed import ONE
from core.learn.update import (carry_second_moments, make_samples, policy_update, sft_update,
                               weight_change)
from core.model.policy import load_policy
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling
from core.rollout.sft import demonstrations
from core.run.steps import build, evaluate, rl_step, sft_step
from core.run.trainer import first_step
from storage.recorder import NullRecorder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LR = 1e-3


@pytest.fixture(scope="module")
def env():
    return make_env("search", seed=0, topk=2)


def _cfg(**kw):
    base = dict(env="search", model="tiny", algo="grpo", max_turns=1, max_new_tokens=8, lr=LR,
                sft_lr=LR, kl_coef=0.0, max_grad_norm=1e9)
    return TrainConfig(**{**base, **kw})


def _after_sft(env, steps=4):
    """A tiny policy after a few real SFT steps on expert demonstrations, and SFT's optimizer."""
    pol = load_policy("tiny", seed=0)
    cfg = _cfg()
    sft_opt = torch.optim.AdamW(pol.trainable_parameters(), lr=LR, weight_decay=0.0)
    demos = demonstrations(env, env.tasks("train", 4, 0), pol.tokenizer,
                           Sampling(max_turns=1, max_obs_tokens=64), seed=0, id_prefix="d")
    for _ in range(steps):
        sft_update(pol, sft_opt, make_samples(demos), cfg)
    return pol, sft_opt


def _rl_step(pol, env, opt, scale: float) -> tuple[float, float]:
    """One GRPO update whose advantages are multiplied by ``scale`` (a batch in which few groups
    disagree has a proportionally small gradient); (mean |dtheta| over weights that had a
    gradient, the gradient norm). Checks the update's own ``update/delta_rms`` on the way."""
    cfg = _cfg()
    trajs = rollout(pol, env, env.tasks("train", 1, 0), group_size=4, seed=0, id_prefix="s",
                    sampling=Sampling(max_turns=1, max_new_tokens=8, temperature=1.0))
    for t, r in zip(trajs, [1.0, 0.0, 0.0, 1.0]):  # a random model never succeeds: grade by hand
        t.reward = r
    samples = make_samples(trajs, [a * scale for a in assign(trajs, cfg).per_token])
    params = pol.trainable_parameters()
    before = [p.detach().clone() for p in params]
    result = policy_update(pol, opt, samples, cfg)
    moved = torch.cat([(p.detach() - b).abs().flatten() for p, b in zip(params, before)])
    assert result.metrics["update/delta_rms"] == pytest.approx(
        float(moved.double().pow(2).mean().sqrt()), rel=1e-4)
    assert result.metrics["update/delta_rel"] > 0
    return float(moved[moved > 0].mean()), result.metrics["grad/norm"]


def _restore(pol, state):
    with torch.no_grad():
        for p, s in zip(pol.trainable_parameters(), state):
            p.copy_(s)


def test_weight_change_by_hand():
    before = [torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])]
    after = [torch.tensor([1.0, 4.0]), torch.tensor([[3.0]])]
    m = weight_change(before, after)  # moved 2 on one of 3 weights; ||w|| = sqrt(14)
    assert m["update/delta_rms"] == pytest.approx((4 / 3) ** 0.5)
    assert m["update/delta_rel"] == pytest.approx(2 / 14 ** 0.5)
    assert weight_change([], []) == {"update/delta_rms": 0.0, "update/delta_rel": 0.0}


def test_fresh_adamw_moves_every_weight_by_lr_whatever_the_gradient(env):
    """The fault itself, measured: a gradient 100x smaller takes the same step."""
    pol, _ = _after_sft(env)
    state = [p.detach().clone() for p in pol.trainable_parameters()]
    steps = {}
    for scale in (1.0, 0.01):
        _restore(pol, state)
        opt = torch.optim.AdamW(pol.trainable_parameters(), lr=LR, weight_decay=0.0)
        steps[scale], _ = _rl_step(pol, env, opt, scale)
    assert steps[1.0] == pytest.approx(LR, rel=0.05)
    assert steps[0.01] == pytest.approx(LR, rel=0.05)


def test_rl_optimizer_seeded_from_sft_steps_in_proportion_to_the_gradient(env):
    pol, sft_opt = _after_sft(env)
    state = [p.detach().clone() for p in pol.trainable_parameters()]
    steps, norms = {}, {}
    for scale in (1.0, 0.01):
        _restore(pol, state)
        opt = torch.optim.AdamW(pol.trainable_parameters(), lr=LR, weight_decay=0.0)
        assert carry_second_moments(sft_opt, opt) == len(pol.trainable_parameters())
        steps[scale], norms[scale] = _rl_step(pol, env, opt, scale)
    # a small gradient takes a small step, far below the fresh optimizer's lr per weight
    # measured: 1.8e-4 and 3.1e-6 (0.18 lr and 0.003 lr; the fresh optimizer: lr and lr)
    assert steps[0.01] < 0.05 * LR, steps
    # the larger gradient also raises v a little (v = beta2 v_sft + (1 - beta2) g^2): less than
    # 100x apart, but nowhere near the fresh optimizer's 1x
    assert steps[1.0] / steps[0.01] > 20, steps
    assert norms[1.0] / norms[0.01] == pytest.approx(100, rel=0.01)
    # SFT's own state is untouched and nothing is carried into an optimizer that already stepped
    assert all(int(s["step"]) == 4 for s in sft_opt.state.values())
    assert carry_second_moments(sft_opt, opt) == 0


def test_trainer_starts_rl_from_sft_second_moments(tmp_path):
    cfg = TrainConfig(env="search", model="tiny", algo="grpo", sft_steps=2, steps=1,
                      group_size=2, tasks_per_step=1, max_turns=1, max_new_tokens=8,
                      eval_every=0, db=str(tmp_path / "x.duckdb"), cost_per_token=0.01)
    run = build(cfg, ONE)
    assert first_step(run, NullRecorder(), "r") == -1
    sft_step(run, 1)
    sft_step(run, 2)
    sft_v = {p: s["exp_avg_sq"].clone() for p, s in run.sft_opt.state.items()}
    assert not run.rl_opt.state
    rl_step(run, 3)
    assert run.rl_opt.state.keys() == sft_v.keys()
    for p, s in run.rl_opt.state.items():
        assert int(s["step"]) == 3  # the carried count goes on
        # v = beta2 * v_sft + (1 - beta2) * g^2 >= beta2 * v_sft
        assert bool((s["exp_avg_sq"] >= 0.999 * sft_v[p] - 1e-20).all())
    fresh = build(cfg.replace(rl_moments="fresh"), ONE)
    sft_step(fresh, 1)
    rl_step(fresh, 2)
    assert all(int(s["step"]) == 1 for s in fresh.rl_opt.state.values())


def test_rl_moments_is_validated():
    with pytest.raises(ConfigError, match="rl_moments"):
        validate(TrainConfig(rl_moments="carry"))


@pytest.mark.slow
def test_one_rl_step_at_a_high_lr_keeps_the_sft_format_only_from_sft_moments(tmp_path):
    """The collapse itself, on the workshop demo (tiny, bandit): after its 30 SFT steps every
    held-out answer is valid; one Dr.GRPO step at lr 1e-2 from a fresh AdamW wrecks the format
    (measured: valid answers 1.0 -> 0.0), the same step from SFT's second moments keeps it."""
    cfg = TrainConfig.from_dict({**PRESETS["workshop-demo"], "lr": 1e-2, "steps": 1,
                                 "eval_tasks": 16, "db": str(tmp_path / "unused.duckdb"),
                                 "checkpoint_dir": str(tmp_path / "ckpt")})
    run = build(cfg, ONE)
    for step in range(1, cfg.sft_steps + 1):
        sft_step(run, step)
    assert evaluate(run, cfg.sft_steps).metrics["eval/valid_action_ratio"] >= 0.9
    params = run.policy.trainable_parameters()
    after_sft = [p.detach().clone() for p in params]
    sft_state = copy.deepcopy(run.sft_opt.state_dict())
    valid = {}
    for mode in ("fresh", "sft"):
        with torch.no_grad():
            for p, s in zip(params, after_sft):
                p.copy_(s)
        run.sft_opt.load_state_dict(copy.deepcopy(sft_state))
        run = dataclasses.replace(run, cfg=cfg.replace(rl_moments=mode),
                                  rl_opt=torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0))
        rl_step(run, cfg.sft_steps + 1)  # the same rollouts both times (same policy and seed)
        valid[mode] = evaluate(run, cfg.sft_steps + 1).metrics["eval/valid_action_ratio"]
    assert valid["fresh"] <= 0.5, valid  # the fault: one step, the format is gone
    assert valid["sft"] >= 0.9, valid
