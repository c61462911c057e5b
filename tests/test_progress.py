"""SPA-RL stepwise progress attribution: the loss by hand, the head learning which turn made the
outcome, and a real training step recording each turn's contribution and training on it."""
import pytest
import torch

from core.config.algorithms import info_gain_turn_advantages
from core.config import ConfigError, TrainConfig, validate
from core.credit.progress import ProgressModel, action_ends, progress_loss, ridge_step
from storage import queries
from tests.credit_checks import assert_turns_carry, fake_trajectory, one_rl_step

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_progress_loss_by_hand():
    # trajectory 0: 0.5 + 0.25 - 1 = -0.25 -> 0.0625; trajectory 1: 1.0 - 0 -> 1.0; mean 0.53125
    loss = progress_loss([torch.tensor([0.5, 0.25]), torch.tensor([1.0])], torch.tensor([1.0, 0.0]))
    assert float(loss) == pytest.approx(0.53125)
    with pytest.raises(ValueError):
        progress_loss([torch.tensor([1.0])], torch.tensor([1.0, 0.0]))


def test_spa_turn_advantages_are_centred_not_scaled():
    adv = info_gain_turn_advantages([[0.5, 0.1], [0.0]], ["g", "g"], scale=False)
    assert adv == [pytest.approx([0.3, -0.1]), pytest.approx([-0.2])]


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
    for bad in (dict(w_spa=-1.0), dict(spa_l2=0.0)):
        with pytest.raises(ConfigError, match=list(bad)[0]):
            validate(TrainConfig(**bad))


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
    assert_turns_carry(db_path, run_id, trajs, values, groups, scale=False)
    m = queries.metrics(db_path, run_id)
    names = set(m["name"])
    assert {"spa/loss_before", "spa/loss_after"} <= names
