"""Losses on hand-computed tensors (the arithmetic is written out in comments)."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from core.learn.losses import (AGGREGATIONS, agg_loss, entropy_from_logits, kl_k3, policy_loss,
                         value_loss)

T = torch.tensor
LN = math.log


# ----------------------------------------------------------------------------------- aggregation

# ragged: row 0 has 3 trained tokens, row 1 one, row 2 none
X = T([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
M = T([[True, True, True, False], [True, False, False, False], [False] * 4])


def test_agg_modes_on_ragged_mask():
    # token-mean: (1 + 2 + 3 + 10) / 4 = 4
    assert agg_loss(X, M, "token-mean").item() == pytest.approx(4.0)
    # seq-mean-token-mean: row means 2 and 10; the empty row is not a sequence -> 6
    assert agg_loss(X, M, "seq-mean-token-mean").item() == pytest.approx(6.0)
    # seq-mean-token-sum-norm, T_max = 4: row sums 6, 10, 0 -> /4 = 1.5, 2.5, 0 -> mean of 3 = 4/3
    assert agg_loss(X, M, "seq-mean-token-sum-norm").item() == pytest.approx(4 / 3)
    # a constant T_max = 2: 3, 5, 0 -> 8/3
    assert agg_loss(X, M, "seq-mean-token-sum-norm", t_max=2).item() == pytest.approx(8 / 3)


def test_agg_empty_mask_is_zero_and_unknown_mode_names_choices():
    none = torch.zeros_like(M)
    for mode in AGGREGATIONS:
        assert agg_loss(X, none, mode).item() == 0.0
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean, seq-mean-token-sum-norm"):
        agg_loss(X, M, "seq-mean-token-sum")
    with pytest.raises(ValueError, match="bool"):
        agg_loss(X, M.float(), "token-mean")


def test_agg_ignores_nan_in_untrained_positions():
    x = X.clone()
    x[0, 3] = float("nan")
    x[2] = float("inf")
    for mode in AGGREGATIONS:
        assert torch.isfinite(agg_loss(x, M, mode))


# ------------------------------------------------------------------------------------------- KL


def test_kl_k3_zero_when_equal_and_hand_computed():
    lp = T([[LN(0.5), LN(0.1)]])
    assert torch.equal(kl_k3(lp, lp), torch.zeros(1, 2))
    # ref - lp = ln(0.25 / 0.5) = -0.693147: k3 = 0.5 + 0.693147 - 1 = 0.193147
    assert kl_k3(T([LN(0.5)]), T([LN(0.25)])).item() == pytest.approx(0.193147, abs=1e-6)
    # extreme log-ratio: clamped to 10 rather than e^50
    assert kl_k3(T([-60.0]), T([-10.0])).item() == 10.0


@settings(max_examples=100, deadline=None)
@given(st.floats(-30, 0), st.floats(-30, 0))
def test_property_kl_k3_nonnegative(lp, ref):
    k = kl_k3(T([lp], dtype=torch.float64), T([ref], dtype=torch.float64)).item()
    assert k >= 0
    if abs(lp - ref) > 1e-3:
        assert k > 0


def test_entropy_from_logits():
    logits = T([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, -1.0]])
    h = entropy_from_logits(logits)
    assert h[0].item() == pytest.approx(math.log(4))  # uniform over 4
    assert h[1].item() == pytest.approx(0.0, abs=1e-6)  # one certain token
    assert torch.allclose(h, torch.distributions.Categorical(logits=logits).entropy(), atol=1e-6)


# ---------------------------------------------------------------------------------- policy loss


def _clip_case():
    # token:      0      1      2      3      4 (untrained, garbage)
    # ratio r:   1.5    0.5    1.5    0.5    e^200
    # advantage: +1     +1     -1     -1     +5
    old = T([[0.0, 0.0, 0.0, 0.0, -100.0]])
    lp = T([[LN(1.5), LN(0.5), LN(1.5), LN(0.5), 100.0]], requires_grad=True)
    adv = T([[1.0, 1.0, -1.0, -1.0, 5.0]])
    mask = T([[True, True, True, True, False]])
    return lp, old, adv, mask


def test_ppo_clip_positive_and_negative_advantages():
    lp, old, adv, mask = _clip_case()
    loss, m = policy_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    # bounds [0.8, 1.2]; pg = max(-A r, -A clip(r)):
    #   t0 A>0 r=1.5: max(-1.5, -1.2) = -1.2  clipped (high: no more credit for pushing r up)
    #   t1 A>0 r=0.5: max(-0.5, -0.8) = -0.5  unclipped (still pulled up)
    #   t2 A<0 r=1.5: max( 1.5,  1.2) =  1.5  unclipped (still pushed down)
    #   t3 A<0 r=0.5: max( 0.5,  0.8) =  0.8  clipped (low)
    # token-mean = (-1.2 - 0.5 + 1.5 + 0.8) / 4 = 0.15
    assert loss.item() == pytest.approx(0.15, abs=1e-6)
    assert m["policy/pg_loss"] == pytest.approx(0.15, abs=1e-6)
    assert (m["policy/clipfrac"], m["policy/clipfrac_low"], m["policy/clipfrac_high"]) == (
        0.5, 0.25, 0.25)
    assert m["policy/ratio_min"] == pytest.approx(0.5) and m["policy/ratio_max"] == pytest.approx(1.5)
    # approx_kl = mean(r - 1 - ln r): 2 * (0.5 - 0.405465) + 2 * (-0.5 + 0.693147) = 0.575364 / 4
    assert m["policy/approx_kl"] == pytest.approx(0.575364 / 4, abs=1e-6)
    assert m["policy/kl"] == 0.0
    loss.backward()
    # d/dlp of -A r = -A r: t1 -> -0.5/4, t2 -> +1.5/4; clipped tokens and the untrained one -> 0
    assert torch.allclose(lp.grad, T([[0.0, -0.125, 0.375, 0.0, 0.0]]), atol=1e-6)


def test_clip_higher_lets_positive_tokens_rise_further():
    lp, old, adv, mask = _clip_case()
    # StarPO-S 0.2 / 0.28: with r = 1.25 and A > 0, PPO-0.2 clips (1.25 > 1.2) but 0.28 does not
    lp = T([[LN(1.25), 0.0, 0.0, 0.0, 0.0]])
    adv = T([[1.0, 0.0, 0.0, 0.0, 0.0]])
    _, sym = policy_loss(lp, old, adv, mask)
    _, hi = policy_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    assert sym["policy/clipfrac_high"] == 0.25 and hi["policy/clipfrac_high"] == 0.0


def test_log_clip_bounds():
    # eps 0.1: PPO bounds [0.9, 1.1]; LOOP's log-space bounds [1/1.1, 1.1] = [0.909091, 1.1]
    # r = 0.905 with A = -1: PPO leaves it (0.905 > 0.9) -> pg 0.905; log clip -> max(0.905, 0.909091)
    mask = T([[True]])
    lp, old, adv = T([[LN(0.905)]]), T([[0.0]]), T([[-1.0]])
    loss, m = policy_loss(lp, old, adv, mask, clip_low=0.1, clip_high=0.1, clip_mode="ppo")
    assert loss.item() == pytest.approx(0.905) and m["policy/clipfrac_low"] == 0.0
    loss, m = policy_loss(lp, old, adv, mask, clip_low=0.1, clip_high=0.1, clip_mode="log")
    assert loss.item() == pytest.approx(1 / 1.1) and m["policy/clipfrac_low"] == 1.0
    # upper bound is 1 + eps in both modes: r = 1.15, A = +1 -> -1.1
    loss, _ = policy_loss(T([[LN(1.15)]]), old, T([[1.0]]), mask, clip_high=0.1, clip_mode="log")
    assert loss.item() == pytest.approx(-1.1)
    with pytest.raises(ValueError, match="ppo, log"):
        policy_loss(lp, old, adv, mask, clip_mode="trust-region")


def test_dual_clip_caps_negative_advantage_loss():
    # A = -1, r = 5: pg = max(5, 1.2) = 5; dual clip c = 3 -> min(5, 3) = 3
    mask = T([[True]])
    args = (T([[LN(5.0)]]), T([[0.0]]), T([[-1.0]]), mask)
    assert policy_loss(*args)[0].item() == pytest.approx(5.0)
    assert policy_loss(*args, dual_clip=3.0)[0].item() == pytest.approx(3.0)


def test_kl_penalty_added_per_token():
    # lp = ln 0.5 = old, so r = 1 and pg = -A = -1 per token; ref = ln 0.25 -> k3 = 0.193147
    # loss = mean(-1 + 0.1 * 0.193147) = -0.980685
    lp, mask = T([[LN(0.5), LN(0.5)]]), T([[True, True]])
    loss, m = policy_loss(lp, lp.clone(), T([1.0]), mask, ref_logprobs=T([[LN(0.25)] * 2]),
                          kl_coef=0.1)
    assert loss.item() == pytest.approx(-1 + 0.1 * 0.193147, abs=1e-6)
    assert m["policy/kl"] == pytest.approx(0.193147, abs=1e-6) and m["policy/pg_loss"] == -1.0
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(lp, lp, T([1.0]), mask, kl_coef=0.1)


@pytest.mark.parametrize("agg", list(AGGREGATIONS))
def test_gradients_flow_only_through_trained_tokens(agg):
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(4, 9, generator=g) > 0.5
    mask[0, 0] = True
    old = torch.randn(4, 9, generator=g) - 2
    lp = (old + 0.05 * torch.randn(4, 9, generator=g)).requires_grad_(True)
    with torch.no_grad():  # garbage where untrained
        lp[~mask] = 50.0
    adv = torch.randn(4, 9, generator=g)
    ref = old - 0.1
    loss, _ = policy_loss(lp, old, adv, mask, agg=agg, ref_logprobs=ref, kl_coef=0.5)
    loss.backward()
    assert torch.isfinite(loss)
    assert (lp.grad[~mask] == 0).all()
    assert (lp.grad[mask] != 0).all()


def test_on_policy_gradient_is_minus_advantage_per_token():
    # at r = 1 nothing is clipped: d(token-mean of -A r)/d lp_t = -A_t / N
    mask = T([[True, True, False], [True, False, False]])
    lp = T([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    adv = T([[2.0, -1.0, 9.0], [3.0, 9.0, 9.0]])
    loss, m = policy_loss(lp, lp.detach(), adv, mask)
    loss.backward()
    assert torch.allclose(lp.grad, T([[-2 / 3, 1 / 3, 0.0], [-1.0, 0.0, 0.0]]))
    assert m["policy/approx_kl"] == 0.0 and m["policy/clipfrac"] == 0.0


def test_policy_loss_shape_errors():
    mask = T([[True, True]])
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(T([[0.0, 0.0]]), T([[0.0, 0.0]]), T([1.0, 2.0, 3.0]), mask)
    with pytest.raises(ValueError, match="old_logprobs"):
        policy_loss(T([[0.0, 0.0]]), T([[0.0]]), T([1.0]), mask)


# ---------------------------------------------------------------------------------- value loss


def test_value_loss_hand_computed_and_explained_variance():
    v, ret, mask = T([[1.0, 2.0, 3.0, 7.0]]), T([[1.0, 1.0, 5.0, 0.0]]), T([[True, True, True, False]])
    loss, m = value_loss(v, ret, mask)
    # squared errors 0, 1, 4 -> 0.5 * 5/3 = 0.833333
    assert loss.item() == pytest.approx(5 / 6)
    # Var(R) over [1, 1, 5] = 32/9; Var(R - V) over [0, -1, 2] = 14/9 -> 1 - 14/32 = 0.5625
    assert m["value/explained_var"] == pytest.approx(0.5625)
    assert m["value/loss"] == pytest.approx(5 / 6)


def test_value_loss_clipped():
    # old 1, clip 0.5: V_clipped = [1, 1.5, 1.5]; clipped errors 0, 0.25, 12.25;
    # max with 0, 1, 4 -> 0, 1, 12.25 -> 0.5 * 13.25 / 3 = 2.208333; clipped term wins on 1 of 3
    v, ret, mask = T([[1.0, 2.0, 3.0]]), T([[1.0, 1.0, 5.0]]), T([[True, True, True]])
    loss, m = value_loss(v, ret, mask, old_values=torch.ones(1, 3), clip=0.5)
    assert loss.item() == pytest.approx(13.25 / 6)
    assert m["value/clipfrac"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="old_values"):
        value_loss(v, ret, mask, clip=0.5)


def test_value_loss_constant_returns_and_grad_mask():
    v = T([[0.5, 0.5, 9.0]], requires_grad=True)
    loss, m = value_loss(v, T([[1.0, 1.0, 0.0]]), T([[True, True, False]]))
    assert m["value/explained_var"] == 0.0  # Var(R) = 0: undefined, reported as 0
    loss.backward()
    assert v.grad[0, 2] == 0 and (v.grad[0, :2] != 0).all()
