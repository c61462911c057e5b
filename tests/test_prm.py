"""AgentPRM on line: Monte-Carlo Q labels by hand from AgentPRM's target (keyed on the state
with its history and the parsed action, gamma^t (2 R - 1) mapped to [0, 1]), the label-pooling
statistics, the head regressing the labels, and a real training step recording q / prm per turn,
training on the centred scores and recording the pooling."""
import pytest
import torch

from core.config import ConfigError, TrainConfig, validate
from core.credit.prm import (Labels, PrmModel, action_key, labels_for, mc_q_labels, pooling,
                             step_keys)
from storage import queries
from tests.credit_checks import (assert_turns_carry, fake_trajectory,  # noqa: F401
                                 one_rl_step, open_page)  # (open_page: a fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_q_labels_by_hand_from_agentprms_target():
    # group g: trajectories 0 and 1 share turn 0's key; 0 succeeds, 1 fails; group h apart
    keys = [["k0", "k1"], ["k0", "k2"], ["k0"]]
    labels = mc_q_labels(keys, [1.0, 0.0, 1.0], ["g", "g", "h"], gamma=0.9)
    # (k0, t=0): mean(0.9^0 * (2*1-1), 0.9^0 * (2*0-1)) = 0 -> (0 + 1) / 2 = 0.5
    # (k1, t=1): 0.9 * (+1) -> (0.9 + 1) / 2 = 0.95; (k2, t=1): 0.9 * (-1) -> 0.05
    assert labels.values[0] == pytest.approx([0.5, 0.95])
    assert labels.values[1] == pytest.approx([0.5, 0.05])
    assert labels.values[2] == pytest.approx([1.0])  # group h is another task: not pooled with g
    assert labels.counts == [[2, 1], [2, 1], [1]]
    # gamma 1: the plain mean outcome
    assert mc_q_labels(keys, [1.0, 0.0, 1.0], ["g", "g", "h"], gamma=1.0).values[0] == [0.5, 1.0]
    with pytest.raises(ValueError):
        mc_q_labels([["k0"]], [1.0, 0.0], ["g"])


def test_keys_carry_the_history_and_the_parsed_action_not_the_thinking():
    a, b, c = (fake_trajectory(n, "g", 2) for n in "abc")
    for t, r, think in ((a, 1.0, "I will search"), (b, 0.0, "Let me look it up"), (c, 0.0, "x")):
        t.rewards = {"outcome": r}
        for u in t.turns:
            u.state_key = f"cell{u.turn}"
            u.action_type, u.parsed = "search", {"query": f"q{u.turn}"}
            u.action = f"<think>{think}</think><search>q{u.turn}</search>"
    c.turns[0].parsed = {"query": "other"}  # another first action: another history for turn 1
    labels = labels_for([a, b, c], gamma=1.0)
    # a and b took the same parsed actions from the same states despite different thoughts
    assert labels.values[:2] == [[0.5, 0.5], [0.5, 0.5]] and labels.counts[:2] == [[2, 2], [2, 2]]
    # c reached cell1 and searched q1 too, but after another action: its own label
    assert labels.values[2] == [0.0, 0.0] and labels.counts[2] == [1, 1]
    assert step_keys(["s0", "s1"], ["x", "y"]) == [((), "s0", "x"), ((("s0", "x"),), "s1", "y")]


def test_the_action_key_is_the_envs_parse():
    t = fake_trajectory("a", "g", 1)
    u = t.turns[0]
    u.action = "<think>hmm</think> <answer>Paris</answer>"
    u.action_type, u.parsed = "answer", {"answer": "Paris"}
    assert action_key(u) == 'answer:{"answer": "Paris"}'
    u.parsed = None  # an env that records no parse: the text without its thinking
    assert action_key(u) == "text:<answer>Paris</answer>"
    u.valid, u.error = False, "no action"
    assert action_key(u) == "invalid:no action"


def test_pooling_statistics():
    assert pooling([[2, 1], [2, 1], [1]]) == {"prm/rollouts_per_label": pytest.approx(7 / 5),
                                              "prm/single_rollout_frac": pytest.approx(3 / 5)}
    assert pooling([]) == {}
    assert isinstance(mc_q_labels([], [], []), Labels)


def test_the_head_regresses_the_labels():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    model = PrmModel(hidden_size=2, l2=1e-9)
    fit = model.fit([x[:2], x[2:]], [[0.2, 0.8], [1.0]])
    assert fit.loss_after < 1e-8 < fit.loss_before
    assert model.predict([x])[0] == pytest.approx([0.2, 0.8, 1.0], abs=0.02)


def test_prm_fields_are_validated():
    with pytest.raises(ConfigError, match="w_prm"):
        validate(TrainConfig(w_prm=-0.5))
    for bad in (-0.1, 1.5):
        with pytest.raises(ConfigError, match=r"^prm_gamma=.*\[0, 1\]"):
            validate(TrainConfig(prm_gamma=bad))
    assert TrainConfig().prm_gamma == 0.95


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
        # tiny never answers right: R = 0, so a label is (0.95^t * -1 + 1) / 2
        q = mine[mine.name == "q"].sort_values("turn")
        assert q.value.tolist() == pytest.approx([(1 - 0.95 ** k) / 2 for k in q.turn])
        scores.append(mine[mine.name == "prm"].sort_values("turn").value.tolist())
        groups.append(t.group_id)
    assert_turns_carry(db_path, run_id, trajs, scores, groups, scale=False)
    m = queries.metrics(db_path, run_id).set_index("name")["value"]
    assert {"prm/loss_before", "prm/loss_after"} <= set(m.index)
    # the label-pooling statistics of this step's labels, as prm.pooling counts them
    counts = labels_for_run(db_path, run_id)
    assert m["prm/rollouts_per_label"] == pytest.approx(pooling(counts)["prm/rollouts_per_label"])
    assert 0 <= m["prm/single_rollout_frac"] <= 1


def labels_for_run(db_path, run_id) -> list[list[int]]:
    """The pooling counts of a recorded step, recomputed from its stored turns."""
    trajs = queries.trajectories(db_path, run_id)
    turns = queries.turns(db_path, run_id, list(trajs["traj_id"]))
    keys, groups = [], []
    for _, t in trajs.iterrows():
        mine = turns[turns.traj_id == t.traj_id].sort_values("turn")
        anchors = [f"state:{k}" for k in mine.state_key]
        acts = [f"{a}:{p}" if ok else f"invalid:{e or ''}" for a, p, ok, e in
                zip(mine.action_type, mine.parsed, mine.action_valid, mine.error)]
        keys.append(step_keys(anchors, acts))
        groups.append(t.group_id)
    return mc_q_labels(keys, [0.0] * len(keys), groups).counts


def test_replay_shows_the_prm_turn_credit(open_page, prm_run):
    store, run_id = str(prm_run[0]), prm_run[1]
    t = queries.trajectories(store, run_id).iloc[0]
    at = open_page("replay", store, run=run_id, step=int(t.step), traj=t.traj_id)
    table = next(f.value for f in at.dataframe if "PRM score" in f.value.columns)
    sig = queries.turn_signals(store, run_id, [t.traj_id], ["prm"]).sort_values("turn")
    assert table["PRM score"].tolist() == pytest.approx(sig.value.tolist())
    assert table["MC Q label"].tolist() == pytest.approx(
        [(1 - 0.95 ** k) / 2 for k in range(int(t.num_turns))])
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
    assert table["MC Q label"].tolist() == pytest.approx(
        [(1 - 0.95 ** k) / 2 for k in range(int(t.num_turns))])
    at = open_page("dynamics", str(store), run=run_id)
    box = at.selectbox(key="dyn_turn_signal")
    assert box.options == ["MC Q label", "PRM score"]
    assert any("Information gain not computed yet" in i.value for i in at.info)
    by_turn = queries.signal_by_turn(store, run_id, "q")
    assert set(by_turn.turn) == set(range(int(t.num_turns)))  # the branch row is not counted
    assert by_turn.sort_values("turn")["mean"].tolist() == pytest.approx(
        [(1 - 0.95 ** k) / 2 for k in sorted(by_turn.turn)])
    # the label pooling, drawn from the step's metrics
    assert any("rollouts per label" in c.value for c in at.caption)
