"""Trainer stages: credit assignment, the LoRA update (base frozen, adapter changed, the gradient
pointing where the advantages say), per-trajectory gradient norms, SFT demonstrations, skipped
updates, checkpoints, and the rollout statistics."""
import math

import pytest
import torch

from core.model import checkpoint
from core.config import TrainConfig
from core.algorithms import resolve
from core.credit.assign import anchor_keys, assign, step_rewards
from core.rollout.diagnostics import repeat_frac, rollout_metrics
from core.envs.base import make_env
from core.model.policy import load_policy, token_logprobs
from core.credit.rewards import score
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling
from core.rollout.sft import demonstrations
from core.learn.update import make_samples, policy_update, score_reference, sft_update
from tests.credit_checks import fake_trajectory as fake


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def env():
    return make_env("search", seed=0, topk=2)


def _cfg(**kw):
    base = dict(env="search", model="tiny", algo="grpo", max_turns=1, max_new_tokens=8, lr=1e-2,
                kl_coef=0.0)
    return TrainConfig(**{**base, **kw})


def _rollouts(pol, env, group_size=4, seed=0):
    tasks = env.tasks("train", 1, 0)
    return rollout(pol, env, tasks, group_size=group_size, seed=seed, id_prefix="s1",
                   sampling=Sampling(max_turns=1, max_new_tokens=8, temperature=1.0))


def _mean_action_logprob(pol, traj):
    with torch.no_grad():
        lp = token_logprobs(pol, torch.tensor([traj.token_ids]), torch.tensor([traj.trained]))
    return float(lp["logprobs"][0][torch.tensor(traj.trained)].mean())


# -- the update -----------------------------------------------------------------------------------
def test_one_lora_step_changes_adapter_keeps_base_and_follows_advantages(env):
    pol = load_policy("tiny", seed=0)
    cfg = _cfg()
    trajs = _rollouts(pol, env)
    for t, r in zip(trajs, [1.0, 0.0, 0.0, 1.0]):  # a random model never succeeds: grade by hand
        t.reward = r
    before_lp = [_mean_action_logprob(pol, t) for t in trajs]
    base = {n: p.detach().clone() for n, p in pol.model.named_parameters() if "lora_" not in n}
    lora = {n: p.detach().clone() for n, p in pol.model.named_parameters() if "lora_" in n}
    credit = assign(trajs, cfg)
    samples = make_samples(trajs, credit.per_token)
    assert [a > 0 for a in credit.advantage] == [True, False, False, True]
    assert [t.advantage for t in trajs] == [0.0] * 4  # credit returns values, writes nothing
    score_reference(pol, samples, cfg)
    opt = torch.optim.AdamW(pol.trainable_parameters(), lr=cfg.lr)
    result = policy_update(pol, opt, samples, cfg)

    assert result.bad is None and result.metrics["update/steps"] == 1
    for n, p in pol.model.named_parameters():
        if "lora_" in n:
            if "lora_B" in n:  # B starts at zero, A receives no gradient until B moves
                assert not torch.equal(p, lora[n]), f"adapter {n} did not change"
        else:
            assert torch.equal(p, base[n]), f"base weight {n} changed"
    after_lp = [_mean_action_logprob(pol, t) for t in trajs]
    for adv, b, a in zip(credit.advantage, before_lp, after_lp):
        assert (a > b) == (adv > 0), "the step moves logprobs in the advantage's direction"
    assert result.metrics["grad/norm"] > 0
    assert math.isclose(result.metrics["policy/ratio_min"], 1.0, abs_tol=1e-3)
    assert set(result.module_norms) == set(pol.lora_modules())
    assert set(result.grad_norms) == {t.traj_id for t in trajs}
    assert all(n > 0 for n in result.grad_norms.values())


def test_per_trajectory_grad_norm_is_its_share_of_the_gradient(env):
    pol = load_policy("tiny", seed=0)
    cfg = _cfg(max_grad_norm=1e9)
    trajs = _rollouts(pol, env, group_size=3, seed=1)
    for t, r in zip(trajs, [1.0, 0.0, 0.0]):
        t.reward = r
    samples = make_samples(trajs, assign(trajs, cfg).per_token)
    opt = torch.optim.SGD(pol.trainable_parameters(), lr=0.0)
    result = policy_update(pol, opt, samples, cfg)
    norms = [result.grad_norms[t.traj_id] for t in trajs]
    assert all(n > 0 for n in norms)
    # increments add up to the total: the global norm is at most their sum, at least the largest
    assert max(norms) - 1e-6 <= result.metrics["grad/norm"] <= sum(norms) + 1e-6
    # a trajectory alone: its increment is the whole gradient
    single = make_samples(trajs[:1], assign(trajs[:1] + trajs[1:2], cfg).per_token[:1])
    alone = policy_update(pol, opt, single, cfg)
    assert math.isclose(alone.grad_norms[trajs[0].traj_id], alone.metrics["grad/norm"], rel_tol=1e-4)


def test_zero_advantage_trajectories_contribute_no_gradient(env):
    pol = load_policy("tiny", seed=0)
    cfg = _cfg()
    trajs = _rollouts(pol, env, group_size=2, seed=2)
    for t in trajs:
        t.reward = 0.5
    samples = make_samples(trajs, assign(trajs, cfg).per_token)
    result = policy_update(pol, torch.optim.SGD(pol.trainable_parameters(), lr=0.1), samples, cfg)
    assert [result.grad_norms[t.traj_id] for t in trajs] == [0.0, 0.0]
    assert result.metrics["grad/norm"] == 0.0


def test_nonfinite_loss_skips_the_step_and_keeps_weights(env):
    pol = load_policy("tiny", seed=0)
    trajs = _rollouts(pol, env, group_size=2, seed=3)
    samples = make_samples(trajs, [torch.full((len(t.token_ids),), float("nan")) for t in trajs])
    before = [p.detach().clone() for p in pol.trainable_parameters()]
    result = policy_update(pol, torch.optim.AdamW(pol.trainable_parameters(), lr=0.1), samples, _cfg())
    assert result.bad and "non-finite" in result.bad
    assert result.metrics["update/steps"] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, pol.trainable_parameters()))


def test_kl_to_sampling_policy_above_limit_aborts_the_update(env):
    pol = load_policy("tiny", seed=0)
    cfg = _cfg(ppo_epochs=3, kl_abort=1e-9, lr=5e-2)
    trajs = _rollouts(pol, env, group_size=2, seed=4)
    for t, r in zip(trajs, [1.0, 0.0]):
        t.reward = r
    samples = make_samples(trajs, assign(trajs, cfg).per_token)
    result = policy_update(pol, torch.optim.AdamW(pol.trainable_parameters(), lr=cfg.lr), samples, cfg)
    assert result.metrics["update/kl_aborted"] == 1.0
    assert result.metrics["update/steps"] == 1  # the first epoch ran at ratio 1, the second aborted


# -- SFT ------------------------------------------------------------------------------------------
def test_sft_demonstrations_train_only_expert_actions_and_lower_the_loss(env):
    pol = load_policy("tiny", seed=0)
    cfg = _cfg(max_turns=3)
    tasks = env.tasks("train", 2, 0)
    demos = demonstrations(env, tasks, pol.tokenizer, Sampling(max_turns=3, max_obs_tokens=64),
                           seed=0, id_prefix="s1")
    for d in demos:
        assert d.split == "sft" and d.outcome.success and d.finish_reason == "answered"
        assert "".join(d.token_text) == pol.tokenizer.decode(d.token_ids)
        assert all(tr == (role == "action") for tr, role in zip(d.trained, d.roles))
        assert any(role == "observation" and "<information>" in text
                   for role, text in zip(d.roles, d.token_text)) or any(
            "<information>" in t.observation for t in d.turns)
    with pytest.raises(ValueError, match="train tasks only"):
        demonstrations(env, env.tasks("heldout", 1, 0), pol.tokenizer, Sampling(), 0, "x")
    opt = torch.optim.AdamW(pol.trainable_parameters(), lr=3e-3)
    losses = [sft_update(pol, opt, make_samples(demos), cfg).metrics["sft/loss"] for _ in range(6)]
    assert losses[-1] < losses[0] - 0.5


# -- credit assignment ----------------------------------------------------------------------------
def test_gigpo_turn_advantages_land_on_their_turns_tokens():
    cfg = _cfg(algo="gigpo", gigpo_weight=1.0, gigpo_gamma=1.0)
    # both rollouts act from the task's first state; the replies to their first actions differ
    a = fake("a", "g", 2, 1.0, obs=["x", "end"])
    b = fake("b", "g", 2, 0.0, obs=["y", "end"])
    algo = resolve("gigpo")
    credit = algo.credit_step([a, b], cfg, algo)
    per_token = credit.per_token
    assert step_rewards(a) == [0.0, 1.0]
    assert anchor_keys(a)[0] == anchor_keys(b)[0] and anchor_keys(a)[1] != anchor_keys(b)[1]
    ta, tb = credit.turn_advantages
    ea, eb = credit.advantage  # the episode advantages
    assert ta[0] > ea > 0 and tb[0] < eb < 0  # the shared state adds step credit
    assert ta[1] == ea and tb[1] == eb  # turn 1 states differ: singletons
    assert torch.allclose(per_token[0][2:4], torch.tensor([ta[0]] * 2))
    assert torch.allclose(per_token[0][5:7], torch.tensor([ta[1]] * 2))
    assert per_token[0][4] == 0 and per_token[0][:2].tolist() == [0, 0]


def test_starpo_keeps_whole_groups_by_reward_std():
    cfg = _cfg(algo="starpo_s", starpo_keep=0.5)
    trajs = [fake(f"{g}{i}", g, 1, r) for g, rs in (("lo", [0.0, 0.1]), ("hi", [0.0, 1.0]))
             for i, r in enumerate(rs)]
    assert assign(trajs, cfg).filtered == [True, True, False, False]


def test_min_abs_advantage_filter_and_ppo_returns():
    cfg = _cfg(algo="rloo", min_abs_advantage=0.01)
    trajs = [fake("a", "g", 1, 1.0), fake("b", "g", 1, 1.0), fake("c", "h", 1, 0.0),
             fake("d", "h", 1, 1.0)]
    assert assign(trajs, cfg).filtered == [True, True, False, False]
    # a group whose outcomes are all equal (A = 0) still trains where information gain gave its
    # turns credit: the filter looks at the tokens' final advantages
    # (w 0 would filter both: LOOP keeps the one of the largest |A|, the first of equals)
    for w, expect in ((0.0, [False, True]), (0.5, [False, False])):
        dense = [fake("a", "g", 2, 1.0, golds=("x",)), fake("b", "g", 2, 1.0, golds=("x",))]
        credit = assign(dense, _cfg(algo="grpo", min_abs_advantage=0.01, w_info_gain=w),
                        info_gains=[[0.6], [0.1]])
        assert credit.filtered == expect
        assert credit.advantage == [0.0, 0.0]
    # b's only credit is negative (its gain was the group's lower one): kept by |A|, not by A
    assert float(credit.per_token[0].max()) > 0.01 > float(credit.per_token[1].max())
    ppo_cfg = _cfg(algo="ppo", gamma=1.0, lam=1.0)
    trajs = [fake("a", "g", 2, 1.0), fake("b", "g", 2, 0.0)]
    values = [torch.zeros(len(t.token_ids)) for t in trajs]
    credit = assign(trajs, ppo_cfg, values)
    adv = credit.per_token
    assert credit.returns[0][torch.tensor(trajs[0].trained)].tolist() == [1.0] * 4
    assert all(float(a[~torch.tensor(t.trained)].abs().sum()) == 0 for a, t in zip(adv, trajs))
    assert credit.advantage[0] > 0 > credit.advantage[1]


# -- statistics and checkpoints -------------------------------------------------------------------
def test_rollout_metrics_by_hand():
    trajs = [fake("a", "g", 1, 1.0), fake("b", "g", 1, 0.0), fake("c", "h", 2, 0.0),
             fake("d", "h", 2, 0.0)]
    trajs[2].turns[0].action = "other"
    m = rollout_metrics(trajs)
    assert m["reward/mean"] == 0.25 and m["success/rate"] == 0.25
    assert m["success/pass@G"] == 0.5 and m["reward/frac_zero_std"] == 0.5
    assert math.isclose(m["reward/group_std_mean"], math.sqrt(0.5) / 2)
    assert m["env/turns_mean"] == 1.5 and m["response/length_mean"] == 3.0
    # group g: both "a" -> repeat; group h: ("other","a") vs ("a","a") -> distinct
    assert repeat_frac(trajs) == 0.5


def test_checkpoint_round_trip(tmp_path, env):
    pol = load_policy("tiny", seed=0)
    cfg = _cfg()
    opt = torch.optim.AdamW(pol.trainable_parameters(), lr=1e-2)
    demos = demonstrations(env, env.tasks("train", 1, 0), pol.tokenizer, Sampling(max_turns=2), 0, "d")
    sft_update(pol, opt, make_samples(demos), cfg)
    checkpoint.save(tmp_path, pol, opt, step=3, phase="sft", config=cfg.to_dict())
    fresh = load_policy("tiny", seed=9)
    fresh_opt = torch.optim.AdamW(fresh.trainable_parameters(), lr=1e-2)
    ckpt = checkpoint.load(tmp_path)
    assert ckpt.step == 3 and ckpt.phase == "sft" and ckpt.config["algo"] == "grpo"
    checkpoint.restore(ckpt, fresh, fresh_opt)
    for a, b in zip(pol.trainable_parameters(), fresh.trainable_parameters()):
        assert torch.equal(a, b)
    assert fresh_opt.state_dict()["state"].keys() == opt.state_dict()["state"].keys()
    assert checkpoint.load(tmp_path / "missing") is None


def test_rewards_component_rows_for_every_trajectory(env):
    pol = load_policy("tiny", seed=0)
    trajs = _rollouts(pol, env, group_size=2, seed=5)
    for t in trajs:
        t.rewards, t.reward = score(t, _cfg())
        assert set(t.rewards) == {"outcome", "format", "cost", "process"}


def test_token_rows_carry_the_mask_as_the_optimiser_applied_it():
    from core.run.step_rows import step_tables
    kept, dropped, held_out = fake("a", "g", 1, 1.0), fake("b", "g", 1, 0.0), fake("c", "h", 1, 0.0)
    dropped.filtered = True
    held_out.split = "eval"
    for t in (kept, dropped, held_out):
        t.token_text = ["x"] * len(t.token_ids)
    tables = step_tables([kept, dropped, held_out])
    tokens = tables["tokens"]
    by_traj = {tid: [m for i, m in zip(tokens["traj_id"], tokens["trained"]) if i == tid]
               for tid in "abc"}
    assert by_traj["a"] == kept.trained and not any(by_traj["b"]) and not any(by_traj["c"])
    assert tables["trajectories"]["filtered"] == [False, True, False]
    assert len(tables["rewards"]["traj_id"]) == 3 * 4


def test_ctrl_c_while_the_final_status_is_written_leaves_the_run_ended(tmp_path, monkeypatch):
    """A Stop from the Train page can land after the last step, while the status is written:
    the run must still end 'finished', not stay 'running' with a KeyboardInterrupt."""
    import os
    import signal

    from core.run.trainer import train
    from storage import queries
    from storage.recorder import Recorder

    real_finish = Recorder.finish

    def finish_with_ctrl_c(self, status="finished", error=None):
        os.kill(os.getpid(), signal.SIGINT)  # delivered here, before the status write
        real_finish(self, status, error)

    monkeypatch.setattr(Recorder, "finish", finish_with_ctrl_c)
    db = tmp_path / "store.duckdb"
    cfg = _cfg(steps=1, group_size=2, tasks_per_step=1, eval_every=0, max_new_tokens=4,
               checkpoint_dir=str(tmp_path / "ckpt"))
    run_id = train(cfg, Recorder(db), progress=False)
    run = queries.runs(db).set_index("run_id").loc[run_id]
    assert run["status"] == "finished"
