"""Information gain per turn (IGPO): the formulas by hand, the batched teacher-forced measurement
against one-at-a-time scoring, the dense credit on each turn's action tokens, and a real training
step recording turn_signals into a DuckDB store that the queries read back."""
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from core.algorithms.estimators import (discounted_turn_sums, igpo_turn_advantages,
                             info_gain_turn_advantages)
from core.config import ConfigError, TrainConfig, validate
from core.credit.assign import Credit, add_info_gain
from core.envs.base import Task, make_env
from core.credit.info_gain import (ANSWER_OPEN, action_starts, answer_probability, measure, signal_rows,
                            turn_gains)
from core.model.policy import load_policy, token_logprobs
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling
from core.rollout.trajectory import Trajectory
from storage import queries
from tests.credit_checks import fake_trajectory, one_rl_step, open_page  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- the formulas, by hand ------------------------------------------------------------------------
def test_answer_probability_is_the_geometric_mean_of_token_probabilities():
    assert answer_probability([math.log(0.5), math.log(0.125)]) == pytest.approx(0.25)
    assert answer_probability([math.log(0.9)]) == pytest.approx(0.9)
    with pytest.raises(ValueError):
        answer_probability([])


def test_turn_gains_are_differences_of_consecutive_probabilities():
    # p_0 = 0.1 before any turn, 0.4 after turn 0, 0.3 after turn 1 (turn 2 is the last)
    assert turn_gains([0.1, 0.4, 0.3]) == pytest.approx([0.3, -0.1])
    assert turn_gains([0.2]) == []  # a one-turn trajectory: its only turn keeps the outcome


def test_turn_advantages_are_normalised_within_the_task_group():
    adv = info_gain_turn_advantages([[0.5, 0.1], [0.0], [0.2]], ["g", "g", "h"])
    # group g: gains 0.5, 0.1, 0.0 -> mean 0.2, unbiased std sqrt(0.14 / 2) = 0.264575
    std = math.sqrt(0.07)
    assert adv[0] == pytest.approx([0.3 / std, -0.1 / std], rel=1e-5)
    assert adv[1] == pytest.approx([-0.2 / std], rel=1e-5)
    assert adv[2] == [0.0]  # a group with one gain has nothing to compare with
    assert info_gain_turn_advantages([[0.1, 0.1]], ["g"]) == [[0.0, 0.0]]
    with pytest.raises(ValueError):
        info_gain_turn_advantages([[float("nan")]], ["g"])


# -- the measurement ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny", seed=0)


@pytest.fixture(scope="module")
def search_trajs(tiny):
    env = make_env("search", seed=0, topk=2)
    return rollout(tiny, env, env.tasks("train", 2, 0), group_size=2, seed=0, id_prefix="s",
                   sampling=Sampling(max_turns=3, max_new_tokens=8, max_obs_tokens=48,
                                     temperature=1.0))


@pytest.mark.parametrize("packed", [True, False])
def test_batched_measurement_equals_scoring_each_context_alone(tiny, search_trajs, packed):
    # packed: a trajectory's turns in one row; else one row per turn. Batches of 3 rows mix
    # trajectories and lengths either way.
    signals = measure(tiny, search_trajs, batch=3, packed=packed)
    assert set(signals) == {t.traj_id for t in search_trajs}
    assert max(t.num_turns for t in search_trajs) >= 3  # the packing has turns to share
    tok = tiny.tokenizer
    for t in search_trajs:
        s = signals[t.traj_id]
        assert len(s.probs) == t.num_turns and len(s.gains) == t.num_turns - 1
        gold = tok.encode(t.task.golds[0], add_special_tokens=False)
        for k, start in enumerate(action_starts(t)):
            ids = t.token_ids[:start] + tok.encode(ANSWER_OPEN, add_special_tokens=False) + gold
            mask = [False] * (len(ids) - len(gold)) + [True] * len(gold)
            with torch.no_grad():
                lp = token_logprobs(tiny, torch.tensor([ids]), torch.tensor([mask]))["logprobs"][0]
            alone = math.exp(float(lp[torch.tensor(mask)].mean()))
            assert s.probs[k] == pytest.approx(alone, rel=1e-4, abs=1e-9)
        assert s.gains == pytest.approx(turn_gains(s.probs))
        assert s.total == pytest.approx(s.probs[-1] - s.probs[0], abs=1e-12)
    rows = signal_rows(search_trajs, signals)
    first = [r for r in rows if r["traj_id"] == search_trajs[0].traj_id]
    assert [(r["turn"], r["name"]) for r in first] == (
        [(k - 1, "answer_prob") for k in range(search_trajs[0].num_turns)]
        + [(k, "info_gain") for k in range(search_trajs[0].num_turns - 1)])


def test_packed_measurement_under_eager_attention(search_trajs):
    # eager attention adds the mask to the scores: the packed rows' mask becomes 0 / -inf
    eager = load_policy("tiny", seed=0)
    eager.base.set_attn_implementation("eager")
    assert eager.base.config._attn_implementation == "eager"
    packed = measure(eager, search_trajs, batch=3, packed=True)
    alone = measure(eager, search_trajs, batch=1, packed=False)
    for k, s in alone.items():
        assert packed[k].probs == pytest.approx(s.probs, rel=1e-4, abs=1e-9)


def test_a_custom_mask_needs_its_positions(tiny):
    ids = torch.tensor([[1, 2, 3]])
    allowed = torch.ones((1, 1, 3, 3), dtype=torch.bool).tril()
    with pytest.raises(ValueError, match="position_ids"):
        token_logprobs(tiny, ids, torch.ones_like(ids, dtype=torch.bool), attention_mask=allowed)


def test_trajectories_without_gold_answers_are_skipped(tiny, search_trajs):
    t = search_trajs[0]
    no_gold = Trajectory(traj_id="x", group_id="x", task=Task("t", "q"), turns=t.turns,
                         token_ids=t.token_ids, roles=t.roles, token_turn=t.token_turn,
                         trained=t.trained)
    assert measure(tiny, [no_gold]) == {}


# -- the dense credit -----------------------------------------------------------------------------
def test_igpo_turn_advantages_by_hand_from_its_formula():
    # one task group: a (3 turns, gains 0.5 / 0.1, reward 1), b and c (2 turns, one gain, reward 0)
    gains, outcomes = [[0.5, 0.1], [-0.1], [0.2]], [1.0, 0.0, 0.0]
    # gains z-scored over the group's four gains, population std: mean 0.175, var 0.1875 / 4
    m = 0.175
    sg = math.sqrt(0.1875 / 4 + 1e-8) + 1e-6
    zg = [[(0.5 - m) / sg, (0.1 - m) / sg], [(-0.1 - m) / sg], [(0.2 - m) / sg]]
    # outcomes z-scored apart: mean 1/3, var (4/9 + 1/9 + 1/9) / 3 = 2/9
    so = math.sqrt(2 / 9 + 1e-8) + 1e-6
    zo = [(2 / 3) / so, (-1 / 3) / so, (-1 / 3) / so]
    adv, skipped = igpo_turn_advantages(gains, outcomes, ["g"] * 3, gamma=1.0)
    # the outcome is the last turn's reward, and every turn sums its own and the later ones
    assert adv[0] == pytest.approx([zg[0][0] + zg[0][1] + zo[0], zg[0][1] + zo[0], zo[0]])
    assert adv[0] == pytest.approx([2.568906, 1.067802, 1.414210], abs=1e-5)
    assert adv[1] == pytest.approx([zg[1][0] + zo[1], zo[1]]) and skipped == 0
    # gamma discounts the outcome into earlier turns too; the weight scales the gains only
    adv, _ = igpo_turn_advantages(gains, outcomes, ["g"] * 3, gamma=0.5, gain_weight=0.5)
    assert adv[0] == pytest.approx([0.5 * zg[0][0] + 0.5 * (0.5 * zg[0][1] + 0.5 * zo[0]),
                                    0.5 * zg[0][1] + 0.5 * zo[0], zo[0]])
    # unbiased std (n - 1) would give every value sqrt(3/4) or sqrt(2/3) of these: not IGPO's
    assert adv[0][2] == pytest.approx(math.sqrt(2), abs=1e-5)


def test_igpo_leaves_exact_zero_gains_out_of_its_statistics_as_the_release_does():
    """The release picks gain positions by ``reward != 0``: a gain of exactly 0 is neither in the
    group's mean and std nor rewarded. Gains (0.5, 0.1 | 0.0 | 0.2): statistics over 0.5, 0.1,
    0.2 only (mean 0.8/3, population var 0.0866667/3); b's turn 0 gets r = 0."""
    adv, skipped = igpo_turn_advantages([[0.5, 0.1], [0.0], [0.2]], [1.0, 0.0, 0.0], ["g"] * 3,
                                        gamma=1.0)
    sg = math.sqrt(0.0866667 / 3 + 1e-8) + 1e-6
    zo = (-1 / 3) / (math.sqrt(2 / 9 + 1e-8) + 1e-6)
    assert skipped == 0
    assert adv[1] == pytest.approx([0.0 + zo, zo], abs=1e-5)        # the zero gain adds nothing
    assert adv[2][0] == pytest.approx((0.2 - 0.8 / 3) / sg + zo, abs=1e-5)
    assert adv[0] == pytest.approx([1.806440, 0.433633, 1.414210], abs=1e-4)


def test_igpo_skips_a_nan_gain_and_counts_it():
    adv, skipped = igpo_turn_advantages([[float("nan"), 0.4], [0.1]], [1.0, 0.0], ["g", "g"],
                                        gamma=1.0)
    assert skipped == 1
    # the group's statistics come from the finite gains 0.4 and 0.1 alone: z = +-1 (nearly)
    s = math.sqrt(0.0225 + 1e-8) + 1e-6
    zo = 0.5 / (math.sqrt(0.25 + 1e-8) + 1e-6)
    assert adv[0] == pytest.approx([0.0 + 0.15 / s + zo, 0.15 / s + zo, zo])
    assert adv[1] == pytest.approx([-0.15 / s - zo, -zo])
    with pytest.raises(ValueError, match="outcomes"):
        igpo_turn_advantages([[0.1]], [float("nan")], ["g"], gamma=1.0)


def test_log_prob_gains_as_igpos_released_script():
    assert turn_gains([0.1, 0.4, 0.2], "log_prob") == pytest.approx(
        [math.log(4.0), math.log(0.5)])
    assert turn_gains([0.0, 0.5], "log_prob") == [math.inf]  # log 0: not finite, then skipped
    with pytest.raises(ValueError, match="info gain type"):
        turn_gains([0.1, 0.2], "ratio")


def test_dense_credit_lands_on_each_turns_action_tokens():
    a, b = (fake_trajectory(name, "g", turns, golds=("a",)) for name, turns in (("a", 3), ("b", 2)))
    a.reward, b.reward = 1.0, 0.0
    base = Credit.outcome([1.0 * torch.tensor(a.trained).float(),
                           -1.0 * torch.tensor(b.trained).float()], [1.0, -1.0], [False, False])
    gains = [[0.5, 0.1], [0.0]]
    out = add_info_gain(base, [a, b], gains, weight=0.5, gamma=0.0)  # each turn its own reward
    expect, _ = igpo_turn_advantages(gains, [1.0, 0.0], ["g", "g"], gamma=0.0, gain_weight=0.5)
    assert out.turn_advantages == [pytest.approx(e) for e in expect]
    tokens = out.per_token[0].tolist()
    assert tokens[:2] == [0.0, 0.0]  # prompt
    assert tokens[2:4] == pytest.approx([expect[0][0]] * 2) and tokens[4] == 0.0
    assert tokens[5:7] == pytest.approx([expect[0][1]] * 2) and tokens[7] == 0.0
    assert tokens[8:10] == pytest.approx([expect[0][2]] * 2)   # the last turn: the outcome's z
    # a trajectory with no measured gains keeps its credit
    same = add_info_gain(base, [a, b], [None, None], weight=0.5, gamma=1.0)
    assert torch.equal(same.per_token[0], base.per_token[0]) and same.turn_advantages == [None, None]


def test_algorithm_doctests_pass():
    import doctest
    from core.algorithms import estimators as algorithms
    result = doctest.testmod(algorithms)
    assert result.attempted > 0 and result.failed == 0, result


def test_turn_sums_discount_later_turns():
    # S_k = v_k + gamma S_{k+1}: [1, -0.5, 2] at gamma 0.5 -> S_2 = 2, S_1 = 0.5, S_0 = 1.25
    assert discounted_turn_sums([[1.0, -0.5, 2.0], []], 0.5) == [[1.25, 0.5, 2.0], []]
    assert discounted_turn_sums([[1.0, -0.5]], 1.0) == [[0.5, -0.5]]
    assert discounted_turn_sums([[1.0, -0.5]], 0.0) == [[1.0, -0.5]]
    with pytest.raises(ValueError):
        discounted_turn_sums([[1.0]], 1.5)


def test_w_info_gain_is_validated():
    with pytest.raises(ConfigError, match="w_info_gain"):
        validate(TrainConfig(w_info_gain=-1.0))
    with pytest.raises(ConfigError, match="info_gain_gamma"):
        validate(TrainConfig(info_gain_gamma=1.5))
    with pytest.raises(ConfigError, match="info_gain_type"):
        validate(TrainConfig(info_gain_type="ratio"))


# -- a real training step -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(store path, run id) of one real RL step of the tiny model on search, w_info_gain 1."""
    return one_rl_step(tmp_path_factory.mktemp("ig"), "ig", w_info_gain=1.0)


def test_training_step_records_info_gain_and_trains_on_it(trained):
    db_path, run_id = trained
    trajs = queries.trajectories(db_path, run_id)
    ids = list(trajs["traj_id"])
    assert len(ids) == 4
    sig = queries.turn_signals(db_path, run_id, ids)
    rewards = queries.rewards(db_path, run_id, ids)
    gains, groups = [], []
    for _, t in trajs.iterrows():
        mine = sig[sig.traj_id == t.traj_id]
        n = int(t.num_turns)
        assert sorted(mine[mine.name == "answer_prob"].turn) == list(range(-1, n - 1))
        g = mine[mine.name == "info_gain"].sort_values("turn")
        assert list(g.turn) == list(range(n - 1)) and set(mine.source) == {"train"}
        probs = mine[mine.name == "answer_prob"].sort_values("turn").value.tolist()
        assert g.value.tolist() == pytest.approx(turn_gains(probs))
        component = rewards[(rewards.traj_id == t.traj_id) & (rewards.component == "info_gain")]
        assert component.value.tolist() == pytest.approx([sum(g.value)], abs=1e-9)
        gains.append(g.value.tolist())
        groups.append(t.group_id)
    # the recorded turn advantages are IGPO's turn returns (default info_gain_gamma 1): the
    # group-z-scored gains of this turn and the later ones, plus the z-scored outcome
    outcomes = trajs["reward"].tolist()
    dense, _ = igpo_turn_advantages(gains, outcomes, groups, gamma=1.0)
    turns = queries.turns(db_path, run_id, ids)
    for (_, t), d in zip(trajs.iterrows(), dense):
        adv = turns[turns.traj_id == t.traj_id].sort_values("turn").advantage.tolist()
        assert adv == pytest.approx(d, abs=1e-6)
    assert any(abs(x) > 0 for d in dense for x in d)  # the signal trained something
    assert any(len(g) >= 2 for g in gains)  # some turn carries a later turn's gain
    by_turn = queries.signal_by_turn(db_path, run_id)
    assert set(by_turn.turn) == set(range(int(trajs.num_turns.max()) - 1))
    assert by_turn.n.sum() == sum(len(g) for g in gains)


def test_queries_cope_with_stores_recorded_before_turn_signals():
    store = "sample_runs/search_smollm2.duckdb"
    run = queries.runs(store).run_id.iloc[0]
    assert queries.signal_by_turn(store, run).empty
    assert queries.turn_signals(store, run, ["nope"]).empty


# -- the pages ------------------------------------------------------------------------------------
def test_replay_and_dynamics_show_the_gains(open_page, trained):
    store, run_id = str(trained[0]), trained[1]
    trajs = queries.trajectories(store, run_id)
    t = trajs[trajs.num_turns == trajs.num_turns.max()].iloc[0]
    at = open_page("replay", store, run=run_id, step=int(t.step), traj=t.traj_id)
    assert "Information gain" in [h.value for h in at.subheader]
    assert not any("Information gain not computed" in i.value for i in at.info)
    table = next(f.value for f in at.dataframe if "info gain" in f.value.columns)
    sig = queries.turn_signals(store, run_id, [t.traj_id], ["info_gain"]).sort_values("turn")
    assert table["turn"].tolist() == list(range(int(t.num_turns)))
    assert table["info gain"].iloc[:-1].tolist() == pytest.approx(sig.value.tolist())
    assert pd.isna(table["info gain"].iloc[-1])  # the last turn keeps the outcome
    at = open_page("dynamics", store, run=run_id)
    assert "Information gain per turn" in [h.value for h in at.subheader]
    assert not any("Information gain not computed" in i.value for i in at.info)
    assert at.get("plotly_chart")  # the two charts (and the page's others) drew


def test_pages_say_in_one_line_when_an_ended_run_never_recorded_it(open_page):
    """A finished run recorded before the measure (search) or on an env without gold answers
    (frozenlake) will never get it: one line says why, no empty panel."""
    for name in ("search_smollm2", "spike_frozenlake"):
        store = str(Path(f"sample_runs/{name}.duckdb").resolve())
        run_id = queries.runs(store).run_id.iloc[0]
        for page in ("replay", "dynamics"):
            at = open_page(page, store, run=run_id)
            assert not at.exception, (name, page)
            assert not any("Information gain" in h.value for h in at.subheader), (name, page)
            said = [x.value for x in at.caption if "not recorded in this run" in x.value]
            assert len(said) == 1 and "never has it" in said[0], (name, page)
            assert not any("not computed yet" in i.value for i in at.info), (name, page)
