"""The rollout samples with the LoRA adapter merged into the weights (core/model/policy.py
``Policy.merged``): one product a linear layer, the same distribution up to float rounding, and
the base weights and the LoRA layers exactly as they were afterwards, even after an error."""
from __future__ import annotations

import pytest
import torch

from core.envs.base import make_env
from core.model.policy import load_policy
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _trained(policy):
    """The adapter as after some training: B is zero only at initialisation."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return policy


def _lora_calls(policy) -> list[int]:
    """A counter of calls into any LoRA A matrix (the unmerged path's extra products)."""
    calls = [0]
    for name, m in policy.model.named_modules():
        if name.endswith("lora_A.default"):
            m.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.fixture(scope="module")
def pol():
    return _trained(load_policy("tiny", seed=0))


def test_merged_computes_the_same_distribution_without_the_adapter_products(pol):
    ids = torch.randint(3, 1000, (2, 24), generator=torch.Generator().manual_seed(0))
    params = {n: (p, p.detach().clone()) for n, p in pol.model.named_parameters()}
    modules = dict(pol.model.named_modules())
    calls = _lora_calls(pol)
    with torch.no_grad():
        unmerged = pol.model(input_ids=ids).logits
        assert calls[0] > 0
        calls[0] = 0
        with pol.merged():
            merged = pol.model(input_ids=ids).logits
            assert calls[0] == 0  # no LoRA layer on the path: one product a layer
        after = pol.model(input_ids=ids).logits
        with pol.reference():  # no frozen copy: the base model, adapter off
            base = pol.model(input_ids=ids).logits
    # the adapter matters here, and the merged network computes what it computes
    assert (unmerged - base).abs().max() > 1e-2
    torch.testing.assert_close(merged, unmerged, atol=1e-4, rtol=1e-4)
    # back exactly: same parameters, same values bit for bit, same modules, same logits
    assert torch.equal(after, unmerged)
    for name, (p, value) in params.items():
        now = dict(pol.model.named_parameters())[name]
        assert now is p and torch.equal(now, value), name
    assert all(dict(pol.model.named_modules())[n] is m for n, m in modules.items())


def test_the_layers_come_back_when_the_body_raises(pol):
    before = dict(pol.model.named_modules())
    with pytest.raises(RuntimeError, match="inside"):
        with pol.merged():
            assert dict(pol.model.named_modules()).keys() != before.keys()
            raise RuntimeError("inside")
    assert dict(pol.model.named_modules()).keys() == before.keys()
    assert all(dict(pol.model.named_modules())[n] is m for n, m in before.items())


def test_a_tied_head_merges_without_changing_the_input_embeddings():
    policy = _trained(load_policy("tiny", seed=0, lora_targets="q_proj,lm_head"))
    embed = policy.base.get_input_embeddings().weight.detach().clone()
    ids = torch.randint(3, 1000, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        unmerged = policy.model(input_ids=ids).logits
        with policy.merged():
            assert torch.equal(policy.base.get_input_embeddings().weight, embed)
            merged = policy.model(input_ids=ids).logits
    torch.testing.assert_close(merged, unmerged, atol=1e-4, rtol=1e-4)
    assert torch.equal(policy.base.get_input_embeddings().weight, embed)


def test_switched_off_adapters_stay_off(pol):
    """Inside ``reference()`` without a frozen copy the network is the base model: nothing to
    merge, and merging must not switch the adapter back on."""
    ids = torch.randint(3, 1000, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), pol.reference():
        base = pol.model(input_ids=ids).logits
        with pol.merged():
            assert torch.equal(pol.model(input_ids=ids).logits, base)


def test_a_rollout_samples_merged_and_records_the_same_trajectories(pol):
    """The rollout's sampling runs without the adapter's products; the tokens are those of the
    unmerged network, their logprobs equal up to rounding, and the weights come back intact."""
    env = make_env("search", seed=0)
    tasks = env.tasks("train", 1, 0)
    sampling = Sampling(max_turns=2, max_new_tokens=12)
    weights = {n: p.detach().clone() for n, p in pol.model.named_parameters()}
    calls = _lora_calls(pol)
    merged = rollout(pol, env, tasks, group_size=4, sampling=sampling, seed=5)
    assert calls[0] == 0
    unmerged = rollout(pol, env, tasks, group_size=4, sampling=sampling, seed=5,
                       merge_adapter=False)
    assert calls[0] > 0
    for a, b in zip(merged, unmerged):
        assert a.token_ids == b.token_ids
        lp = [(x, y) for x, y in zip(a.logprobs, b.logprobs) if x is not None]
        assert lp and max(abs(x - y) for x, y in lp) < 1e-4
    assert all(torch.equal(p, weights[n]) for n, p in pol.model.named_parameters())
