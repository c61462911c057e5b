"""Absurd sizes and non-finite numbers are refused before any work starts, naming the field: by
``validate`` itself, by ``python -m core.train`` (exit status 2) and by the Train page."""
from __future__ import annotations

import math
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import pytest

from core.config.budget import RECORD_BYTES_PER_TOKEN
from core.config import ConfigError, TrainConfig, available_memory, rollout_memory, validate
from tests.test_pages import app, demo  # noqa: F401  (the Train page's AppTest fixtures)

ROOT = Path(__file__).resolve().parent.parent
FLOAT_FIELDS = [f.name for f in fields(TrainConfig) if f.type in ("float", float)]


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_every_float_field_must_be_finite(name, bad):
    with pytest.raises(ConfigError, match=rf"^{name}="):
        validate(TrainConfig().replace(**{name: bad}))


@pytest.mark.parametrize("name, value", [
    ("group_size", 10 ** 6), ("tasks_per_step", 10 ** 6), ("max_turns", 10 ** 6),
    ("max_new_tokens", 10 ** 7), ("max_obs_tokens", 10 ** 7), ("max_context", 10 ** 8),
    ("steps", 10 ** 9), ("sft_steps", 10 ** 9), ("eval_tasks", 10 ** 7), ("topk", 10 ** 5),
    ("lora_rank", 10 ** 6), ("sft_batch_size", 10 ** 6), ("ppo_epochs", 10 ** 6),
    ("minibatches", 10 ** 6), ("threads", 10 ** 6), ("seed", 10 ** 30), ("eval_every", 10 ** 30),
    ("checkpoint_every", 10 ** 30), ("max_bad_steps", 10 ** 30), ("lora_alpha", 10 ** 30),
])
def test_every_size_has_an_upper_bound(name, value):
    with pytest.raises(ConfigError, match=rf"^{name}={value}: must be <="):
        validate(TrainConfig().replace(**{name: value}))


def test_a_rollout_that_cannot_fit_in_memory_is_refused_naming_the_fields():
    # every size within its own bound, but together: 1024 x 4096 trajectories of 1536 tokens
    cfg = TrainConfig(group_size=1024, tasks_per_step=4096)
    need = rollout_memory(cfg)
    assert need > 10 * available_memory()
    with pytest.raises(ConfigError, match=r"^group_size=1024: .*group_size x tasks_per_step"):
        validate(cfg)


def test_the_estimate_by_hand():
    """B x T x (2 x layers x kv_heads x head_dim x 4 + R) + B x vocab x 12 + params x 4."""
    cfg = TrainConfig(model="tiny", group_size=2, tasks_per_step=2, max_turns=2,
                      max_new_tokens=10, max_obs_tokens=20, max_context=1000, eval_every=0)
    kv = 2 * 2 * 2 * 32 * 4                                    # tiny: 2 layers, 2 kv heads of 32
    R = RECORD_BYTES_PER_TOKEN
    assert rollout_memory(cfg) == 4 * 60 * (kv + R) + 4 * 49152 * 12 + 6_700_000 * 4
    capped = cfg.replace(max_turns=20, max_context=64)         # T = min(64, 20 x 30)
    assert rollout_memory(capped) == 4 * 64 * (kv + R) + 4 * 49152 * 12 + 6_700_000 * 4
    # the held-out batch (eval_tasks rollouts at once) counts when it is the bigger one
    evals = cfg.replace(eval_every=5, eval_tasks=10)
    assert rollout_memory(evals) == 10 * 60 * (kv + R) + 10 * 49152 * 12 + 6_700_000 * 4


def test_presets_and_defaults_fit():
    from core.config import PRESETS, preset
    for name in PRESETS:
        assert rollout_memory(preset(name)) < 8 * 2 ** 30, name      # a laptop's memory


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "core.train", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, field", [
    (["--group-size", "1000000", "--tasks-per-step", "1000"], "group_size"),
    (["--w-outcome", "nan"], "w_outcome"),
    (["--cost-per-token", "inf"], "cost_per_token"),
    (["--kl-coef", "nan"], "kl_coef"),
])
def test_cli_refuses_with_exit_2_before_any_work(tmp_path, args, field):
    db = tmp_path / "x.duckdb"
    started = time.monotonic()
    done = _cli(*args, "--db", str(db), "--quiet")
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"error: {field}=" in done.stderr
    assert not db.exists()                                 # nothing was recorded or started
    assert time.monotonic() - started < 60


def test_train_page_refuses_absurd_sizes(app):
    from pages import _jobs
    at = app("train")
    at.number_input(key="train_group_size").set_value(10 ** 6)
    at.number_input(key="train_tasks_per_step").set_value(1000)
    at.button(key="train_launch").click().run()
    assert "Not launched:" in [e.value for e in at.error]
    assert any(c.value.startswith("group_size=1000000") for c in at.code)
    assert not _jobs.job_file().exists()


@pytest.mark.parametrize("flag, text, option", [
    ("--env-options", "code_mem_mb=1000000", "code_mem_mb=1000000: must be an integer in 64..1024"),
    ("--env-options", "code_mem_mb=0,code_wall_s=-1", "code_wall_s=-1: must be a number in 1..60"),
    ("--sft-env-options", "code_wall_s=1000000000", "code_wall_s=1000000000: must be a number"),
    ("--env-options", "code_mem=512", "unknown option(s) code_mem for env apps"),
])
def test_cli_refuses_environment_options_that_lift_the_sandbox(tmp_path, flag, text, option):
    db = tmp_path / "x.duckdb"
    done = _cli("--env", "apps", flag, text, "--db", str(db), "--quiet")
    assert done.returncode == 2, done.stderr[-2000:]
    assert option in done.stderr and f"error: {flag[2:].replace('-', '_')}=" in done.stderr
    assert not db.exists()


def test_train_page_refuses_environment_options_that_lift_the_sandbox(app):
    from pages import _jobs
    at = app("train")
    at.selectbox(key="train_env").set_value("apps")
    at.text_input(key="train_env_options").input("code_mem_mb=1000000,code_wall_s=1000000000")
    at.button(key="train_launch").click().run()
    assert "Not launched:" in [e.value for e in at.error]
    shown = [c.value for c in at.code]
    assert any(s.startswith("env_options=") and "code_mem_mb=1000000: must be an integer in "
               "64..1024" in s and "code_wall_s=1000000000" in s for s in shown), shown
    assert not _jobs.job_file().exists()
    assert "code_mem_mb: an integer in 64..1024" in at.text_input(key="train_env_options").help
