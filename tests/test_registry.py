"""The one registry (core/algorithms/registry.py): every algorithm declared once
(core/algorithms/catalog.py), every estimator and credit step registered where it is defined, every
name has its pieces, the Python API, the CLI and the Train page resolve the same configuration,
the NumPy estimators the pages use are the trainer's, ``dual_clip`` reaches the loss, and LOOP
trains through the CLI."""
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import duckdb
import numpy as np
import pytest
import torch
import yaml

from core.credit import advantages

from core.algorithms import REGISTRY, estimators, resolve
from core.algorithms.registry import Algorithm, Registry
from core.credit import assign as credit
from core.config import ALGOS, GROUP_ALGOS, PRESETS, ConfigError, TrainConfig, validate
from core.commands.train import build_parser, resolve_config
from pages import _credit, _jobs
from tests.test_pages import app, demo, texts  # noqa: F401  (the Train page's AppTest fixtures)

ROOT = Path(__file__).resolve().parent.parent
PLACE = {"db", "name"}  # where a run is recorded, not what it trains


def _trained(cfg: TrainConfig) -> dict:
    return {k: v for k, v in cfg.to_dict().items() if k not in PLACE}


# -- every name has its pieces --------------------------------------------------------------------
def test_every_algorithm_has_an_estimator_or_a_critic_and_a_credit_step():
    assert ALGOS == tuple(REGISTRY.algorithms) and "loop" in ALGOS
    # each credit step registered where it is defined (core/credit/assign.py), one table
    assert REGISTRY.credit_steps == {"outcome": credit.outcome, "starpo_s": credit.starpo_s,
                                     "gigpo": credit.gigpo, "gae": credit.ppo}
    assert REGISTRY.estimators == {"grpo": estimators.grpo, "dr_grpo": estimators.dr_grpo,
                                   "rloo": estimators.rloo}
    for name, algo in REGISTRY.algorithms.items():
        assert resolve(name) is algo and algo.credit_step is REGISTRY.credit_steps[algo.credit]
        # per-token GAE needs the value head's estimates; everything else an outcome estimator
        assert (algo.credit == "gae") == algo.needs_value_head == (algo.estimator is None), name
        assert (name in advantages.ESTIMATORS) == (algo.estimator is not None), name
        assert (name in GROUP_ALGOS) == algo.group_based, name
        assert algo.summary and algo.source, name


def test_the_registry_refuses_a_name_twice_and_an_unknown_one():
    reg = Registry()
    reg.estimator("mean")(lambda r, ids: r)
    with pytest.raises(ValueError, match="estimator 'mean' is registered twice"):
        reg.estimator("mean")(lambda r, ids: r)
    with pytest.raises(ValueError, match="estimator 'nope' is not registered"):
        reg.algorithm(Algorithm("x", "x", "nope", "outcome"))
    with pytest.raises(ValueError, match="unknown algorithm 'x'; one of"):
        reg.resolve("x")
    with pytest.raises(LookupError, match="credit step 'nowhere' of y is not registered"):
        _ = Algorithm("y", "y", None, "nowhere").credit_step


def test_a_run_resolves_its_algorithm_once_and_hands_it_on():
    """core/run/steps.py: the Setup carries the resolved Algorithm; no stage past the build
    looks ``cfg.algo`` up by name (the entry points' fallbacks serve callers without a run)."""
    steps_src = (ROOT / "core/run/steps.py").read_text()
    assert steps_src.count("resolve(cfg.algo)") == 1 and "algo=run.algo" in steps_src
    for path in ("core/credit/assign.py", "core/learn/update.py", "core/model/policy.py"):
        src = (ROOT / path).read_text()
        assert src.count("resolve(cfg.algo)") <= 1, path   # one fallback, at the entry


def test_algorithm_defaults_name_config_fields_the_config_applies():
    by_algo = {f.name for f in fields(TrainConfig)
               if isinstance(getattr(TrainConfig, f.name), float | str)
               and type(getattr(TrainConfig, f.name)) not in (float, str)}
    for name, algo in REGISTRY.algorithms.items():
        assert set(algo.defaults) <= by_algo, name          # else they would silently not apply
        cfg = validate(TrainConfig(algo=name))
        for key, value in algo.defaults.items():
            assert getattr(cfg, key) == value, (name, key)
    loop = TrainConfig(algo="loop")
    assert (loop.clip_mode, loop.clip_eps_high, loop.loss_agg, loop.min_abs_advantage,
            loop.kl_coef) == ("log", 0.1, "seq-mean-token-mean", 0.01, 0.0)
    assert type(loop.clip_mode) is str and type(loop.kl_coef) is float   # no marker leaks out


# -- Python, CLI and the Train page train the same thing -------------------------------------------
@pytest.mark.parametrize("algo", ALGOS)
def test_python_api_and_cli_resolve_the_same_config(algo):
    parse = build_parser().parse_args
    python = TrainConfig(algo=algo)
    cli = resolve_config(parse(["--algo", algo]))
    assert _trained(cli) == _trained(python)
    preset = {**PRESETS["workshop-demo"], "algo": algo}
    assert (_trained(resolve_config(parse(["--preset", "workshop-demo", "--algo", algo])))
            == _trained(TrainConfig(**preset)) == _trained(TrainConfig.from_dict(preset)))


def test_starpo_s_from_python_gets_clip_higher_like_the_cli():
    assert (TrainConfig(algo="starpo_s").clip_eps_high, TrainConfig(algo="starpo_s").kl_coef) == (
        0.28, 0.0)
    assert TrainConfig().replace(algo="starpo_s").clip_eps_high == 0.28       # defaults follow algo
    assert TrainConfig(algo="starpo_s").replace(algo="grpo").clip_eps_high == 0.2


def test_explicit_values_win_over_algorithm_defaults_everywhere(tmp_path):
    parse = build_parser().parse_args
    # an explicit value equal to the generic default still wins
    assert TrainConfig(algo="starpo_s", clip_eps_high=0.2).clip_eps_high == 0.2
    assert TrainConfig.from_dict({"algo": "starpo_s", "clip_eps_high": 0.2}).clip_eps_high == 0.2
    assert resolve_config(parse(["--algo", "starpo_s", "--clip-eps-high", "0.2"])).clip_eps_high == 0.2
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml.safe_dump({"algo": "loop", "clip_mode": "ppo", "kl_coef": 0.001}))
    cfg = resolve_config(parse(["--config", str(cfg_file)]))
    assert (cfg.clip_mode, cfg.kl_coef, cfg.clip_eps_high) == ("ppo", 0.001, 0.1)
    kept = TrainConfig(algo="starpo_s", kl_coef=0.01).replace(algo="loop")
    assert (kept.kl_coef, kept.clip_mode) == (0.01, "log")          # explicit kept, rest re-applied
    # a stored run's configuration comes back exactly (resume, torchrun's broadcast)
    star = TrainConfig(algo="starpo_s")
    assert TrainConfig.from_dict(star.to_dict()) == star


def test_train_page_launches_what_python_and_the_cli_resolve(app, monkeypatch, tmp_path):
    launched = []

    def capture(cfg, name):  # the page's real config file and command line, not started
        launched.append(_jobs.command(_jobs.write_config(cfg, tmp_path / f"{name}.yaml"), name))
        raise _jobs.JobError("captured for the test")
    monkeypatch.setattr(_jobs, "launch", capture)
    at = app("train")
    assert list(at.selectbox(key="train_algo").options) == list(ALGOS)
    parse = build_parser().parse_args
    for algo in ALGOS:
        at.selectbox(key="train_algo").set_value(algo)
        at.button(key="train_launch").click().run()
        assert any("captured" in c for c in texts(at, "code")), algo
        page = resolve_config(parse(launched[-1][3:]))
        python = TrainConfig(**{**PRESETS["workshop-demo"], "algo": algo})
        assert _trained(page) == _trained(python), algo


# -- one set of estimators ------------------------------------------------------------------------
def _reference(name, rewards, ids):
    """Plain per-group loops, written from the formulas."""
    out = []
    for r, g in zip(rewards, ids):
        group = [x for x, h in zip(rewards, ids) if h == g]
        k, mean = len(group), sum(group) / len(group)
        if k < 2 or max(group) == min(group):
            out.append(0.0)
        elif name == "grpo":
            std = (sum((x - mean) ** 2 for x in group) / (k - 1)) ** 0.5
            out.append((r - mean) / (std + 1e-6))
        elif name == "dr_grpo":
            out.append(r - mean)
        else:  # rloo
            out.append(r - (sum(group) - r) / (k - 1))
    return out


def test_numpy_and_tensor_estimators_agree_on_random_batches():
    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.integers(1, 40))
        ids = [f"g{int(x)}" for x in rng.integers(0, max(1, n // 3), size=n)]
        if trial % 3 == 0:  # ties and flat groups, as 0/1 rewards give
            rewards = rng.integers(0, 2, size=n).astype(np.float64)
        else:
            rewards = rng.normal(0, 3, size=n)
        for name in ("grpo", "dr_grpo", "rloo"):
            numpy_adv = resolve(name).estimate(rewards, ids)
            tensor_adv = advantages.ESTIMATORS[name](torch.tensor(rewards), ids)
            assert isinstance(tensor_adv, torch.Tensor) and tensor_adv.dtype == torch.float64
            assert isinstance(advantages.ESTIMATORS[name](rewards, ids), np.ndarray)
            np.testing.assert_allclose(tensor_adv.numpy(), numpy_adv, rtol=0, atol=1e-12)
            np.testing.assert_allclose(numpy_adv, _reference(name, rewards.tolist(), ids),
                                       rtol=1e-9, atol=1e-9)
            f32 = advantages.ESTIMATORS[name](torch.tensor(rewards, dtype=torch.float32), ids)
            assert f32.dtype == torch.float32
    assert torch.equal(advantages.ESTIMATORS["loop"](torch.tensor([1.0, 0.0, 0.5]), [0, 0, 0]),
                       advantages.rloo(torch.tensor([1.0, 0.0, 0.5]), [0, 0, 0]))


def test_pages_credit_calls_the_trainers_estimators(monkeypatch):
    import pandas as pd
    monkeypatch.setattr(estimators, "grpo", lambda r, ids: np.full(len(r), 7.0))
    assert _credit.grpo([1.0, 0.0]).tolist() == [7.0, 7.0]
    monkeypatch.setattr(estimators, "gigpo_step_advantages",
                        lambda rs, keys, ids, gamma, normalize: [[0.5] * len(r) for r in rs])
    trajs = pd.DataFrame({"traj_id": ["x", "y"], "reward": [1.0, 0.0], "prompt": ["P", "P"]})
    turns = pd.DataFrame({"traj_id": ["x", "y"], "turn": [0, 0], "observation": ["", ""],
                          "action": ["a", "a"], "step_reward": [0.0, 0.0]})
    assert _credit.gigpo_steps(trajs, turns)["A_step"].tolist() == [0.5, 0.5]


def test_pages_credit_and_the_registry_do_not_import_torch():
    code = ("import sys, core.algorithms, core.config, pages._credit; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


# -- dual clip ------------------------------------------------------------------------------------
def test_dual_clip_is_a_config_field_from_cli_and_yaml(tmp_path):
    parse = build_parser().parse_args
    assert TrainConfig().dual_clip == 0.0
    assert resolve_config(parse(["--dual-clip", "3"])).dual_clip == 3.0
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml.safe_dump({"dual_clip": 3}))
    assert resolve_config(parse(["--config", str(cfg_file)])).dual_clip == 3.0
    with pytest.raises(ConfigError, match="^dual_clip="):
        validate(TrainConfig(dual_clip=0.5))


@pytest.mark.usefixtures("one_torch_thread")
def test_dual_clip_caps_the_loss_the_update_applies():
    from core.envs.base import make_env
    from core.model.policy import load_policy
    from core.rollout.engine import rollout
    from core.rollout.sampling import Sampling
    from core.learn.update import make_samples, policy_update
    pol = load_policy("tiny", seed=0)
    env = make_env("bandit", seed=0)
    trajs = rollout(pol, env, env.tasks("train", 1, 0), group_size=2, seed=0, id_prefix="s1",
                    sampling=Sampling(max_turns=1, max_new_tokens=6, temperature=1.0))

    def pg_loss(dual_clip: float) -> float:
        samples = make_samples(trajs, [-torch.tensor(t.trained, dtype=torch.float32) for t in trajs])
        for s in samples:  # the sampling policy gave every action token e^-5 of today's probability
            s.old_logprobs = s.old_logprobs - 5.0
        cfg = TrainConfig(env="bandit", model="tiny", kl_coef=0.0, lr=1e-9, kl_abort=1e9,
                          dual_clip=dual_clip, max_new_tokens=6, max_turns=1)
        return policy_update(pol, torch.optim.SGD(pol.trainable_parameters(), lr=1e-9), samples,
                             cfg).metrics["policy/pg_loss"]
    assert pg_loss(0.0) == pytest.approx(np.exp(5.0), rel=1e-3)    # -A * r with r = e^5, A = -1
    assert pg_loss(3.0) == pytest.approx(3.0, rel=1e-6)            # capped at -A * c


# -- LOOP end to end ------------------------------------------------------------------------------
def test_loop_trains_one_step_on_the_tiny_model_through_the_cli(tmp_path):
    db = tmp_path / "loop.duckdb"
    # the workshop demo's SFT teaches the bandit's answer format, so rewards differ within a
    # group and LOOP's |A| >= 0.01 filter leaves rollouts to train on (a random model's all fail)
    args = ["--preset", "workshop-demo", "--algo", "loop", "--steps", "1", "--group-size", "4",
            "--tasks-per-step", "2", "--cost-per-token", "0.01", "--eval-every", "0", "--quiet",
            "--db", str(db)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "core.train", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    con = duckdb.connect(str(db), read_only=True)
    try:
        [(status, algo, mode, agg, floor)] = con.execute(
            "SELECT status, config->>'algo', config->>'clip_mode', config->>'loss_agg', "
            "CAST(config->>'min_abs_advantage' AS DOUBLE) FROM runs").fetchall()
        metrics = dict(con.execute("SELECT name, value FROM metrics WHERE step = "
                                   "(SELECT max(step) FROM metrics)").fetchall())
    finally:
        con.close()
    assert (status, algo, mode, agg, floor) == ("finished", "loop", "log", "seq-mean-token-mean",
                                                0.01)
    assert metrics["update/steps"] == 1.0 and metrics["update/trained_trajectories"] > 0
    assert {"grad/norm", "policy/clipfrac", "policy/pg_loss"} <= set(metrics)
    assert not [n for n in metrics if n.startswith("value/")]        # no value network
