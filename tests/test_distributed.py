"""Data parallelism on CPU (gloo, 2 ranks): the update on two ranks equals the update of one
process over the same batch, and a ``torchrun`` run records every trajectory exactly once."""
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import torch
import torch.multiprocessing as mp

from core.config import ConfigError, TrainConfig
from core.credit.assign import assign
from core.learn.distributed import Ranks, check, number_rollouts
from core.envs.base import make_env
from core.model.policy import load_policy
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling
from core.learn.update import make_samples, policy_update, score_reference

ROOT = Path(__file__).resolve().parent.parent
G = 4
VARIED = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.5]
FLAT_SECOND = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5]
"""Group 1's rewards all equal: advantage 0, so LOOP's |A| filter drops the whole group."""
CASES = {
    # two steps over the batch (the second at ratios != 1), token-mean over all ranks' tokens
    "token_mean": (VARIED, dict(ppo_epochs=2)),
    # rank 1 trains nothing (its group is filtered) and contributes zeros
    "rank_without_samples": (FLAT_SECOND, dict(loss_agg="seq-mean-token-mean",
                                               min_abs_advantage=0.01)),
}
MINIBATCHES = dict(minibatches=2, ppo_epochs=2)
"""Step k takes the k-th minibatch of every rank's shuffled share: another partition of the batch
than one process's shuffle, so only the ranks' agreement is checked."""


def _cfg(**kw):
    # SGD without clipping (max_grad_norm huge): the step is the gradient itself, so a wrong
    # normalisation shows (Adam and clipping would hide a constant factor).
    base = dict(env="search", model="tiny", algo="grpo", max_turns=1, max_new_tokens=10, lr=1.0,
                kl_coef=0.05, group_size=G, tasks_per_step=2, max_grad_norm=1e9)
    return TrainConfig(**{**base, **kw})


def _graded(trajs, rewards):
    trajs = pickle.loads(pickle.dumps(trajs))
    for t, r in zip(trajs, rewards):
        t.reward = r
    return trajs


def _update(trajs, cfg, ranks=Ranks()):
    """Credit over the whole batch, then this rank's block of whole groups through the update."""
    torch.manual_seed(0)
    pol = load_policy("tiny", seed=0)
    advantages = assign(trajs, cfg).per_token
    mine = ranks.block(cfg.tasks_per_step)
    lo, hi = mine.start * G, mine.stop * G
    samples = make_samples(trajs[lo:hi], advantages[lo:hi])
    score_reference(pol, [s for s in samples if not s.traj.filtered], cfg)
    opt = torch.optim.SGD(pol.trainable_parameters(), lr=cfg.lr)
    result = policy_update(pol, opt, samples, cfg, seed=3, ranks=ranks)
    adapter = {n: p.detach().clone() for n, p in pol.model.named_parameters() if "lora_" in n}
    return adapter, result.metrics, {t.traj_id: result.grad_norms.get(t.traj_id) for t in trajs[lo:hi]}


def _worker(rank: int, world: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    ranks = Ranks.from_env()
    try:
        out = {}
        batch = pickle.loads((Path(folder) / "trajs.pkl").read_bytes())
        for name, (rewards, kw) in CASES.items():
            out[name] = _update(_graded(batch, rewards), _cfg(**kw), ranks)
        out["minibatches"] = _update(_graded(batch, VARIED), _cfg(**MINIBATCHES), ranks)
        (Path(folder) / f"rank{rank}.pkl").write_bytes(pickle.dumps(out))
    finally:
        ranks.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def batch():
    """One step's trajectories, recorded once (graded by hand: a random model never succeeds)."""
    torch.set_num_threads(1)
    env = make_env("search", seed=0, topk=2)
    pol = load_policy("tiny", seed=0)
    trajs = rollout(pol, env, env.tasks("train", 2, 0), group_size=G, seed=5, id_prefix="s1",
                    sampling=Sampling(max_turns=1, max_new_tokens=10, temperature=1.0))
    for i, t in enumerate(trajs):  # responses of different lengths, and more tokens in group 0
        action = [j for j, m in enumerate(t.trained) if m]
        for j in action[len(action) - i:]:
            t.trained[j] = False
    lengths = [sum(t.trained) for t in trajs]
    assert len(set(lengths)) == len(trajs) and sum(lengths[:G]) > sum(lengths[G:])
    return trajs


def test_two_ranks_update_equals_one_process(batch, tmp_path):
    (tmp_path / "trajs.pkl").write_bytes(pickle.dumps(batch))
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    got = [pickle.loads((tmp_path / f"rank{k}.pkl").read_bytes()) for k in range(2)]
    start = {n: p.detach() for n, p in load_policy("tiny", seed=0).model.named_parameters()
             if "lora_" in n}
    for name, (rewards, kw) in CASES.items():
        want, metrics, norms = _update(_graded(batch, rewards), _cfg(**kw))
        step = max(float((want[n] - start[n]).abs().max()) for n in want)
        assert step > 1e-3, f"{name}: the update hardly moved the adapter ({step})"
        for k in range(2):
            adapter, rank_metrics, rank_norms = got[k][name]
            off = max(float((adapter[n] - want[n]).abs().max()) for n in want)
            assert off < 1e-4 * step, f"{name}: rank {k}'s adapter is {off} off one process's"
            for m in ("grad/norm", "update/steps", "update/trained_trajectories",
                      "policy/pg_loss", "policy/kl", "policy/clipfrac"):
                assert rank_metrics[m] == pytest.approx(metrics[m], rel=1e-4, abs=1e-7), (name, m)
            for traj_id, norm in rank_norms.items():  # each trajectory's own increment
                if norms[traj_id] is None:  # filtered: never backpropagated
                    assert norm is None and name == "rank_without_samples"
                else:
                    assert norm == pytest.approx(norms[traj_id], rel=1e-4, abs=1e-8), traj_id
        assert metrics["update/steps"] == (1 if name == "rank_without_samples" else 2)
    (a0, m0, _), (a1, m1, _) = got[0]["minibatches"], got[1]["minibatches"]
    assert all(torch.equal(a0[n], a1[n]) for n in a0), "ranks' replicas drifted apart"
    assert m0["update/steps"] == m1["update/steps"] == 4 and m0["grad/norm"] == m1["grad/norm"]


def test_per_rank_normalisation_would_differ(batch):
    """The check above can fail: the mean of per-rank token means is another step."""
    cfg = _cfg(ppo_epochs=1)
    whole = _update(_graded(batch, VARIED), cfg)[0]
    halves = [_update(_graded(batch, VARIED)[k * G:(k + 1) * G], _cfg(tasks_per_step=1))[0]
              for k in range(2)]
    start = {n: p.detach() for n, p in load_policy("tiny", seed=0).model.named_parameters()
             if "lora_" in n}
    mean_of_means = {n: start[n] + sum(h[n] - start[n] for h in halves) / 2 for n in whole}
    assert max(float((whole[n] - mean_of_means[n]).abs().max()) for n in whole) > 1e-3 * max(
        float((whole[n] - start[n]).abs().max()) for n in whole)


# -- splitting --------------------------------------------------------------------------------------
def test_blocks_cover_the_batch_once_in_order():
    for n in (0, 1, 5, 8):
        for world in (1, 2, 3):
            blocks = [Ranks(rank=k, world=world).block(n) for k in range(world)]
            assert [i for b in blocks for i in b] == list(range(n))
            assert max(map(len, blocks)) - min(map(len, blocks)) <= 1


def test_rollout_ids_number_groups_across_the_batch(batch):
    trajs = pickle.loads(pickle.dumps(batch))[G:]
    number_rollouts(trajs, "s7", first_group=1, group_size=G)
    assert [t.traj_id for t in trajs] == [f"s7-g1-r{r}" for r in range(G)]
    assert {t.group_id for t in trajs} == {"s7-g1"}


def test_a_batch_that_splits_a_group_is_refused():
    check(_cfg(tasks_per_step=4), 2)
    with pytest.raises(ConfigError, match="tasks_per_step=3 must be divisible by the number of ranks"):
        check(_cfg(tasks_per_step=3), 2)
    with pytest.raises(ConfigError, match="sft_batch_size=3"):
        check(_cfg(tasks_per_step=2, sft_steps=1, sft_batch_size=3), 2)
    check(_cfg(tasks_per_step=3), 1)


# -- end to end through torchrun --------------------------------------------------------------------
def test_torchrun_two_ranks_record_every_trajectory_once(tmp_path):
    db = tmp_path / "store.duckdb"
    args = ["--env", "search", "--model", "tiny", "--group-size", "2", "--tasks-per-step", "4",
            "--steps", "2", "--sft-steps", "1", "--sft-batch-size", "2", "--eval-every", "2",
            "--eval-tasks", "3", "--max-turns", "2", "--max-new-tokens", "8", "--seed", "0",
            "--threads", "1", "--quiet", "--db", str(db)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
                           "-m", "core.train", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("recorded in") == 1  # rank 0 alone reports (and records)
    con = duckdb.connect(str(db), read_only=True)
    runs = con.execute("SELECT run_id, status FROM runs").fetchall()
    assert len(runs) == 1 and runs[0][1] == "finished"
    traj = con.execute("SELECT step, split, traj_id, group_id, rank FROM trajectories").df()
    assert traj["traj_id"].is_unique
    train = traj[traj["split"] == "train"]
    assert train.groupby("step").size().to_dict() == {2: 4 * 2, 3: 4 * 2}
    for step, rows in train.groupby("step"):  # whole groups per rank, two groups each
        per_group = rows.groupby("group_id")["rank"].agg(["nunique", "first"])
        assert (per_group["nunique"] == 1).all()
        assert sorted(per_group["first"]) == [0, 0, 1, 1]
        assert sorted(rows["group_id"].unique()) == [f"s{step}-g{g}" for g in range(4)]
    sft = traj[traj["split"] == "sft"]
    assert sorted(sft["traj_id"]) == ["s1-d0", "s1-d1"] and sorted(sft["rank"]) == [0, 1]
    evals = traj[traj["split"] == "eval"]  # 3 held-out tasks after SFT and at the end, split 2 + 1
    assert sorted(evals.groupby("step").size().to_dict().items()) == [(1, 3), (3, 3)]
    assert sorted(evals[evals["step"] == 3]["traj_id"]) == [f"e3-g{g}-r0" for g in range(3)]
    assert sorted(evals[evals["step"] == 3]["rank"]) == [0, 0, 1]
    # every trajectory's tokens once; each metric once per step, over the whole batch
    tokens = con.execute("SELECT traj_id, count(*) - count(DISTINCT pos) AS dup FROM tokens "
                         "GROUP BY traj_id").df()
    assert set(tokens["traj_id"]) == set(traj["traj_id"]) and (tokens["dup"] == 0).all()
    dup_metrics = con.execute("SELECT count(*) FROM (SELECT step, name FROM metrics "
                              "GROUP BY ALL HAVING count(*) > 1)").fetchone()[0]
    assert dup_metrics == 0
    ranks = con.execute("SELECT value FROM metrics WHERE name = 'dist/ranks'").fetchall()
    assert ranks == [(2.0,), (2.0,)]
    trained = con.execute("SELECT step, value FROM metrics "
                          "WHERE name = 'update/trained_trajectories' ORDER BY step").fetchall()
    assert trained == [(2, 8.0), (3, 8.0)]
    con.close()
