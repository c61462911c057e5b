"""``--model DIR`` with models of other families, built here at test time (tests/model_builders.py:
a Qwen2 model with Qwen2's template, a Llama model with Llama 3's template and special tokens, a
GPT-2 model without any chat template; and a tiny Llama written as a GGUF file). Each trains an SFT step and an RL step in every built-in
environment, recorded in a real store, and the mask lint stays clean: no template token is
trained, no action token is masked, every action's tokens are its text; prompts and observations
are rendered by the model's own template (or raw, and recorded so)."""
import json

import duckdb
import pytest

from core.config import ENVS, ConfigError, TrainConfig, validate
from core.model.policy import load_policy
from core.run.trainer import train
from pages._tokens import mask_lint
from storage import queries
from storage.recorder import Recorder
from tests import model_builders
from tests.model_builders import GGUF_VOCAB

MARKERS = {"qwen2": ("<|im_start|>", "<|im_end|>"),
           "llama3": ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
           "gpt2": ()}
"""The template markers each family's rendered prompt must (and the others' must not) hold."""
USER_TURN_ENVS = ("frozenlake", "sokoban", "bandit", "corridor")
"""Environments whose observations are new user messages (``observation_role = "user"``)."""
MASK_ISSUES = ("observation/prompt token trained", "action token not trained")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {f: str(model_builders.build(f, root / f)) for f in model_builders.FAMILIES}


def _run(model: str, env: str, db) -> str:
    cfg = TrainConfig(env=env, model=model, db=str(db), steps=1, sft_steps=1, sft_batch_size=2,
                      group_size=2, tasks_per_step=1, max_turns=2, max_new_tokens=8,
                      max_obs_tokens=96, max_context=768, eval_every=0, threads=1,
                      device="cpu")
    recorder = Recorder(str(db))
    try:
        return train(cfg, recorder, progress=False)
    finally:
        recorder.close()


def test_policy_resolves_family(model_dirs):
    """all-linear finds each family's own layers (GPT-2's Conv1D too); the prompt format is the
    template's, or raw without one."""
    for family, path in model_dirs.items():
        policy = load_policy(path)
        want = ["c_attn", "c_fc", "c_proj"] if family == "gpt2" else \
            ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
        assert policy.lora_target_modules == want
        assert "lm_head" not in policy.lora_target_modules
        assert policy.prompt_format == ("raw" if family == "gpt2" else "chat_template")
    with pytest.raises(ValueError, match="it has these linear layers: c_attn, c_fc, c_proj"):
        load_policy(model_dirs["gpt2"], lora_targets="q_proj,v_proj")


def test_a_directory_without_a_model_is_a_clear_error(tmp_path, capsys):
    from core.commands.train import main
    empty = tmp_path / "empty"
    empty.mkdir()
    args = ["--env", "bandit", "--steps", "1", "--db", str(tmp_path / "s.duckdb"), "--quiet"]
    assert main(args + ["--model", str(empty)]) == 1
    assert "no config.json, so not a Hugging Face model directory" in capsys.readouterr().err
    assert main(args + ["--model", str(tmp_path / "missing")]) == 2
    assert "an existing local model directory or a .gguf file" in capsys.readouterr().err


@pytest.mark.parametrize("family", model_builders.FAMILIES)
def test_trains_every_env_with_a_clean_mask(model_dirs, family, tmp_path):
    path = model_dirs[family]
    tok = load_policy(path).tokenizer
    db = tmp_path / "store.duckdb"
    for env in ENVS:
        _check_run(db, _run(path, env, db), env, path, tok, family)


def test_gguf_file_trains_and_is_cached(tmp_path, monkeypatch):
    """--model FILE.gguf: dequantized once into the cache (keyed by the file), then read from
    there; it trains and records like a directory."""
    path = str(model_builders.build_gguf(tmp_path / "tiny.gguf"))
    cache = tmp_path / "cache"
    monkeypatch.setenv("AGENTRL_CACHE", str(cache))
    validate(TrainConfig(model=path))
    with pytest.raises(ConfigError, match="model="):
        validate(TrainConfig(model=str(tmp_path / "missing.gguf")))
    policy = load_policy(path)
    converted = [p.name for p in cache.iterdir()]
    assert len(converted) == 1 and converted[0].startswith("gguf-tiny-"), converted
    assert (cache / converted[0] / "model" / "model.safetensors").is_file()
    assert policy.prompt_format == "chat_template" and len(policy.tokenizer) == GGUF_VOCAB
    db = tmp_path / "store.duckdb"
    _check_run(db, _run(path, "bandit", db), "bandit", path, policy.tokenizer, "qwen2")
    assert [p.name for p in cache.iterdir()] == converted  # the second load used the cache


def _check_run(db, run_id: str, env: str, path: str, tok, family: str) -> None:
    """The run finished and recorded its resolved config; every trajectory's mask is clean."""
    special = set(tok.all_special_ids)
    eos = tok.eos_token_id
    con = duckdb.connect(str(db), read_only=True)
    status, config = con.execute("SELECT status, config FROM runs WHERE run_id = ?",
                                 [run_id]).fetchone()
    trajs = con.execute("SELECT traj_id, split FROM trajectories WHERE run_id = ?",
                        [run_id]).fetchall()
    con.close()
    config = json.loads(config)
    assert status == "finished", (env, status)
    assert config["model"] == path and config["device_resolved"] == "cpu"
    assert config["prompt_format"] == ("raw" if family == "gpt2" else "chat_template")
    assert config["lora_target_modules"], env
    assert {s for _, s in trajs} == {"sft", "train"}, env
    for traj_id, split in trajs:
        tokens = queries.tokens(str(db), run_id, traj_id)
        turns = queries.turns(str(db), run_id, [traj_id])
        lint = mask_lint(tokens, turns, updated=True)
        assert not lint["issue"].isin(MASK_ISSUES).any(), (env, traj_id, lint)
        assert (tokens["trained"] == (tokens["role"] == "action")).all(), (env, traj_id)
        # no template token trained: a special token in an action is only the model's own
        # end-of-turn token, sampled by it at the action's end
        acted = tokens[tokens["role"] == "action"]
        last = acted.groupby("turn")["pos"].transform("max")
        stray = acted[acted["token_id"].isin(special) &
                      ((acted["token_id"] != eos) | (acted["pos"] != last))]
        assert stray.empty, (env, traj_id, stray[["pos", "text"]])
        # each turn's action tokens are exactly its action text (+ the stop token)
        for _, turn in turns.iterrows():
            ids = acted[acted["turn"] == turn["turn"]]["token_id"].tolist()
            if ids and ids[-1] == eos:
                ids = ids[:-1]
            assert tok.decode(ids) == turn["action"], (env, traj_id, turn["turn"])
        # the games' observations are user turns in the family's own template
        if env in USER_TURN_ENVS and family != "gpt2":
            for turn_no, obs in tokens[tokens["role"] == "observation"].groupby("turn"):
                text = "".join(obs.sort_values("pos")["text"])
                assert MARKERS[family][0] in text, (env, traj_id, turn_no, text)
        # the prompt is the family's own layout
        prompt = "".join(tokens[tokens["role"] == "prompt"].sort_values("pos")["text"])
        for other, markers in MARKERS.items():
            for marker in markers:
                if other == family:
                    assert marker in prompt, (env, marker)
                elif marker not in MARKERS[family]:
                    assert marker not in prompt, (env, family, marker)
