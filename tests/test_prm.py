"""AgentPRM on line: Monte-Carlo Q labels by hand, the head regressing them, and a real training
step recording q / prm per turn and training on the centred scores."""
import pytest
import torch

from core.config import ConfigError, TrainConfig, validate
from core.credit.prm import PrmModel, labels_for, mc_q_labels
from storage import queries
from tests.credit_checks import (assert_turns_carry, fake_trajectory,  # noqa: F401
                                 one_rl_step, open_page)  # (open_page: a fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_q_labels_are_mean_outcomes_of_the_groups_rollouts_through_the_same_state_and_action():
    anchors = [["s0", "s1"], ["s0", "s1"], ["s0"], ["s0"]]
    actions = [["search x", "answer 1"], ["search  x", "answer 2"], ["answer 2"], ["search x"]]
    outcomes = [1.0, 0.0, 0.0, 1.0]
    q = mc_q_labels(anchors, actions, outcomes, ["g", "g", "g", "h"])
    # (s0, search x) in group g: trajectories 0 and 1 (whitespace-normalised) -> (1 + 0) / 2
    assert q[0] == [0.5, 1.0] and q[1] == [0.5, 0.0]
    assert q[2] == [0.0]
    assert q[3] == [1.0]  # group h is another task: its rollouts do not mix with g's
    with pytest.raises(ValueError):
        mc_q_labels([["s0"]], [["a", "b"]], [1.0], ["g"])


def test_labels_from_trajectories_use_state_keys_and_the_outcome():
    a, b = fake_trajectory("a", "g", 2), fake_trajectory("b", "g", 2)
    for t, r in ((a, 1.0), (b, 0.0)):
        t.rewards = {"outcome": r}
        for u in t.turns:
            u.state_key = f"cell{u.turn}"
    b.turns[1].action = "other"
    assert labels_for([a, b]) == [[0.5, 1.0], [0.5, 0.0]]


def test_the_head_regresses_the_labels():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    model = PrmModel(hidden_size=2, l2=1e-9)
    fit = model.fit([x[:2], x[2:]], [[0.2, 0.8], [1.0]])
    assert fit.loss_after < 1e-8 < fit.loss_before
    assert model.predict([x])[0] == pytest.approx([0.2, 0.8, 1.0], abs=0.02)


def test_w_prm_is_validated():
    with pytest.raises(ConfigError, match="w_prm"):
        validate(TrainConfig(w_prm=-0.5))


@pytest.fixture(scope="module")
def prm_run(tmp_path_factory):
    """(store path, run id) of one real RL step of the tiny model on search, w_prm 1."""
    return one_rl_step(tmp_path_factory.mktemp("prm"), "prm", max_turns=2, w_prm=1.0,
                       record_info_gain=False)


def test_training_step_records_q_and_prm_and_trains_on_them(prm_run):
    db_path, run_id = prm_run
    trajs = queries.trajectories(db_path, run_id)
    ids = list(trajs["traj_id"])
    sig = queries.turn_signals(db_path, run_id, ids)
    assert set(sig.name) == {"q", "prm"}
    scores, groups = [], []
    for _, t in trajs.iterrows():
        mine = sig[sig.traj_id == t.traj_id]
        for name in ("q", "prm"):
            assert sorted(mine[mine.name == name].turn) == list(range(int(t.num_turns)))
        assert (mine[mine.name == "q"].value == 0.0).all()  # tiny never answers right
        scores.append(mine[mine.name == "prm"].sort_values("turn").value.tolist())
        groups.append(t.group_id)
    assert_turns_carry(db_path, run_id, trajs, scores, groups, scale=False)
    assert {"prm/loss_before", "prm/loss_after"} <= set(queries.metrics(db_path, run_id)["name"])


def test_replay_shows_the_prm_turn_credit(open_page, prm_run):
    store, run_id = str(prm_run[0]), prm_run[1]
    t = queries.trajectories(store, run_id).iloc[0]
    at = open_page("replay", store, run=run_id, step=int(t.step), traj=t.traj_id)
    table = next(f.value for f in at.dataframe if "PRM score" in f.value.columns)
    sig = queries.turn_signals(store, run_id, [t.traj_id], ["prm"]).sort_values("turn")
    assert table["PRM score"].tolist() == pytest.approx(sig.value.tolist())
    assert table["MC Q label"].tolist() == [0.0] * int(t.num_turns)
    # info gain was not recorded in this run: its part of the panel says so
    assert any("Information gain not computed yet" in i.value for i in at.info)


def test_dynamics_offers_the_prm_by_turn_and_replay_ignores_branch_signals(open_page, prm_run,
                                                                           tmp_path):
    import shutil
    from storage import db
    store = tmp_path / "copy" / "prm.duckdb"
    store.parent.mkdir()
    shutil.copy(prm_run[0], store)
    run_id = prm_run[1]
    t = queries.trajectories(store, run_id).iloc[0]
    with db.writing(str(store)) as con:  # a branch-from-turn analysis's own q on turn 0
        con.execute("INSERT INTO turn_signals VALUES (?, ?, ?, 0, 'q', 0.75, 'branch')",
                    [run_id, int(t.step), t.traj_id])
    at = open_page("replay", str(store), run=run_id, step=int(t.step), traj=t.traj_id)
    table = next(f.value for f in at.dataframe if "MC Q label" in f.value.columns)
    assert table["MC Q label"].tolist() == [0.0] * int(t.num_turns)
    at = open_page("dynamics", str(store), run=run_id)
    box = at.selectbox(key="dyn_turn_signal")
    assert box.options == ["MC Q label", "PRM score"]
    assert any("Information gain not computed yet" in i.value for i in at.info)
    by_turn = queries.signal_by_turn(store, run_id, "q")
    assert set(by_turn.turn) == set(range(int(t.num_turns)))  # the branch row is not counted
    assert float(by_turn["mean"].abs().max()) == 0.0
