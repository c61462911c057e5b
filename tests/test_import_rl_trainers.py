"""Issue 50, part 1 and 3: the RL trainers' own token-level rollouts, imported with their masks,
logprobs and advantages, made by the real packages (requirements-rl.txt; CI installs them)."""
from __future__ import annotations

import pytest

from pages._tokens import mask_lint
from storage import db, queries


def _q(store, sql, params=()):
    with db.reading(store) as con:
        return con.execute(sql, list(params)).fetchall()


# -- verl's DataProto ----------------------------------------------------------------------------
def _verl_batch(tokenizer, step: int):
    """A real ``verl.DataProto`` laid out as ``RayPPOTrainer.fit`` holds it after
    ``compute_advantage``: left-padded prompts, right-padded multi-turn responses whose tool
    reply is masked out, GRPO advantages from verl's own ``compute_grpo_outcome_advantage``."""
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    verl = pytest.importorskip("verl")
    from verl.trainer.ppo import core_algos

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    samples = [  # (prompt, [(text, trained)], reward)
        ("Who wrote Dune?", [("<search>Dune author</search>", 1),
                             ("<information>Frank Herbert wrote Dune.</information>", 0),
                             ("<answer>Frank Herbert</answer>", 1)], 1.0),
        ("Who wrote Dune?", [("<answer>Isaac Asimov</answer>", 1)], 0.0),
        ("What is 2+3?", [("<answer>5</answer>", 1)], 1.0),
        ("What is 2+3?", [("<answer>6</answer>", 1)], 0.0),
    ]
    prompts = [ids(p) for p, _, _ in samples]
    responses = [[(t, m) for text, m in parts for t in ids(text)] for _, parts, _ in samples]
    P, R = max(map(len, prompts)), max(map(len, responses)) + 2
    gen = torch.Generator().manual_seed(0)
    rows = {k: [] for k in ("prompts", "responses", "attention_mask", "response_mask",
                            "token_level_scores")}
    for p, r, (_, _, reward) in zip(prompts, responses, samples):
        rows["prompts"].append([pad] * (P - len(p)) + p)
        rows["responses"].append([t for t, _ in r] + [pad] * (R - len(r)))
        rows["attention_mask"].append([0] * (P - len(p)) + [1] * len(p) + [1] * len(r)
                                      + [0] * (R - len(r)))
        rows["response_mask"].append([m for _, m in r] + [0] * (R - len(r)))
        rows["token_level_scores"].append([0.0] * (len(r) - 1) + [reward] + [0.0] * (R - len(r)))
    t = {k: torch.tensor(v) for k, v in rows.items()}
    t["token_level_scores"] = t["token_level_scores"].float()
    t["token_level_rewards"] = t["token_level_scores"].clone()
    t["input_ids"] = torch.cat([t["prompts"], t["responses"]], dim=1)
    t["old_log_probs"] = -torch.rand((4, R), generator=gen) * 3
    t["rollout_log_probs"] = (t["old_log_probs"] - torch.rand((4, R), generator=gen) * 0.1)
    uid = np.array(["dune", "dune", "sum", "sum"], dtype=object)
    t["advantages"], t["returns"] = core_algos.compute_grpo_outcome_advantage(
        t["token_level_rewards"], t["response_mask"].float(), uid)
    batch = verl.DataProto.from_dict(
        tensors=t, non_tensors={"uid": uid, "data_source": np.array(["toy"] * 4, dtype=object),
                                "reward_model": np.array([{"ground_truth": "Frank Herbert"}] * 2
                                                         + [{"ground_truth": "5"}] * 2)},
        meta_info={"global_steps": step})
    return batch, samples


def test_verl_dataproto_recorded_token_by_token(tmp_path):
    pytest.importorskip("verl")
    from core.model.models import load_tokenizer
    from storage.integrations.verl_batch import VerlBatchRecorder

    tokenizer = load_tokenizer("tiny")
    batch, samples = _verl_batch(tokenizer, step=3)
    store = tmp_path / "verl.duckdb"
    recorder = VerlBatchRecorder(store, tokenizer, run_id="verl-test", run_name="verl toy")
    report = recorder.record(batch)
    assert (report.imported, report.failed) == (4, 0), report.errors
    recorder.close()

    trajs = queries.trajectories(store, "verl-test", 3).set_index("traj_id")
    assert sorted(trajs.index) == ["s3-dune-0", "s3-dune-1", "s3-sum-0", "s3-sum-1"]
    assert set(trajs["group_id"]) == {"s3-dune", "s3-sum"}
    assert trajs.loc["s3-dune-0", "num_turns"] == 2 and trajs.loc["s3-dune-0", "reward"] == 1.0
    # GRPO over a group of two (rewards 1, 0): +-0.7071, as verl computed it
    adv = batch.batch["advantages"]
    assert trajs.loc["s3-dune-0", "advantage"] == pytest.approx(float(adv[0][0]), abs=1e-6)
    assert trajs.loc["s3-dune-1", "advantage"] == pytest.approx(-0.7071, abs=1e-3)

    toks = queries.tokens(store, "verl-test", "s3-dune-0")
    mask = batch.batch["attention_mask"][0].bool()
    assert "".join(toks["text"]) == tokenizer.decode(batch.batch["input_ids"][0][mask])
    obs = toks[toks["role"] == "observation"]
    assert "".join(obs["text"]) == "<information>Frank Herbert wrote Dune.</information>"
    assert not obs["trained"].any() and obs["logprob"].isna().all()
    act = toks[toks["role"] == "action"]
    assert act["trained"].all() and set(act["turn"]) == {0, 1}
    P = batch.batch["prompts"].shape[1]
    kept = batch.batch["response_mask"][0].bool()
    assert act["logprob"].tolist() == pytest.approx(
        batch.batch["rollout_log_probs"][0][kept].tolist())
    assert act["train_logprob"].tolist() == pytest.approx(
        batch.batch["old_log_probs"][0][kept].tolist())
    assert act["advantage"].tolist() == pytest.approx(batch.batch["advantages"][0][kept].tolist())
    assert toks["token_id"].tolist() == batch.batch["input_ids"][0][mask].tolist()
    assert (toks["role"] == "prompt").sum() == int(batch.batch["attention_mask"][0][:P].sum())
    assert mask_lint(toks, queries.turns(store, "verl-test", ["s3-dune-0"])).empty

    metrics = dict(_q(store, "SELECT name, value FROM metrics WHERE run_id = 'verl-test' "
                             "AND step = 3"))
    assert metrics["reward/mean"] == 0.5 and metrics["mismatch/kl_k3"] > 0
    assert "training/rollout_probs_diff_mean" in metrics
    assert _q(store, "SELECT status, source FROM runs") == [("finished", "import:verl-batch")]
