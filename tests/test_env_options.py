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
    from core.config import Environments
    from core.run.schedule import Schedule
    base = TrainConfig(env="search", model="tiny", env_options="two_hop_frac=0.75", eval_tasks=20,
                       steps=0, threads=1)
    moved = base.replace(env_options="two_hop_frac=0.25", eval_env_options="two_hop_frac=0.75")

    def held_out(cfg):
        envs = Environments(cfg)
        return envs, Schedule(cfg, envs.train, envs.sft, envs.eval).eval_tasks

    (_, first), (envs, second) = held_out(base), held_out(moved)
    assert envs.train.two_hop_frac == 0.25 and envs.eval.two_hop_frac == 0.75
    assert [t.task_id for t in second] == [t.task_id for t in first] and len(first) == 20


# ---- declared options: unknown names and out-of-bounds values are refused by name ------------
SANDBOX_LIFTS = ["code_mem_mb=1000000", "code_wall_s=1000000000", "code_mem_mb=0",
                 "code_wall_s=-1", "code_cpu_s=0", "code_cpu_s=1000000", "code_wall_s=nan",
                 "code_mem_mb=512.5", "code_cpu_s=true"]


@pytest.mark.parametrize("fld", ["env_options", "sft_env_options", "eval_env_options"])
@pytest.mark.parametrize("text", SANDBOX_LIFTS)
def test_options_that_would_lift_the_sandbox_are_refused_naming_option_value_and_bounds(fld, text):
    name, value = text.split("=")
    with pytest.raises(ConfigError) as caught:
        validate(TrainConfig(env="apps", **{fld: text}))
    message = str(caught.value)
    assert message.startswith(f"{fld}={text!r}: ")
    low, high = {"code_mem_mb": ("64", "1024"), "code_wall_s": ("1", "60"),
                 "code_cpu_s": ("1", "60")}[name]
    assert f" in {low}..{high}" in message and name in message and value.lower() in message.lower()


def test_every_bad_option_is_named_at_once():
    with pytest.raises(ConfigError, match=r"code_mem_mb=1000000: must be an integer in 64\.\.1024"
                       r".*; code_wall_s=1000000000: must be a number in 1\.\.60"):
        validate(TrainConfig(env="apps", env_options="code_mem_mb=1000000,code_wall_s=1000000000"))


def test_the_bounds_themselves_are_accepted():
    cfg = validate(TrainConfig(env="apps", env_options="code_mem_mb=1024,code_wall_s=60,code_cpu_s=60",
                               eval_env_options="code_mem_mb=64,code_wall_s=1,code_cpu_s=1"))
    env = make_env("apps", **env_kwargs(cfg))
    assert env.limits == {"cpu_s": 60, "wall_s": 60.0, "mem_mb": 1024}


def test_an_unknown_option_is_refused_listing_the_known_ones():
    with pytest.raises(ConfigError, match=r"^env_options='code_mem=512': unknown option\(s\) "
                       r"code_mem for env apps; known: .*code_mem_mb"):
        validate(TrainConfig(env="apps", env_options="code_mem=512"))


@pytest.mark.parametrize("name, kwargs, message", [
    ("apps", {"code_mem_mb": 10 ** 6}, "code_mem_mb=1000000: must be an integer in 64..1024"),
    ("apps", {"code_wall_s": -1}, "code_wall_s=-1: must be a number in 1..60"),
    ("frozenlake", {"sizee": 5}, r"unknown option\(s\) sizee for env frozenlake"),
    ("sokoban", {"size": 4}, "size=4: must be an integer in 5..12"),
    ("bandit", {"arms": "both"}, "arms='both': must be text, one of fixed, stated"),
    ("search", {"two_hop": 0.5}, r"unknown option\(s\) two_hop for env search"),
])
def test_the_environment_itself_refuses_what_it_does_not_declare(name, kwargs, message):
    # make_env without validate (bench scripts, users' code): the constructor checks too
    with pytest.raises(ValueError, match=message):
        make_env(name, seed=0, topk=3, **kwargs)


def test_declared_defaults_are_within_their_own_bounds():
    from core.config import ENVS
    from core.config.env_options import ENV_OPTIONS, declared_options
    for env in ENVS:
        declared = declared_options(env)
        assert declared and tuple(declared) == ENV_OPTIONS[env], env
        for name, opt in declared.items():
            if opt.default is not None:
                assert opt.check(name, opt.default) == opt.default, (env, name)


def test_declarations_are_read_without_torch():
    import subprocess
    import sys
    code = ("import sys; from core.config import ENV_OPTIONS, TrainConfig, validate; "
            "names = {e: ENV_OPTIONS[e] for e in ENV_OPTIONS}; "
            "validate(TrainConfig(env='apps', env_options='code_mem_mb=512')); "
            "assert 'code_mem_mb' in names['apps'], names; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_largest_memory_allowed_still_refuses_a_1_5_gb_allocation():
    """A real <code> action in the sandbox, built with the cap code_mem_mb may take."""
    from core.envs.apps.env import AppsEnv
    cap = AppsEnv.OPTIONS["code_mem_mb"].high
    env = make_env("apps", **env_kwargs(validate(TrainConfig(
        env="apps", env_options=f"code_mem_mb={cap},code_wall_s=20"))))
    episode = env.episode(env.tasks("train", 1, 0)[0], 0)
    episode.reset()
    result = episode.step("<code>x = 'a' * (1536 * 1024 * 1024)\nprint(len(x))</code>")
    assert result.error and result.error.startswith("MemoryError"), result.observation
    assert "1610612736" not in result.observation
    small = episode.step("<code>x = 'a' * (256 * 1024 * 1024)\nprint(len(x))</code>")
    assert small.error is None and "268435456" in small.observation  # the cap is not 0
