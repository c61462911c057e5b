import pytest

from core.config import ConfigError, TrainConfig, preset, validate, PRESETS


def test_defaults_validate():
    assert validate(TrainConfig()).env == "search"


@pytest.mark.parametrize("data, field", [
    ({"bogus": 1}, "bogus"),
    ({"steps": "ten"}, "steps"),
    ({"lr": True}, "lr"),
])
def test_from_dict_names_bad_field(data, field):
    with pytest.raises(ConfigError, match=field):
        TrainConfig.from_dict(data)


@pytest.mark.parametrize("changes, field", [
    ({"steps": -1}, "steps"),
    ({"group_size": 1, "algo": "grpo"}, "group_size"),
    ({"env": "chess"}, "env"),
    ({"model": "no-such-model"}, "model"),
    ({"top_p": 0.0}, "top_p"),
])
def test_validate_names_bad_field(changes, field):
    with pytest.raises(ConfigError, match=field):
        validate(TrainConfig().replace(**changes))


def test_group_size_one_allowed_for_ppo():
    validate(TrainConfig(algo="ppo", group_size=1))


def test_presets_validate():
    for name in PRESETS:
        validate(preset(name))
