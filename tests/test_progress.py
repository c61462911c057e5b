"""SPA-RL stepwise progress attribution: the loss and the turn credit by hand from SPA's formulas,
the head learning which turn made the outcome and fitting a real batch's outcomes exactly, PPO
taking the progress rewards through GAE, and a real training step recording each turn's
contribution and training on it."""
import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from core.algorithms.estimators import spa_turn_advantages
from core.config import ConfigError, TrainConfig, validate
from core.credit.advantages import gae
from core.credit.assign import Credit, add_spa_credit, assign
from core.credit.prm import labels_for
from core.credit.progress import (ProgressModel, action_ends, features, progress_loss,
                                   ridge_step)
from core.credit.turn_credit import TurnCredit
from core.envs.base import make_env
from core.learn.distributed import Ranks
from core.model.policy import load_policy
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling
from storage import queries
from tests.credit_checks import assert_turns_carry, fake_trajectory, one_rl_step
from tests.test_distributed import _free_port

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_progress_loss_by_hand():
    # trajectory 0: 0.5 + 0.25 - 1 = -0.25 -> 0.0625; trajectory 1: 1.0 - 0 -> 1.0; mean 0.53125
    loss = progress_loss([torch.tensor([0.5, 0.25]), torch.tensor([1.0])], torch.tensor([1.0, 0.0]))
    assert float(loss) == pytest.approx(0.53125)
    with pytest.raises(ValueError):
        progress_loss([torch.tensor([1.0])], torch.tensor([1.0, 0.0]))


def test_spa_turn_credit_by_hand_from_the_return_to_go():
    # a 1-turn success, a 4-turn success and a 2-turn failure, contributions summing to outcomes
    contributions = [[1.0], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0]]
    # returns-to-go G: [1], [1, .75, .5, .25], [0, 0]; turn means: 2/3, .75/2, .5, .25
    adv = spa_turn_advantages(contributions, ["g", "g", "g"])
    assert adv[0] == pytest.approx([1 / 3])
    assert adv[1] == pytest.approx([1 / 3, 0.375, 0.0, 0.0])
    assert adv[2] == pytest.approx([-2 / 3, -0.375])
    # the long success is not punished (centring pooled over turns gave it -0.036 a turn)
    assert min(adv[1]) >= 0 and adv[1][0] == pytest.approx(adv[0][0])
    # groups are apart; a lone trajectory gets 0
    assert spa_turn_advantages([[0.5, 0.5], [0.2]], ["g", "h"]) == [[0.0, 0.0], [0.0]]
    with pytest.raises(ValueError):
        spa_turn_advantages([[float("nan")]], ["g"])


def test_spa_credit_is_added_on_each_turns_action_tokens():
    trajs = [fake_trajectory("a", "g", 1, reward=1.0), fake_trajectory("b", "g", 4, reward=1.0),
             fake_trajectory("c", "g", 2)]
    base = Credit.outcome([torch.zeros(len(t.token_ids)) for t in trajs], [0.0] * len(trajs),
                          [False] * len(trajs))
    out = add_spa_credit(base, trajs, [[1.0], [0.25] * 4, [0.0, 0.0]], weight=2.0)
    assert out.turn_advantages[1] == pytest.approx([2 / 3, 0.75, 0.0, 0.0])
    b = trajs[1]
    for k, a in enumerate([2 / 3, 0.75, 0.0, 0.0]):
        on_turn = [float(x) for x, turn, m in zip(out.per_token[1], b.token_turn, b.trained)
                   if turn == k and m]
        assert on_turn == pytest.approx([a, a])
    assert float(out.per_token[1][~torch.tensor(b.trained)].abs().max()) == 0.0


def test_ppo_takes_the_progress_rewards_through_gae():
    """Under PPO each turn's w x c_t is a reward on its last action token (SPA's PPO), so with
    gamma = lam = 1 and V = 0 a turn's tokens carry its return-to-go before whitening."""
    t = fake_trajectory("a", "g", 3, reward=1.0)
    cfg = TrainConfig(algo="ppo", w_spa=2.0, gamma=1.0, lam=1.0)
    values = [torch.zeros(len(t.token_ids))]
    credit = assign([t], cfg, values, progress=[[0.5, 0.25, 0.25]])
    rewards = torch.zeros(len(t.token_ids))
    rewards[[3, 6, 9]] = torch.tensor([1.0, 0.5, 0.5 + 1.0])  # 2 x c on each turn's end, R last
    adv, ret = gae(rewards[None], values[0][None], torch.tensor([t.trained]), 1.0, 1.0)
    trained = adv[0][torch.tensor(t.trained)]
    assert trained.tolist() == pytest.approx([3.0, 3.0, 2.0, 2.0, 1.5, 1.5])  # returns-to-go
    expected = (trained - trained.mean()) / (trained.std() + 1e-8)  # the batch whitening
    assert credit.per_token[0][torch.tensor(t.trained)].tolist() == pytest.approx(expected.tolist())
    assert credit.returns[0].tolist() == pytest.approx(ret[0].tolist())


def test_action_ends_are_each_turns_last_action_token():
    t = fake_trajectory("a", "g", 3)  # 2 prompt tokens, then per turn 2 action + 1 observation token
    assert action_ends(t) == [3, 6, 9]


def test_the_head_attributes_the_outcome_to_the_turn_that_made_it():
    """Turns are 'good' (feature [0, 1]) or 'idle' ([1, 0]); the outcome counts good turns.
    Fitted so contributions sum to outcomes, a good turn must get ~1 and an idle one ~0."""
    good, idle = torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0])
    trajs = [[good, idle], [idle, idle], [idle, good, good], [good], [idle]]
    feats = [torch.stack(t) for t in trajs]
    outcomes = [1.0, 0.0, 2.0, 1.0, 0.0]
    model = ProgressModel(hidden_size=2, l2=1e-6)
    fit = model.fit(feats, outcomes)
    assert fit.loss_after < 1e-6 < fit.loss_before
    c = model.predict(feats)
    assert c[0] == pytest.approx([1.0, 0.0], abs=0.05)
    assert c[2] == pytest.approx([0.0, 1.0, 1.0], abs=0.05)
    assert model.predict([None]) == [None]


def test_a_ridge_step_keeps_the_past_and_never_fits_worse():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    prev = torch.tensor([5.0, -5.0], dtype=torch.float64)
    loose, tight = ridge_step(prev, x, y, 1e-9), ridge_step(prev, x, y, 1e6)
    assert loose.tolist() == pytest.approx([1.0, 0.0], abs=1e-6)
    assert tight.tolist() == pytest.approx(prev.tolist(), abs=1e-4)
    loss = lambda w: float(((x @ w - y) ** 2).mean())  # noqa: E731
    mid = ridge_step(prev, x, y, 1.0)
    assert loss(loose) <= loss(mid) <= loss(prev)
    # an all-zero batch leaves a zero head at zero (Adam's first steps did not)
    model = ProgressModel(hidden_size=3, l2=1.0)
    fit = model.fit([torch.randn(2, 3), torch.randn(1, 3)], [0.0, 0.0])
    assert fit.loss_after == fit.loss_before == 0.0


def test_config_validates_spa_fields():
    for bad in (dict(w_spa=-1.0), dict(spa_l2=-0.5)):
        with pytest.raises(ConfigError, match=list(bad)[0]):
            validate(TrainConfig(**bad))
    assert validate(TrainConfig(spa_l2=0.0)).spa_l2 == 0.0  # the exact fit, the default


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny", seed=0)


def test_contributions_sum_to_outcomes_on_the_fitted_batch_at_default_settings(tiny):
    """SPA's defining property: on the batch the head was fitted on, a trajectory's per-turn
    contributions add up to its outcome (within 1e-3). The old default ridge step (spa_l2 = 1)
    left them short."""
    env = make_env("search", seed=0, topk=3)
    trajs = rollout(tiny, env, env.tasks("train", 3, 0), group_size=1, seed=0, id_prefix="s",
                    sampling=Sampling(max_turns=3, max_new_tokens=8, max_obs_tokens=48,
                                      temperature=1.0))
    for t, r in zip(trajs, [1.0, 0.0, 1.0]):
        t.rewards = {"outcome": r}
    assert all(t.num_turns == 3 for t in trajs)
    heads = TurnCredit(TrainConfig(w_spa=1.0, record_info_gain=False), tiny)
    values = heads.measure(trajs)
    sums = [sum(c) for c in values.contributions]
    assert sums == pytest.approx([1.0, 0.0, 1.0], abs=1e-3)
    assert values.metrics["spa/sum_gap_max"] < 1e-3
    assert values.metrics["spa/loss_after"] < 1e-6 < values.metrics["spa/loss_before"]
    ridge = TurnCredit(TrainConfig(w_spa=1.0, spa_l2=1.0, record_info_gain=False), tiny)
    assert ridge.measure(trajs).metrics["spa/sum_gap_max"] > 1e-2


def test_training_step_records_progress_and_trains_on_it(tmp_path):
    db_path, run_id = one_rl_step(tmp_path, "spa", w_spa=1.0, record_info_gain=False)
    trajs = queries.trajectories(db_path, run_id)
    ids = list(trajs["traj_id"])
    sig = queries.turn_signals(db_path, run_id, ids)
    assert set(sig.name) == {"progress"}  # info gain was switched off
    values, groups = [], []
    for _, t in trajs.iterrows():
        mine = sig[sig.traj_id == t.traj_id].sort_values("turn")
        assert mine.turn.tolist() == list(range(int(t.num_turns)))
        values.append(mine.value.tolist())
        groups.append(t.group_id)
    assert_turns_carry(db_path, run_id, trajs, values, groups, spa=True)
    m = queries.metrics(db_path, run_id)
    names = set(m["name"])
    assert {"spa/loss_before", "spa/loss_after", "spa/sum_gap_max"} <= names
    # tiny never answers right: every outcome 0, and the contributions sum to it
    assert all(abs(sum(v)) < 1e-3 for v in values)


class _TwoRanks:
    """Stands in for core/learn/distributed.py ``Ranks.everyone`` on rank ``rank`` of two: its
    other rank hands in ``other``'s items, one list per call, in the order TurnCredit calls."""

    def __init__(self, rank: int, other: list):
        self.rank, self.other = rank, list(other)

    def everyone(self, mine):
        theirs = self.other.pop(0)
        both = list(mine) + theirs if self.rank == 0 else theirs + list(mine)
        return both, 0 if self.rank == 0 else len(theirs)


def test_the_heads_are_fitted_on_every_ranks_batch_and_stay_identical(tiny):
    env = make_env("search", seed=0, topk=3)
    trajs = rollout(tiny, env, env.tasks("train", 2, 0), group_size=2, seed=0, id_prefix="s",
                    sampling=Sampling(max_turns=3, max_new_tokens=8, max_obs_tokens=48,
                                      temperature=1.0))
    for t, r in zip(trajs, [1.0, 0.0, 0.0, 1.0]):
        t.rewards = {"outcome": r}
    cfg = TrainConfig(w_spa=1.0, w_prm=1.0, record_info_gain=False)
    whole = TurnCredit(cfg, tiny)
    whole.measure(trajs)
    halves = [trajs[:2], trajs[2:]]  # each rank holds whole groups

    def handed_in(half):  # what a rank hands everyone(): SPA's features and outcomes, the PRM's
        feats, labels = features(tiny, half), labels_for(half)
        return [feats, [t.rewards["outcome"] for t in half], feats, labels.values, labels.counts]

    heads = []
    for rank in (0, 1):
        mine = TurnCredit(cfg, tiny, ranks=_TwoRanks(rank, handed_in(halves[1 - rank])))
        values = mine.measure(halves[rank])
        assert values.metrics["spa/sum_gap_max"] < 1e-3  # over both ranks' trajectories
        heads.append((mine.spa_model.w, mine.prm_model.w))
    for w_rank0, w_rank1, w_one in zip(heads[0], heads[1], (whole.spa_model.w, whole.prm_model.w)):
        assert torch.equal(w_rank0, w_rank1)
        # the two ranks agree exactly; against one process the gathered batches are summed in
        # another order, so float32 rounding of the features, carried through the fit (weights
        # ~1e-3..1e-2; 3.8e-9 seen), is all that may differ
        assert torch.allclose(w_rank0, w_one, rtol=1e-5, atol=1e-7), (w_rank0 - w_one).abs().max()


def _heads_on_a_rank(rank: int, world: int, port: int, folder: str) -> None:
    """One rank of a real gloo group: its own two groups of rollouts, outcomes set by hand, one
    TurnCredit step; writes the heads it ends with."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    ranks = Ranks.from_env()
    try:
        pol = load_policy("tiny", seed=0)
        env = make_env("search", seed=0, topk=3)
        own = rollout(pol, env, env.tasks("train", 4, 0)[2 * rank:2 * rank + 2], group_size=2,
                      seed=rank, id_prefix=f"r{rank}",
                      sampling=Sampling(max_turns=3, max_new_tokens=8, max_obs_tokens=48,
                                        temperature=1.0))
        for k, t in enumerate(own):
            t.rewards = {"outcome": float((k + rank) % 2)}
        heads = TurnCredit(TrainConfig(w_spa=1.0, w_prm=1.0, record_info_gain=False), pol, ranks)
        metrics = heads.measure(own).metrics
        (Path(folder) / f"rank{rank}.pkl").write_bytes(pickle.dumps(
            (heads.spa_model.w, heads.prm_model.w, metrics)))
    finally:
        ranks.close()


def test_two_real_ranks_end_with_identical_heads(tmp_path):
    mp.spawn(_heads_on_a_rank, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    (spa0, prm0, m0), (spa1, prm1, m1) = (pickle.loads((tmp_path / f"rank{k}.pkl").read_bytes())
                                          for k in (0, 1))
    assert float(spa0.abs().max()) > 0 and float(prm0.abs().max()) > 0  # both learned something
    assert torch.equal(spa0, spa1) and torch.equal(prm0, prm1)
    assert m0 == m1 and m0["spa/sum_gap_max"] < 1e-3  # over all 8 trajectories, on each rank
