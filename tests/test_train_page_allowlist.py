"""The Train page offers models and environments from the allow-list the server's environment
sets (AGENTRL_MODEL_DIRS, AGENTRL_ENV_MODULES) and nothing typed in: a path or module not on the
list cannot be launched. It says which device the job will use. A plugin environment launched
from the page trains and is recorded (a real job, tiny model)."""
from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import duckdb
import pytest
import yaml
import streamlit as st
import streamlit.testing.v1.app_test as app_test
from streamlit.testing.v1 import AppTest

from core.config import ENVS, MODELS, PRESETS, TrainConfig
from pages import _jobs
from storage import queries
from tests.test_pages import _NavigationPagesManager

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
GUESS = "examples.guess:Factory"


@pytest.fixture
def model_dirs(tmp_path):
    """Two listed directories (one missing): a model dir, a .gguf file, and things not offered."""
    first = tmp_path / "models"
    (first / "llama-small").mkdir(parents=True)
    (first / "llama-small" / "config.json").write_text("{}")
    (first / "no-config").mkdir()                              # no config.json: not a model
    (first / "qwen.Q4_1.gguf").write_bytes(b"GGUF")
    (first / "notes.txt").write_text("not a model")
    (first / "deeper" / "inner").mkdir(parents=True)
    (first / "deeper" / "inner" / "config.json").write_text("{}")  # not a direct child
    return first, tmp_path / "missing"


@pytest.fixture
def page(monkeypatch, tmp_path, model_dirs):
    monkeypatch.setattr(app_test, "PagesManager", _NavigationPagesManager)
    monkeypatch.setenv(queries.STORE_DIRS_ENV, str(tmp_path / "stores"))
    monkeypatch.setenv(_jobs.RUNS_DIR_ENV, str(tmp_path / "runs"))
    monkeypatch.setenv(_jobs.MODEL_DIRS_ENV, os.pathsep.join(map(str, model_dirs)))
    monkeypatch.setenv(_jobs.ENV_MODULES_ENV, f" {GUESS} , not a module!,, ")
    monkeypatch.chdir(ROOT)
    st.cache_data.clear()

    def open_page() -> AppTest:
        at = AppTest.from_file(APP, default_timeout=120).run()
        at = at.switch_page("pages/train.py").run()
        assert not at.exception, at.exception
        return at
    return open_page


def test_the_allow_listed_models_and_environments_are_offered_and_nothing_else(page, model_dirs):
    at = page()
    first = model_dirs[0].resolve()
    assert at.selectbox(key="train_model").options == [
        *MODELS, "llama-small (" + str(first) + ")", "qwen.Q4_1.gguf (" + str(first) + ")"]
    assert list(_jobs.allowed_models()) == [str(first / "llama-small"),
                                           str(first / "qwen.Q4_1.gguf")]
    assert at.selectbox(key="train_env").options == [*ENVS, GUESS]
    warnings = [w.value for w in at.warning]
    assert any("not a module?" in w and "ignored" in w for w in warnings), warnings  # escaped
    captions = " ".join(c.value for c in at.caption)
    assert "2 model(s) from AGENTRL_MODEL_DIRS" in captions and "1 plugin environment" in captions


def test_the_page_says_which_device_the_job_will_use(page):
    at = page()
    seen = _jobs.accelerator()
    assert "error" not in seen, seen
    expected = "cuda" if seen["cuda"] else "cpu"
    assert any(f"The job will train on **{expected}**" in c.value for c in at.caption)
    assert _jobs.job_device("cpu")[0] == "cpu"
    if not seen["cuda"]:
        assert "no CUDA GPU" in _jobs.job_device("auto")[1]
        assert "refuse" in _jobs.job_device("cuda")[1]


def test_a_path_or_module_not_on_the_list_cannot_be_launched(page, model_dirs, tmp_path):
    first = model_dirs[0].resolve()
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "config.json").write_text("{}")
    at = page()
    # The browser sends the index of an offered option, never a path: an unlisted one has none,
    # so the submission cannot even be encoded.
    at.selectbox(key="train_model").set_value(str(other))
    with pytest.raises(ValueError, match="not in list"):
        at.button(key="train_launch").click().run()
    assert not _jobs.job_file().exists()
    # The launcher itself refuses whatever is not listed, however it is spelled.
    for model in (str(other), str(first / "no-config"), str(first / "llama-small/../no-config"),
                  str(first / "deeper" / "inner"), str(first / "notes.txt")):
        with pytest.raises(_jobs.JobError, match="allow-list"):
            _jobs.launch(TrainConfig.from_dict({"env": "bandit", "model": model}), "x")
    with pytest.raises(_jobs.JobError, match="AGENTRL_ENV_MODULES"):
        _jobs.launch(TrainConfig.from_dict({"env": "os.path:join", "model": "tiny"}), "x")
    assert not _jobs.job_file().exists() and not (_jobs.runs_dir() / "logs").exists()
    ok = TrainConfig.from_dict({"env": GUESS, "model": str(first / "llama-small")})
    assert _jobs.allowed(ok) is ok


def test_a_plugin_environment_launched_from_the_page_trains_and_is_recorded(page):
    at = page()
    at.selectbox(key="train_env").set_value(GUESS)
    at.text_input(key="train_env_options").input("high=8")
    for key, value in (("group_size", 2), ("tasks_per_step", 2), ("max_turns", 2), ("steps", 1),
                       ("sft_steps", 1)):
        at.number_input(key=f"train_{key}").set_value(value)
    at.text_input(key="train_name").input("guess-from-page")
    at.button(key="train_launch").click().run()
    assert not at.exception
    assert any("Started job" in s.value for s in at.success), [e.value for e in at.error] + [
        c.value for c in at.code]
    job = json.loads(_jobs.job_file().read_text())
    assert job["args"][1:] == ["core.train", "--config", job["config"], "--db", job["db"],
                               "--name", "guess-from-page"]
    written = yaml.safe_load(Path(job["config"]).read_text())
    assert (written["env"], written["env_options"], written["steps"]) == (GUESS, "high=8", 1)
    child = _jobs._CHILDREN[job["pid"]]
    assert child.wait(timeout=300) == 0, _jobs.log_tail(job)
    con = duckdb.connect(job["db"], read_only=True)
    try:
        rows = con.execute("SELECT name, status, config->>'env', config->>'env_options' "
                           "FROM runs").fetchall()
        splits = dict(con.execute("SELECT split, count(*) FROM trajectories GROUP BY 1").fetchall())
    finally:
        con.close()
    assert rows == [("guess-from-page", "finished", GUESS, "high=8")]
    assert splits.get("sft") and splits.get("train") == 4


def test_a_launched_job_reads_its_whole_configuration_from_one_file(monkeypatch, tmp_path,
                                                                    capsys):
    """The launcher writes the form's configuration, every field, to one file beside the job's
    log; the job resolves it to the same TrainConfig, and refuses a bad value in it by name."""
    from core.commands.train import build_parser, main, resolve_config
    monkeypatch.setenv(_jobs.RUNS_DIR_ENV, str(tmp_path / "runs"))
    started = []
    monkeypatch.setattr(_jobs, "spawn", lambda args, log: started.append(args)
                        or SimpleNamespace(pid=2 ** 22 + 12345))           # not started
    # values YAML could misread: a tiny float, a string that is a YAML 1.1 boolean, flipped bools
    cfg = TrainConfig.from_dict({**PRESETS["workshop-demo"], "algo": "starpo_s", "lr": 1e-6,
                                 "temperature": 0.7, "lora_targets": "on", "seed": 7,
                                 "record_info_gain": False, "endpoint_logprobs": False})
    job = _jobs.launch(cfg, "demo.v2")
    args = started[0]
    assert job["args"] == args[1:] and args[3:] == [
        "--config", job["config"], "--db", str(_jobs.store_path()), "--name", "demo.v2"]
    assert job["log"] == job["config"][:-len(".yaml")] + ".log"     # beside the log
    assert json.loads(_jobs.job_file().read_text())["config"] == job["config"]
    written = yaml.safe_load(Path(job["config"]).read_text())
    assert list(written) == [f.name for f in fields(TrainConfig)]     # every field
    expected = cfg.replace(db=str(_jobs.store_path()), name="demo.v2")
    for got in (resolve_config(build_parser().parse_args(args[3:])),
                TrainConfig.from_yaml(job["config"])):
        assert got == expected
        assert [type(getattr(got, f.name)) for f in fields(got)] == [
            type(getattr(expected, f.name)) for f in fields(expected)]
    # the file is the job's input: a bad value in it is refused by the job, naming the field
    Path(job["config"]).write_text(yaml.safe_dump({**written, "group_size": 1}))
    assert main(args[3:]) == 2
    assert "group_size" in capsys.readouterr().err
    assert not _jobs.store_path().exists()


def test_checkpoint_paths_are_not_launcher_settings():
    # --init-from reads a checkpoint file: a crafted request must not pick one
    for bad in (dict(init_from="runs/checkpoints/x"), dict(resume="x"),
                dict(checkpoint_dir="elsewhere")):
        with pytest.raises(_jobs.JobError, match="not launcher settings"):
            _jobs.allowed(TrainConfig(**bad))


def test_job_progress_lines_and_stopping_a_job_that_has_ended():
    log = "loading the model\nprogress 3/10\nsome warning\nprogress 7/10\n"
    assert _jobs.progress_of(log) == (7, 10)
    assert _jobs.progress_of("loading the model") is None
    with pytest.raises(_jobs.JobError, match="no branch job is running"):
        _jobs.kill(None, "core.branch", "branch")
    # a pid whose process is not the job's module (this test process): refused, not killed
    with pytest.raises(_jobs.JobError, match="no cross-evaluation job is running"):
        _jobs.kill({"pid": os.getpid()}, "core.evaluation", "cross-evaluation")
