"""Three things the update must get right beyond the loss formulas: PPO's value loss is normalised
per minibatch like the policy loss (the value head's gradient does not depend on ``minibatches``,
in one process or on two ranks), ``lora_dropout`` acts in the update's forward and nowhere else,
and the KL reference is the policy at the start of RL (after SFT) unless ``kl_reference=base``,
also across ``--resume``."""
import json
import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from peft import set_peft_model_state_dict

from core.model import checkpoint
from core.config import ConfigError, TrainConfig, validate
from core.learn.distributed import Ranks
from core.envs.base import make_env
from core.learn.losses import value_loss
from core.model.policy import load_policy, token_logprobs
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling
from core.rollout.sft import demonstrations
from core.run.trainer import TrainingError, train
from core.learn.update import make_samples, policy_update, score_reference, sft_update
from storage import queries
from storage.recorder import Recorder
from tests.test_distributed import _free_port

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def env():
    return make_env("search", seed=0, topk=2)


def _cfg(**kw):
    # no clipping: a constant factor on a gradient must show
    base = dict(env="search", model="tiny", algo="grpo", max_turns=1, max_new_tokens=8, lr=1e-2,
                kl_coef=0.0, max_grad_norm=1e9)
    return TrainConfig(**{**base, **kw})


def _rollouts(pol, env, group_size=2, seed=0):
    return rollout(pol, env, env.tasks("train", 1, 0), group_size=group_size, seed=seed,
                   id_prefix="s1", sampling=Sampling(max_turns=1, max_new_tokens=8, temperature=1.0))


def _perturb_adapters(pol, seed=1):
    """LoRA's B starts at zero, which hides anything done to the adapter's input (dropout)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in pol.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


# -- 1. the value loss is normalised per minibatch --------------------------------------------------
class _HeadGrads(torch.optim.SGD):
    """SGD at lr 0 (every minibatch meets the same weights) keeping the value head's gradient of
    each optimizer step."""

    def __init__(self, policy):
        super().__init__(policy.trainable_parameters(), lr=0.0)
        self.head, self.grads = policy.value_head, []

    def step(self, closure=None):
        self.grads.append(self.head.weight.grad.clone())
        return super().step(closure)


def _copies(traj, n):
    """n copies of one trajectory with returns of 1 at every token: any split of them into
    minibatches has the same token-mean value loss, so the same gradient."""
    out = []
    for i in range(n):
        t = pickle.loads(pickle.dumps(traj))
        t.traj_id = f"{traj.traj_id}-c{i}"
        out.append(t)
    return out


def _ppo_samples(trajs):
    return make_samples(trajs, [torch.ones(len(t.token_ids)) for t in trajs],
                        returns=[torch.ones(len(t.token_ids)) for t in trajs])


def test_value_head_gradient_is_the_same_for_1_2_and_4_minibatches(env):
    pol = load_policy("tiny", value_head=True, seed=0)
    [traj] = _rollouts(pol, env, group_size=1)
    grads = {}
    for mb in (1, 2, 4):
        opt = _HeadGrads(pol)
        result = policy_update(pol, opt, _ppo_samples(_copies(traj, 4)),
                               _cfg(algo="ppo", minibatches=mb))
        assert result.bad is None and len(opt.grads) == mb
        grads[mb] = opt.grads
    whole = grads[1][0]
    # and it is vf_coef x the gradient of the token-mean value loss of the (repeated) trajectory
    s = _ppo_samples(_copies(traj, 1))[0]
    pol.value_head.zero_grad()
    vloss, _ = value_loss(token_logprobs(pol, s.ids, s.mask, with_values=True)["values"],
                          s.returns, s.mask)
    (_cfg().vf_coef * vloss).backward()
    assert whole.abs().max() > 1e-4
    assert torch.allclose(whole, pol.value_head.weight.grad, rtol=1e-4, atol=1e-7)
    for mb in (2, 4):
        for k, g in enumerate(grads[mb]):
            assert torch.allclose(g, whole, rtol=1e-4, atol=1e-7), \
                f"minibatches={mb}, step {k}: value-head gradient {float(g.norm()):.4g} " \
                f"instead of {float(whole.norm()):.4g}"


def _rank_worker(rank: int, world: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    ranks = Ranks.from_env()
    try:
        traj = pickle.loads((Path(folder) / "traj.pkl").read_bytes())
        pol = load_policy("tiny", value_head=True, seed=0)
        opt = _HeadGrads(pol)
        mine = _copies(traj, 4)[2 * rank:2 * rank + 2]  # two copies per rank
        policy_update(pol, opt, _ppo_samples(mine), _cfg(algo="ppo", minibatches=2), ranks=ranks)
        (Path(folder) / f"rank{rank}.pkl").write_bytes(pickle.dumps(opt.grads))
    finally:
        ranks.close()


def test_value_head_gradient_on_two_ranks_with_two_minibatches(env, tmp_path):
    """Each optimizer step takes one copy from each rank: the minibatch is two copies, so its
    value-head gradient is still the single trajectory's."""
    pol = load_policy("tiny", value_head=True, seed=0)
    [traj] = _rollouts(pol, env, group_size=1)
    (tmp_path / "traj.pkl").write_bytes(pickle.dumps(traj))
    mp.spawn(_rank_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    opt = _HeadGrads(pol)
    policy_update(pol, opt, _ppo_samples(_copies(traj, 1)), _cfg(algo="ppo"))
    [one] = opt.grads
    for k in range(2):
        steps = pickle.loads((tmp_path / f"rank{k}.pkl").read_bytes())
        assert len(steps) == 2
        for g in steps:
            assert torch.allclose(g, one, rtol=1e-4, atol=1e-7), (k, float(g.norm()), float(one.norm()))


# -- 2. lora_dropout acts in the update only ----------------------------------------------------------
@pytest.mark.parametrize("dropout", [0.5, 0.0])
def test_lora_dropout_acts_in_the_update_forward_only(env, dropout):
    pol = load_policy("tiny", lora_dropout=dropout, seed=0)
    _perturb_adapters(pol)
    first, again = _rollouts(pol, env, seed=3), _rollouts(pol, env, seed=3)
    # sampling (with its old logprobs) is deterministic whatever the dropout
    assert [t.token_ids for t in first] == [t.token_ids for t in again]
    assert [t.logprobs for t in first] == [t.logprobs for t in again]
    for t, r in zip(first, [1.0, 0.0]):
        t.reward = r
    cfg = _cfg(kl_coef=0.05)

    def scored():
        s = make_samples(first, [torch.full((len(t.token_ids),), a) for t, a in
                                 zip(first, (1.0, -1.0))])
        score_reference(pol, s, cfg)
        return s

    ref_a, ref_b = scored(), scored()
    for a, b in zip(ref_a, ref_b):  # the reference pass too
        assert torch.equal(a.ref_logprobs, b.ref_logprobs)
    opt = torch.optim.SGD(pol.trainable_parameters(), lr=0.0)
    updates = []
    for seed in (0, 1, 0):
        samples = scored()
        policy_update(pol, opt, samples, cfg, seed=seed)
        updates.append([s.new_logprobs for s in samples])
    with torch.no_grad():
        plain = [token_logprobs(pol, s.ids, s.mask)["logprobs"] for s in ref_a]
    differ = any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(updates[0], updates[1]))
    assert differ == (dropout > 0), "two update forwards of the same batch"
    # the same update seed draws the same dropout masks (a resumed run repeats them)
    assert all(torch.equal(a, b) for a, b in zip(updates[0], updates[2]))
    # after the update the network is deterministic again: the old-logprob pass equals the
    # sampling logprobs
    for s, lp, new in zip(ref_a, plain, updates[0]):
        old = s.old_logprobs[s.mask]
        assert torch.allclose(lp[s.mask], old, atol=1e-4)
        if dropout == 0:
            assert torch.allclose(new[s.mask], old, atol=1e-4)
    # SFT's update drops out too
    demos = demonstrations(env, env.tasks("train", 1, 0), pol.tokenizer, Sampling(max_turns=1), 0, "d")
    sft = []
    for seed in (0, 1):
        samples = make_samples(demos)
        sft_update(pol, opt, samples, cfg, seed=seed)
        sft.append(samples[0].new_logprobs)
    assert (not torch.allclose(sft[0], sft[1], atol=1e-6)) == (dropout > 0)


# -- 3. the KL reference is the policy at the start of RL ---------------------------------------------
def test_kl_reference_must_be_sft_or_base():
    assert TrainConfig().kl_reference == "sft"
    validate(TrainConfig(kl_reference="base"))
    with pytest.raises(ConfigError, match="kl_reference"):
        validate(TrainConfig(kl_reference="initial"))


def test_frozen_reference_is_a_copy_that_the_update_does_not_move(env):
    pol = load_policy("tiny", lora_targets="q_proj,v_proj,lm_head", seed=0)
    _perturb_adapters(pol)
    trainable = [n for n, p in pol.model.named_parameters() if p.requires_grad]
    ids = torch.tensor([_rollouts(pol, env, group_size=1)[0].token_ids])
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        before = token_logprobs(pol, ids, mask)["logprobs"]
        with pol.reference():
            base = token_logprobs(pol, ids, mask)["logprobs"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a job log shows every warning
        pol.freeze_reference()
    with torch.no_grad(), pol.reference():
        frozen = token_logprobs(pol, ids, mask)["logprobs"]
    assert torch.equal(frozen, before) and not torch.allclose(frozen, base, atol=1e-4)
    # the copy is not trained, and switching to it and back leaves the trainable set as it was
    assert [n for n, p in pol.model.named_parameters() if p.requires_grad] == trainable
    with torch.no_grad():
        for p in pol.trainable_parameters():
            p.add_(0.01)
        moved = token_logprobs(pol, ids, mask)["logprobs"]
        with pol.reference():
            still = token_logprobs(pol, ids, mask)["logprobs"]
    assert torch.equal(still, frozen) and not torch.allclose(moved, frozen, atol=1e-4)


def _run_cfg(tmp_path, **kw):
    base = dict(env="search", model="tiny", algo="grpo", sft_steps=2, sft_batch_size=2,
                sft_lr=5e-3, steps=1, lr=5e-3, group_size=2, tasks_per_step=1, max_turns=1,
                max_new_tokens=8, eval_every=0, kl_coef=0.05, threads=1, seed=0,
                db=str(tmp_path / "store.duckdb"), checkpoint_dir=str(tmp_path / "ckpt"))
    return TrainConfig(**{**base, **kw})


def _train(cfg):
    return train(cfg, Recorder(cfg.db), progress=False)


def _step_tokens(db, run_id, step):
    """Per train trajectory of a step: its token ids, and the positions, new and reference
    logprobs of its trained tokens."""
    trajs = queries.trajectories(db, run_id, step=step)
    out = []
    for traj_id in trajs[trajs["split"] == "train"]["traj_id"]:
        tok = queries.tokens(db, run_id, traj_id)
        trained = tok[tok["ref_logprob"].notna()]
        out.append((torch.tensor([tok["token_id"].tolist()]), torch.tensor(trained["pos"].tolist()),
                    torch.tensor(trained["new_logprob"].to_numpy()),
                    torch.tensor(trained["ref_logprob"].to_numpy())))
    assert out
    return out


def _metric(db, run_id, name, step):
    m = queries.metrics(db, run_id, [name])
    return float(m[m["step"] == step]["value"].iloc[0])


def test_kl_reference_is_the_policy_after_sft_or_the_base_model(tmp_path):
    cfg = _run_cfg(tmp_path)
    run = _train(cfg)
    [config] = [queries.run_config(c) for c in queries.runs(cfg.db)["config"]]
    assert config["kl_reference"] == "sft"
    # the first RL step's forward meets the post-SFT adapter before any RL update: KL = 0
    for _, _, new, ref in _step_tokens(cfg.db, run, 3):
        assert torch.allclose(new, ref, atol=1e-5)
    assert _metric(cfg.db, run, "policy/kl", 3) < 1e-8

    base_cfg = _run_cfg(tmp_path, kl_reference="base", db=str(tmp_path / "base.duckdb"))
    base_run = _train(base_cfg)
    pol = load_policy("tiny", seed=0)  # the base network is the same in every process
    gap = 0.0
    for ids, pos, new, ref in _step_tokens(base_cfg.db, base_run, 3):
        with torch.no_grad(), pol.reference():
            plain = token_logprobs(pol, ids, torch.ones_like(ids, dtype=torch.bool))["logprobs"][0]
        assert torch.allclose(ref, plain[pos].double(), atol=1e-5)
        gap = max(gap, float((new - ref).abs().max()))
    assert gap > 1e-3, "SFT moved the policy away from the base model"
    assert _metric(base_cfg.db, base_run, "policy/kl", 3) > 1e-6


def test_resume_restores_the_frozen_reference(tmp_path):
    cfg = _run_cfg(tmp_path)
    run = _train(cfg)  # SFT steps 1-2, RL step 3, checkpoint after step 3
    path = checkpoint.checkpoint_dir(cfg, run) / checkpoint.FILE
    state = torch.load(path, weights_only=True)
    reference = state["reference"]
    assert set(reference) == set(state["adapter"])
    # move the saved policy away from its reference, as RL steps would (a random model earns no
    # reward variance to do it in a few steps): a reference taken again at resume would be
    # this moved adapter, KL 0
    gen = torch.Generator().manual_seed(0)
    state["adapter"] = {k: v + 0.05 * torch.randn(v.shape, generator=gen)
                        for k, v in state["adapter"].items()}
    torch.save(state, path)
    _train(cfg.replace(resume=run, steps=2))
    pol = load_policy("tiny", seed=0)
    set_peft_model_state_dict(pol.model, reference)  # the post-SFT policy
    gap = 0.0
    for ids, pos, new, ref in _step_tokens(cfg.db, run, 4):
        with torch.no_grad():
            want = token_logprobs(pol, ids, torch.ones_like(ids, dtype=torch.bool))["logprobs"][0]
        assert torch.allclose(ref, want[pos].double(), atol=1e-5)
        gap = max(gap, float((new - ref).abs().max()))
    assert gap > 1e-3 and _metric(cfg.db, run, "policy/kl", 4) > 1e-6

    # a checkpoint written before kl_reference existed compared to the base model: resuming its
    # RL phase with another reference is refused, naming the option
    state = torch.load(path, weights_only=True)
    config = queries.run_config(state["config"])
    del config["kl_reference"]
    state["config"] = json.dumps(config)
    state.pop("reference")
    torch.save(state, path)
    with pytest.raises(TrainingError, match="kl_reference"):
        _train(cfg.replace(resume=run, steps=3))
