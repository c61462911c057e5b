"""Advantage estimators on hand-computed tensors (the arithmetic is written out in comments)."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from core.credit.advantages import (ESTIMATORS, anchor_key, dr_grpo, drop_small, gae, gae_loop,
                             gigpo_step_advantages, grpo, rloo, starpo_s_keep, token_advantages)

T = torch.tensor


# ---------------------------------------------------------------------------------------- GRPO


def test_grpo_hand_computed_and_flat_group_is_zero():
    # group a = [1,0,0,1]: mean 0.5, unbiased var = 4 * 0.25 / 3 = 1/3, std = 0.57735
    #   A = +-0.5 / (0.57735 + 1e-6) = +-0.866024
    # group b = [1,1,1,1]: all equal -> exactly 0
    adv = grpo(T([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]), ["a"] * 4 + ["b"] * 4)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert torch.allclose(adv, T([a, -a, -a, a, 0.0, 0.0, 0.0, 0.0]), atol=1e-6)
    assert (adv[4:] == 0).all()


def test_flat_group_is_exactly_zero_even_with_rounding():
    # 0.1 * 3 / 3 != 0.1 in float arithmetic; the contract says exactly 0 anyway.
    for name in ("grpo", "dr_grpo", "rloo"):
        assert (ESTIMATORS[name](T([0.1, 0.1, 0.1]), [7, 7, 7]) == 0).all(), name


def test_group_of_one_gets_zero():
    for name in ("grpo", "dr_grpo", "rloo"):
        adv = ESTIMATORS[name](T([3.0, 1.0, 0.0]), ["solo", "pair", "pair"])
        assert adv[0] == 0, name
        assert adv[1] > 0 > adv[2], name


def test_groups_need_not_be_contiguous():
    # ids interleaved: group x = [2, 0] (mean 1), group y = [5, 7] (mean 6)
    adv = dr_grpo(T([2.0, 5.0, 0.0, 7.0]), ["x", "y", "x", "y"])
    assert torch.allclose(adv, T([1.0, -1.0, -1.0, 1.0]))


def test_dr_grpo_is_mean_only():
    # group [3, 1, 2]: mean 2 -> [1, -1, 0]; no division by std (which is 1 here anyway),
    # group [10, 0]: mean 5 -> [5, -5] (GRPO would give +-0.707)
    adv = dr_grpo(T([3.0, 1.0, 2.0, 10.0, 0.0]), [0, 0, 0, 1, 1])
    assert torch.allclose(adv, T([1.0, -1.0, 0.0, 5.0, -5.0]))


def test_rloo_equals_both_formulas():
    r = T([1.0, 0.0, 0.5, 0.25, 2.0, -1.0])
    ids = ["a", "a", "a", "a", "b", "b"]
    adv = rloo(r, ids)
    # LOOP: A_k = R_k - (sum - R_k)/(K-1). Group a: sum 1.75, K 4
    #   A_0 = 1 - 0.75/3 = 0.75; A_1 = 0 - 1.75/3 = -0.583333; A_2 = 0.5 - 1.25/3 = 0.083333;
    #   A_3 = 0.25 - 1.5/3 = -0.25. Group b: sum 1, K 2: A = 2 - (-1) = 3; -1 - 2 = -3
    assert torch.allclose(adv, T([0.75, -7 / 12, 1 / 12, -0.25, 3.0, -3.0]), atol=1e-6)
    # verl: A = R * n/(n-1) - mean * n/(n-1)
    n = T([4.0] * 4 + [2.0] * 2)
    mean = T([1.75 / 4] * 4 + [0.5] * 2)
    assert torch.allclose(adv, r * n / (n - 1) - mean * n / (n - 1), atol=1e-6)


def test_estimators_registry_and_errors():
    assert {"grpo", "dr_grpo", "rloo", "starpo_s", "gigpo"} <= set(ESTIMATORS)
    r = T([1.0, 0.0])
    assert torch.equal(ESTIMATORS["starpo_s"](r, [0, 0]), grpo(r, [0, 0]))
    with pytest.raises(ValueError, match="group_ids has 1"):
        grpo(r, [0])
    with pytest.raises(ValueError, match="1-D"):
        grpo(r[None], [0, 0])
    with pytest.raises(ValueError, match="NaN"):
        grpo(T([float("nan"), 1.0]), [0, 0])
    with pytest.raises(ValueError, match="float"):
        grpo(torch.tensor([1, 0]), [0, 0])


group_rewards = st.lists(st.floats(-100, 100, allow_nan=False), min_size=2, max_size=6)


@settings(max_examples=40, deadline=None)
@given(st.lists(group_rewards, min_size=1, max_size=4), st.floats(-50, 50))
def test_property_zero_mean_per_group_and_shift_invariance(groups, shift):
    r = T([x for g in groups for x in g], dtype=torch.float64)
    ids = [i for i, g in enumerate(groups) for _ in g]
    for name in ("grpo", "dr_grpo", "rloo"):
        adv = ESTIMATORS[name](r, ids)
        shifted = ESTIMATORS[name](r + shift, ids)
        start = 0
        for g in groups:
            assert abs(float(adv[start:start + len(g)].sum())) < 1e-6 * (1 + max(map(abs, g)))
            start += len(g)
        assert torch.allclose(adv, shifted, atol=1e-5, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(st.lists(group_rewards, min_size=1, max_size=4))
def test_property_grpo_unit_std_per_group(groups):
    r = T([x for g in groups for x in g], dtype=torch.float64)
    adv = grpo(r, [i for i, g in enumerate(groups) for _ in g])
    start = 0
    for g in groups:
        a = adv[start:start + len(g)]
        start += len(g)
        if torch.tensor(g, dtype=torch.float64).std() > 1e-3:  # away from the eps regime
            assert abs(float(a.std()) - 1.0) < 1e-2


# ------------------------------------------------------------------------------------ StarPO-S


def test_starpo_s_keeps_whole_groups_with_highest_std():
    # 4 groups of 2: stds  g0 [0,0] 0; g1 [0,1] 0.707; g2 [0,4] 2.83; g3 [1,1] 0
    r = T([0.0, 0.0, 0.0, 1.0, 0.0, 4.0, 1.0, 1.0])
    ids = ["g0", "g0", "g1", "g1", "g2", "g2", "g3", "g3"]
    # 25% of 4 groups = 1 group: g2
    assert starpo_s_keep(r, ids).tolist() == [False] * 4 + [True, True] + [False] * 2
    # 50% -> 2 groups: g2 and g1, each kept whole
    assert starpo_s_keep(r, ids, 0.5).tolist() == [False, False, True, True, True, True, False, False]
    assert starpo_s_keep(r, ids, 1.0).all()


def test_starpo_s_keeps_at_least_one_and_breaks_ties_by_first_appearance():
    # 3 groups, 10% -> floor 0.3 = 0 -> at least 1. All stds equal (0.707): first group wins.
    r = T([1.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    ids = ["b", "b", "a", "a", "c", "c"]
    assert starpo_s_keep(r, ids, 0.1).tolist() == [True, True, False, False, False, False]
    # 2 of 3 at 0.7 (floor 2.1); ties again resolved in order of appearance
    assert starpo_s_keep(r, ids, 0.7).tolist() == [True] * 4 + [False] * 2
    with pytest.raises(ValueError, match="keep_frac"):
        starpo_s_keep(r, ids, 0.0)


# --------------------------------------------------------------------------------------- GiGPO


def test_gigpo_shared_anchor_state_vs_not():
    # Task group "t": two trajectories start from the same observation "s0" (shared anchor);
    # their second turns act from different observations -> singleton step groups -> 0.
    # gamma 0.5. traj 0 rewards [0, 1]: G = [0 + 0.5*1, 1] = [0.5, 1]
    #            traj 1 rewards [0, 0]: G = [0, 0]
    # step group (t, s0) = {0.5, 0}: mean 0.25, unbiased std = sqrt(2 * 0.0625 / 1) = 0.353553
    #   A = +-0.25 / 0.353554 = +-0.707105
    keys = [[anchor_key("s0"), anchor_key("s1")], [anchor_key("s0"), anchor_key("s2")]]
    adv = gigpo_step_advantages([[0.0, 1.0], [0.0, 0.0]], keys, ["t", "t"], gamma=0.5)
    a = 0.25 / (math.sqrt(0.125) + 1e-6)
    assert adv[0] == pytest.approx([a, 0.0]) and adv[1] == pytest.approx([-a, 0.0])
    # "mean" mode: just G - mean
    adv = gigpo_step_advantages([[0.0, 1.0], [0.0, 0.0]], keys, ["t", "t"], 0.5, "mean")
    assert adv == [[0.25, 0.0], [-0.25, 0.0]]
    # the same observation in DIFFERENT task groups is not an anchor group: all singletons -> 0
    adv = gigpo_step_advantages([[0.0, 1.0], [0.0, 0.0]], keys, ["t", "u"], gamma=0.5)
    assert adv == [[0.0, 0.0], [0.0, 0.0]]


def test_gigpo_revisited_state_within_one_trajectory_and_discounting():
    # One trajectory visits "s" twice (turns 0 and 2), another visits it once (turn 0).
    # gamma 0.95, traj 0 rewards [0, 0, 1]: G = [0.9025, 0.95, 1]; traj 1 rewards [0]: G = [0]
    # step group s = {0.9025, 1, 0}: mean 0.634167; "mean" mode -> G - mean
    keys = [["s", "x", "s"], ["s"]]
    adv = gigpo_step_advantages([[0.0, 0.0, 1.0], [0.0]], keys, [0, 0], normalize="mean")
    m = (0.9025 + 1.0 + 0.0) / 3
    assert adv[0] == pytest.approx([0.9025 - m, 0.0, 1.0 - m]) and adv[1] == pytest.approx([-m])


def test_gigpo_errors():
    with pytest.raises(ValueError, match="anchor keys"):
        gigpo_step_advantages([[0.0, 1.0]], [["s"]], [0])
    with pytest.raises(ValueError, match="one entry per trajectory"):
        gigpo_step_advantages([[0.0]], [["s"]], [0, 1])
    with pytest.raises(ValueError, match="normalize"):
        gigpo_step_advantages([[0.0]], [["s"]], [0], normalize="zscore")


# ----------------------------------------------------------------------------------------- GAE


def test_gae_skips_observation_tokens_hand_computed():
    # 5 tokens: action, action, OBSERVATION, action, action; reward 1 on the last token.
    # gamma 0.9, lam 0.8. V = [0.1, 0.2, 9.9, 0.3, 0.4]; the observation's V must not be used.
    # trained positions 0,1,3,4 (the next trained token of 1 is 3):
    #   t4: delta = 1 + 0 - 0.4 = 0.6                 A4 = 0.6
    #   t3: delta = 0 + 0.9*0.4 - 0.3 = 0.06          A3 = 0.06 + 0.72*0.6 = 0.492
    #   t1: delta = 0 + 0.9*0.3 - 0.2 = 0.07          A1 = 0.07 + 0.72*0.492 = 0.42424
    #   t0: delta = 0 + 0.9*0.2 - 0.1 = 0.08          A0 = 0.08 + 0.72*0.42424 = 0.3854528
    rewards = T([[0.0, 0.0, 0.0, 0.0, 1.0]])
    values = T([[0.1, 0.2, 9.9, 0.3, 0.4]])
    mask = T([[True, True, False, True, True]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert torch.allclose(adv, T([[0.3854528, 0.42424, 0.0, 0.492, 0.6]]), atol=1e-6)
    assert torch.allclose(ret, T([[0.4854528, 0.62424, 0.0, 0.792, 1.0]]), atol=1e-6)
    ref_adv, ref_ret = gae_loop(rewards, values, mask, 0.9, 0.8)
    assert torch.allclose(adv, ref_adv, atol=1e-6) and torch.allclose(ret, ref_ret, atol=1e-6)


def test_gae_gamma_lam_one_is_return_minus_value():
    # RAGEN's gamma = lam = 1: A_t = (sum of future rewards) - V_t
    rewards = T([[0.0, 0.5, 0.0, 2.0]])
    values = T([[1.0, 1.0, 1.0, 1.0]])
    adv, _ = gae(rewards, values, torch.ones(1, 4, dtype=torch.bool), 1.0, 1.0)
    assert torch.allclose(adv, T([[1.5, 1.5, 1.0, 1.0]]))


def test_gae_vectorised_matches_loop_on_random_ragged_masks():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(6, 23, generator=g) > 0.4
    mask[2] = False  # a row with no trained token
    values = torch.randn(6, 23, generator=g)
    rewards = torch.randn(6, 23, generator=g) * mask
    for gamma, lam in ((1.0, 1.0), (0.99, 0.95), (0.5, 0.0)):
        adv, ret = gae(rewards, values, mask, gamma, lam)
        ref_adv, ref_ret = gae_loop(rewards, values, mask, gamma, lam)
        assert torch.allclose(adv, ref_adv, atol=1e-5)
        assert torch.allclose(ret, ref_ret, atol=1e-5)
        assert (adv[~mask] == 0).all() and (ret[~mask] == 0).all()


def test_gae_refuses_reward_on_untrained_token_and_bad_shapes():
    mask = T([[True, False]])
    with pytest.raises(ValueError, match="zero where mask is False"):
        gae(T([[0.0, 1.0]]), T([[0.0, 0.0]]), mask, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        gae(T([0.0, 1.0]), T([0.0, 0.0]), mask[0], 1.0, 1.0)
    with pytest.raises(ValueError, match="bool"):
        gae(T([[0.0, 0.0]]), T([[0.0, 0.0]]), T([[1, 0]]), 1.0, 1.0)


# ------------------------------------------------------------------------------------- helpers


def test_token_advantages_and_drop_small():
    mask = T([[True, False, True], [False, True, True]])
    out = token_advantages(T([2.0, -0.5]), mask)
    assert torch.equal(out, T([[2.0, 0.0, 2.0], [0.0, -0.5, -0.5]]))
    with pytest.raises(ValueError):
        token_advantages(T([1.0]), mask)
    # LOOP: |A| < 0.01 dropped -> keep mask True for |A| >= 0.01
    assert drop_small(T([0.005, -0.02, 0.01, -0.0099, 0.0]), 0.01).tolist() == [
        False, True, True, False, False]
    assert drop_small(T([0.0, 1.0]), 0.0).all()
