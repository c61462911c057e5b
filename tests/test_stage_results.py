"""The stages after the rollout return their results (advantages, returns, turn advantages,
gradient norms) and the record takes them explicitly: ``Trajectory.info`` carries none of them."""
import pytest
import torch

from core.config import TrainConfig
from core.credit.assign import assign
from core.envs.base import make_env
from core.model.policy import policy_from_config
from core.run.stage_results import StageResults
from core.run.step_rows import step_tables
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling
from core.learn.update import make_samples, policy_update, score_values

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STAGE_KEYS = {"returns", "turn_advantages", "grad_norm", "advantages"}
"""What the credit and update stages computed; none of it belongs in Trajectory.info."""


def _batch(algo: str):
    env = make_env("frozenlake", seed=0)
    cfg = TrainConfig(env="frozenlake", model="tiny", algo=algo, max_turns=2, max_new_tokens=8,
                      kl_coef=0.0, lr=1e-2)
    pol = policy_from_config(cfg)
    trajs = rollout(pol, env, env.tasks("train", 1, 0), group_size=3, seed=0, id_prefix="s1",
                    sampling=Sampling(max_turns=2, max_new_tokens=8, temperature=1.0))
    for t, r in zip(trajs, [1.0, 0.0, 0.5]):  # a random model never succeeds: grade by hand
        t.reward = r
    return pol, cfg, trajs


@pytest.mark.parametrize("algo", ["grpo", "gigpo", "ppo"])
def test_credit_returns_advantages_turn_advantages_and_returns(algo):
    pol, cfg, trajs = _batch(algo)
    values = score_values(pol, trajs, cfg) if algo == "ppo" else None
    credit = assign(trajs, cfg, values)
    assert [len(a) for a in credit.per_token] == [len(t.token_ids) for t in trajs]
    if algo == "gigpo":
        assert [len(a) for a in credit.turn_advantages] == [t.num_turns for t in trajs]
    else:
        assert credit.turn_advantages == [None] * len(trajs)
    if algo == "ppo":
        assert [len(r) for r in credit.returns] == [len(t.token_ids) for t in trajs]
    else:
        assert credit.returns == [None] * len(trajs)
    assert all(not STAGE_KEYS & set(t.info) for t in trajs)


def test_update_returns_each_trajectorys_grad_norm():
    pol, cfg, trajs = _batch("ppo")
    credit = assign(trajs, cfg, score_values(pol, trajs, cfg))
    samples = make_samples(trajs, credit.per_token, credit.returns)
    assert all(s.returns is not None for s in samples)
    result = policy_update(pol, torch.optim.AdamW(pol.trainable_parameters(), lr=cfg.lr),
                           samples, cfg)
    assert result.bad is None
    assert set(result.grad_norms) == {t.traj_id for t in trajs}
    assert all(n > 0 for n in result.grad_norms.values())
    assert all(not STAGE_KEYS & set(t.info) for t in trajs)


def test_the_record_takes_the_stage_results_explicitly():
    pol, cfg, trajs = _batch("gigpo")
    credit = assign(trajs, cfg)
    samples = make_samples(trajs, credit.per_token)
    result = policy_update(pol, torch.optim.AdamW(pol.trainable_parameters(), lr=cfg.lr),
                           samples, cfg)
    results = StageResults()
    results.add_credit(trajs, credit.turn_advantages)
    results.add_update(samples, result.grad_norms)
    tables = step_tables(trajs, results)
    rows = tables["trajectories"]
    assert rows["grad_norm"] == [result.grad_norms[t.traj_id] for t in trajs]
    assert all(not STAGE_KEYS & set(info) for info in rows["info"])
    turns = tables["turns"]
    expected = [a for adv in credit.turn_advantages for a in adv]
    assert turns["advantage"] == pytest.approx(expected)
    trained = [a for a, m in zip(tables["tokens"]["advantage"], tables["tokens"]["trained"]) if m]
    assert trained == pytest.approx([float(a) for t, adv in zip(trajs, credit.per_token)
                                     for a, m in zip(adv, t.trained) if m])
    # without results: no grad norm, the trajectory's advantage on every turn
    bare = step_tables(trajs)
    assert bare["trajectories"]["grad_norm"] == [None] * len(trajs)
    assert bare["turns"]["advantage"] == [t.advantage for t in trajs for _ in t.turns]
