"""env_options / sft_env_options: parsed, validated (errors name the field), and they reach the
environments the trainer builds."""
import pytest

from core.config import ConfigError, TrainConfig, env_kwargs, parse_env_options, validate
from core.envs.base import make_env


def test_values_are_typed():
    assert parse_env_options("a=1, b=0.5,c=true,d=False,e=uniform") == \
        {"a": 1, "b": 0.5, "c": True, "d": False, "e": "uniform"}
    assert parse_env_options("") == {} and parse_env_options(" , ") == {}


def test_semicolons_stand_for_commas_inside_a_value():
    assert parse_env_options("templates=capital;capital>city_founded") == \
        {"templates": "capital,capital>city_founded"}


@pytest.mark.parametrize("text", ["two_hop_frac", "=1", "two_hop_frac=", "a b=1", "x=1,x=2"])
def test_malformed_options_are_refused_naming_the_field(text):
    with pytest.raises(ConfigError, match="env_options"):
        validate(TrainConfig(env="search", env_options=text))
    with pytest.raises(ConfigError, match="sft_env_options"):
        validate(TrainConfig(env="search", sft_env_options=text))


def test_unknown_option_for_the_env_is_refused():
    with pytest.raises(ConfigError, match="env_options.*expert.*search"):
        validate(TrainConfig(env="search", env_options="expert=uniform"))
    validate(TrainConfig(env="bandit", env_options="expert=uniform,arms=stated"))


def test_options_reach_the_environment():
    cfg = validate(TrainConfig(env="search", env_options="two_hop_frac=0.75",
                               sft_env_options="two_hop_frac=0.1", outcome_metric="f1", topk=2))
    rl, sft = make_env("search", **env_kwargs(cfg)), make_env("search", **env_kwargs(cfg, sft=True))
    assert (rl.two_hop_frac, sft.two_hop_frac) == (0.75, 0.1)
    assert rl.outcome_metric == "f1" and rl.topk == 2
    hops = [t.meta["hops"] for t in rl.tasks("train", 40, 0)]
    assert hops.count(2) == 30
    ev = make_env("search", **env_kwargs(cfg.replace(eval_env_options="two_hop_frac=0.5"), eval=True))
    assert ev.two_hop_frac == 0.5
    with pytest.raises(ConfigError, match="eval_env_options"):
        validate(TrainConfig(env="search", eval_env_options="expert=uniform"))
    bandit = make_env("bandit", **env_kwargs(TrainConfig(env="bandit", env_options="expert=uniform")))
    assert bandit.expert == "uniform"


def test_eval_env_options_fix_the_heldout_set_while_the_rl_mix_changes():
    from core.trainer import _Run
    from storage.recorder import NullRecorder
    base = TrainConfig(env="search", model="tiny", env_options="two_hop_frac=0.75", eval_tasks=20,
                       steps=0, threads=1)
    moved = base.replace(env_options="two_hop_frac=0.25", eval_env_options="two_hop_frac=0.75")
    first, second = _Run(base, NullRecorder(), False), _Run(moved, NullRecorder(), False)
    assert second.env.two_hop_frac == 0.25 and second.eval_env.two_hop_frac == 0.75
    assert [t.task_id for t in second.eval_tasks] == [t.task_id for t in first.eval_tasks]
