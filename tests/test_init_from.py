"""--init-from: a new run that starts from another run's checkpoint (SFT once, then several RL
settings from the same start) takes the policy and the optimizer state exactly as they were."""
from __future__ import annotations

import pytest
import torch

from core.model import checkpoint
from core.config import ConfigError, TrainConfig, validate
from core.run.trainer import TrainingError, train
from storage import queries
from storage.recorder import Recorder


def _cfg(tmp_path, **kw) -> TrainConfig:
    base = dict(env="search", model="tiny", algo="grpo", sft_steps=2, sft_batch_size=2,
                sft_lr=5e-3, steps=1, lr=5e-3, group_size=2, tasks_per_step=2, max_turns=1,
                max_new_tokens=8, eval_every=0, threads=1, seed=0,
                db=str(tmp_path / "store.duckdb"), checkpoint_dir=str(tmp_path / "ckpt"))
    return TrainConfig(**{**base, **kw})


def _train(cfg: TrainConfig) -> str:
    return train(validate(cfg), Recorder(cfg.db), progress=False)


def _tokens(db: str, run: str, step: int):
    """(traj_id suffix, token ids, sampling logprobs, logprobs after the update) per train
    trajectory of the step."""
    trajs = queries.trajectories(db, run, step=step)
    out = []
    for traj_id in sorted(trajs[trajs["split"] == "train"]["traj_id"]):
        tok = queries.tokens(db, run, traj_id)
        out.append((tok["token_id"].tolist(), torch.tensor(tok["logprob"].to_numpy()),
                    torch.tensor(tok["new_logprob"].to_numpy())))
    assert out
    return out


def test_a_run_from_an_sft_checkpoint_repeats_the_uninterrupted_run(tmp_path):
    whole = _train(_cfg(tmp_path))  # SFT steps 1-2, then RL step 3, in one run
    sft_run = _train(_cfg(tmp_path, steps=0, db=str(tmp_path / "sft.duckdb")))
    start = checkpoint.checkpoint_dir(_cfg(tmp_path), sft_run)
    ckpt = checkpoint.load(start)
    assert (ckpt.phase, ckpt.step) == ("sft", 2)

    cfg = _cfg(tmp_path, db=str(tmp_path / "rl.duckdb"), init_from=str(start))
    run = _train(cfg)
    steps = queries.trajectories(cfg.db, run)["step"]
    assert set(steps) == {3}  # the SFT steps belong to the run it started from
    assert queries.run_config(queries.runs(cfg.db)["config"].iloc[0])["init_from"] == str(start)
    # same adapter, same SFT second moments carried into RL, same step seeds: the RL step of
    # the run that did it all at once, token for token, before and after the update
    a, b = _tokens(str(tmp_path / "store.duckdb"), whole, 3), _tokens(cfg.db, run, 3)
    assert [ids for ids, _, _ in a] == [ids for ids, _, _ in b]
    for (_, old_a, new_a), (_, old_b, new_b) in zip(a, b):
        assert torch.allclose(old_a, old_b, atol=1e-5, equal_nan=True)
        assert torch.allclose(new_a, new_b, atol=1e-5, equal_nan=True)
    # and what the step left behind, adapter and RL optimizer state (second moments carried
    # from SFT's), is the same too
    one = checkpoint.load(checkpoint.checkpoint_dir(cfg, whole))
    two = checkpoint.load(checkpoint.checkpoint_dir(cfg, run))
    assert (one.step, one.phase) == (two.step, two.phase) == (3, "rl")
    assert all(torch.equal(one.adapter[k], two.adapter[k]) for k in one.adapter)
    moments = [(s["exp_avg_sq"], t["exp_avg_sq"]) for s, t in
               zip(one.optimizer["state"].values(), two.optimizer["state"].values())]
    assert len(moments) == len(one.optimizer["state"]) > 0
    assert all(torch.allclose(x, y) for x, y in moments) and any(x.abs().sum() > 0 for x, _ in moments)
    # the policy the new run started from is kept for branch-from-turn rollouts
    kept = checkpoint.load_adapter(checkpoint.checkpoint_dir(cfg, run), 2)["adapter"]
    assert all(torch.equal(kept[k], ckpt.adapter[k]) for k in ckpt.adapter)

    # an SFT checkpoint goes on with another algorithm; the checkpoint file itself is accepted
    gigpo = _cfg(tmp_path, db=str(tmp_path / "gigpo.duckdb"), algo="gigpo",
                 init_from=str(start / checkpoint.FILE))
    assert set(queries.trajectories(gigpo.db, _train(gigpo))["step"]) == {3}


def test_sft_continued_from_a_checkpoint_repeats_the_uninterrupted_sft(tmp_path):
    """The SFT budget curve goes on from one SFT checkpoint (60 -> 80 -> 100 steps): the steps
    after it must be the ones an uninterrupted SFT run of that length takes."""
    whole = _train(_cfg(tmp_path, sft_steps=4, steps=0))
    first = _train(_cfg(tmp_path, sft_steps=2, steps=0, db=str(tmp_path / "first.duckdb")))
    start = checkpoint.checkpoint_dir(_cfg(tmp_path), first)
    cfg = _cfg(tmp_path, sft_steps=4, steps=0, db=str(tmp_path / "more.duckdb"),
               init_from=str(start))
    more = _train(cfg)
    one = checkpoint.load(checkpoint.checkpoint_dir(cfg, whole))
    two = checkpoint.load(checkpoint.checkpoint_dir(cfg, more))
    assert (one.phase, one.step) == (two.phase, two.step) == ("sft", 4)
    differs = [k for k in one.adapter if not torch.equal(one.adapter[k], two.adapter[k])]
    assert not differs, f"{len(differs)} adapter tensors differ, e.g. {differs[:2]}"
    assert any(not torch.equal(one.adapter[k], checkpoint.load(start).adapter[k])
               for k in one.adapter)  # the two SFT steps after the checkpoint did move it
    # the steps' SFT losses agree too (the same batches in the same order)
    loss = {name: queries.metrics(db, run).query("name == 'sft/loss'").set_index("step")["value"]
            for name, db, run in (("whole", str(tmp_path / "store.duckdb"), whole),
                                  ("more", cfg.db, more))}
    assert list(loss["more"].index) == [3, 4]
    assert loss["more"].to_dict() == pytest.approx(loss["whole"].loc[[3, 4]].to_dict(), rel=1e-5)


def test_init_from_refuses_what_does_not_fit(tmp_path):
    with pytest.raises(ConfigError, match="init_from"):
        validate(_cfg(tmp_path, init_from=str(tmp_path / "nowhere")))
    sft_run = _train(_cfg(tmp_path, steps=0))
    start = str(checkpoint.checkpoint_dir(_cfg(tmp_path), sft_run))
    with pytest.raises(TrainingError, match="lora_rank"):
        _train(_cfg(tmp_path, init_from=start, lora_rank=4, db=str(tmp_path / "r.duckdb")))
    with pytest.raises(TrainingError, match="sft_steps=1"):
        _train(_cfg(tmp_path, init_from=start, sft_steps=1, db=str(tmp_path / "s.duckdb")))
    # an RL checkpoint has used its algorithm: going on with another is refused
    rl_run = _train(_cfg(tmp_path, init_from=start, db=str(tmp_path / "rl.duckdb")))
    rl_start = str(checkpoint.checkpoint_dir(_cfg(tmp_path), rl_run))
    with pytest.raises(TrainingError, match="algo"):
        _train(_cfg(tmp_path, init_from=rl_start, algo="gigpo", steps=2,
                    db=str(tmp_path / "g.duckdb")))


def test_resume_keeps_the_turn_credit_heads(tmp_path):
    """SPA's progress head and the PRM head fit each step from the last step's weights
    (core/credit/progress.py ridge_step), so a checkpoint keeps them and a resumed run goes on from
    them instead of from zero."""
    cfg = _cfg(tmp_path, w_spa=1.0, w_prm=1.0, max_turns=2)
    run = _train(cfg)  # SFT steps 1-2, RL step 3
    path = checkpoint.checkpoint_dir(cfg, run) / checkpoint.FILE
    state = torch.load(path, weights_only=True)
    assert state["heads"]["spa"].shape == state["heads"]["prm"].shape  # [hidden, 1] weights
    # the random tiny model never answers right, so the heads have only seen outcome 0 and sit
    # at zero; plant weights a longer run could have learnt, and resume
    gen = torch.Generator().manual_seed(0)
    planted = {k: torch.randn(v.shape, generator=gen, dtype=v.dtype)
               for k, v in state["heads"].items()}
    state["heads"] = planted
    torch.save(state, path)
    _train(cfg.replace(resume=run, steps=2))
    # step 4's fit moved from the planted weights towards outcome 0 (from zero it stays zero)
    after = checkpoint.load(checkpoint.checkpoint_dir(cfg, run)).heads
    for name in ("spa", "prm"):
        assert after[name].abs().sum() > 0 and not torch.allclose(after[name], planted[name])
    trajs = queries.trajectories(cfg.db, run, step=4)
    rows = queries.turn_signals(cfg.db, run, list(trajs["traj_id"]))
    for name in ("progress", "prm"):
        values = rows[rows["name"] == name]["value"]
        assert len(values) > 0 and values.abs().max() > 1e-6, name
