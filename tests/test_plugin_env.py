"""A user's environment end to end: the example (examples/guess.py, written only against the
public protocol) trains through the real CLI with the tiny model, is recorded, and opens on every
page; installed plugins are found through their entry points; broken plugins are refused naming
them (exit 2); an exception inside ``step`` ends only that trajectory, recorded."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest
import streamlit as st
import streamlit.testing.v1.app_test as app_test
from streamlit.testing.v1 import AppTest

from core.config import ConfigError, TrainConfig, validate
from core.envs import plugins
from core.envs.base import make_env
from core.commands.train import checked_env
from examples.guess import Factory
from pages import _jobs
from storage import queries
from pages import _params
from tests.test_pages import PAGES, _NavigationPagesManager

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
SMALL = ["--model", "tiny", "--algo", "grpo", "--group-size", "2", "--tasks-per-step", "2",
         "--max-new-tokens", "8", "--seed", "0", "--threads", "1", "--quiet",
         "--lora-targets", "q_proj,v_proj"]


def _cli(args, pythonpath: Path | None = None, timeout: int = 300):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "core.train", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _q(db, sql):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# -- the example, without a model ------------------------------------------------------------------
def test_example_is_deterministic_split_and_its_expert_solves_every_task():
    env = Factory(high=16)
    train, again = env.tasks("train", 40, seed=3), Factory(high=16).tasks("train", 40, seed=3)
    assert [t.meta for t in train] == [t.meta for t in again]          # same (task, seed)
    held = env.tasks("heldout", 40, seed=3)
    assert {t.meta["secret"] % 2 for t in train} == {0}                # even
    assert {t.meta["secret"] % 2 for t in held} == {1}                 # odd: no shared task
    assert env.split_size("train") == 8
    assert len({t.prompt for t in train + held}) == 1                   # the secret is not told
    for task in train + held:
        ep = env.episode(task, seed=0)
        assert ep.reset() == f"{task.prompt} You have 10 guesses."
        for _ in range(math.ceil(math.log2(16)) + 1):
            result = ep.step(ep.expert_action())
            if result.done:
                break
        assert ep.outcome().success and ep.outcome().score == 1.0, task
        assert ep.outcome().process == 1.0
    ep = env.episode(train[0], seed=0)
    bad = ep.step("I think it is 5")
    assert not bad.valid and not bad.done and bad.state_key == "1..16"
    assert ep.outcome().score == 0.0 and ep.outcome().process == 0.0
    with pytest.raises(ValueError, match="high"):
        Factory(high=1)


# -- installed plugins: entry points ---------------------------------------------------------------
def _installed_package(base: Path, entry: str) -> Path:
    """A package as pip installs it: a .dist-info with entry_points.txt, on sys.path."""
    info = base / "guessplug-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: guessplug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{plugins.GROUP}]\n{entry}\n")
    return base


def test_an_installed_plugin_is_found_by_its_entry_point_name(tmp_path, monkeypatch):
    assert "guess-demo" not in plugins.installed()
    with pytest.raises(ConfigError, match="installed plugin"):
        validate(TrainConfig(env="guess-demo"))
    monkeypatch.syspath_prepend(str(_installed_package(
        tmp_path, "guess-demo = examples.guess:Factory\nbroken-demo = nosuch_pkg_h17.mod:Env")))
    assert plugins.installed()["guess-demo"] == "examples.guess:Factory"
    env = make_env("guess-demo", seed=0, topk=3, high=8)
    assert isinstance(env, Factory) and env.high == 8
    cfg = checked_env(validate(TrainConfig(env="guess-demo", env_options="high=8", sft_steps=2)))
    assert cfg.env == "guess-demo"
    with pytest.raises(plugins.PluginError, match=r"broken-demo \(nosuch_pkg_h17.mod:Env\)"):
        make_env("broken-demo")
    # the command line finds them the same way (only the package is on its path)
    proc = _cli(["--env", "broken-demo", "--db", str(tmp_path / "x.duckdb"), *SMALL],
                pythonpath=tmp_path, timeout=120)
    assert proc.returncode == 2 and "environment plugin broken-demo (nosuch_pkg_h17.mod:Env): " \
        "importing module 'nosuch_pkg_h17.mod' failed" in proc.stderr, proc.stderr


# -- broken plugins --------------------------------------------------------------------------------
BROKEN = {
    "bad_import": ("import nosuch_module_for_h17\n", "importing module 'bad_import' failed: "
                   "ModuleNotFoundError: No module named 'nosuch_module_for_h17'"),
    "bad_raise": ("raise RuntimeError('plugin setup exploded')\n",
                  "RuntimeError: plugin setup exploded (bad_raise.py, line 1)"),
    "bad_members": ("""
        class Env:
            name, system_prompt, stop_tags = 'x', '', ('</a>',)
            def __init__(self, **options):
                pass
            def tasks(self, split, n, seed):
                return []
        """, "Env has no episode"),
    "bad_episode": ("""
        from core.envs.base import Task
        class Episode:
            def reset(self):
                return 'hi'
            def outcome(self):
                return None
        class Env:
            name, system_prompt, stop_tags = 'x', '', ('</a>',)
            def __init__(self, **options):
                pass
            def tasks(self, split, n, seed):
                return [Task(task_id=str(i), prompt='p', split=split) for i in range(n)]
            def episode(self, task, seed):
                return Episode()
        """, "its episode Episode has no method step, expert_action"),
    "bad_options": ("from examples.guess import Factory as Env\n", "OptionError: high=1: must be an integer in 2..1000000"),
}


@pytest.mark.parametrize("module", sorted(BROKEN))
def test_a_broken_plugin_is_refused_naming_it_exit_2(tmp_path, module):
    code, message = BROKEN[module]
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(code))
    db = tmp_path / "store.duckdb"
    options = ["--env-options", "high=1"] if module == "bad_options" else []
    proc = _cli(["--env", f"{module}:Env", "--sft-steps", "1", "--steps", "1", "--db", str(db),
                 *options, *SMALL], pythonpath=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"environment plugin {module}:Env" in proc.stderr
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not db.exists()                                              # refused before any work


# -- through the CLI, recorded, on every page ------------------------------------------------------
RAISES_IN_STEP = """
from examples.guess import Factory, GuessEpisode

class FlakyEpisode(GuessEpisode):
    def __init__(self, env, task, seed):
        super().__init__(env, task)
        self.seed = seed

    def step(self, action_text):
        if self.seed % 2:  # one rollout of each group crashes: the other must go on
            raise RuntimeError("tool backend down")
        return super().step(action_text)

class Env(Factory):
    def episode(self, task, seed):
        return FlakyEpisode(self, task, seed)
"""


def test_an_exception_in_step_ends_only_that_trajectory(tmp_path):
    (tmp_path / "flaky_plugin.py").write_text(RAISES_IN_STEP)
    db = tmp_path / "store.duckdb"
    proc = _cli(["--env", "flaky_plugin:Env", "--env-options", "high=8", "--steps", "1",
                 "--sft-steps", "0", "--max-turns", "2", "--eval-every", "0", "--db", str(db),
                 *SMALL],
                pythonpath=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _q(db, "SELECT status FROM runs") == [("finished",)]
    rows = _q(db, """SELECT t.traj_id, t.finish_reason, t.num_turns, u.error FROM trajectories t
                     JOIN turns u USING (run_id, traj_id) WHERE u.turn = 0 AND t.split = 'train'
                     ORDER BY 1""")
    crashed = [r for r in rows if r[1] == "env_error"]
    assert len(crashed) == 2 and len(rows) == 4                         # one per group
    assert all(r[2] == 1 and r[3] == "RuntimeError: tool backend down" for r in crashed)
    others = [r for r in rows if r[1] != "env_error"]
    assert len(others) == 2 and all(r[2] == 2 and "backend" not in (r[3] or "") for r in others)


BAD_OUTCOMES = """
import math
from examples.guess import Factory, GuessEpisode
from core.envs.base import Outcome

class GradedBadly(GuessEpisode):
    def __init__(self, env, task, seed):
        super().__init__(env, task)
        self.seed = seed

    def outcome(self):
        if self.seed % 4 == 1:
            raise KeyError("grades")
        if self.seed % 4 == 3:
            return Outcome(score=math.nan, success=False)
        return super().outcome()

class Env(Factory):
    def episode(self, task, seed):
        return GradedBadly(self, task, seed)
"""


def test_an_outcome_that_raises_or_scores_nan_ends_only_that_trajectory(tmp_path):
    (tmp_path / "bad_grader.py").write_text(BAD_OUTCOMES)
    db = tmp_path / "store.duckdb"
    proc = _cli(["--env", "bad_grader:Env", "--env-options", "high=8", "--steps", "1",
                 "--max-turns", "1", "--eval-every", "0", "--db", str(db), *SMALL],
                pythonpath=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _q(db, "SELECT status FROM runs") == [("finished",)]
    rows = _q(db, """SELECT info->>'$.episode_seed', finish_reason, reward,
                            info->>'$.env_error.env', info->>'$.env_error.call',
                            info->>'$.env_error.error' FROM trajectories ORDER BY 1""")
    by_seed = {int(r[0]) % 4: r[1:] for r in rows}
    # step 1's episode seeds 1000003, 1000004, 1001012, 1001013 (core/rollout/engine.py)
    assert len(rows) == 4 and set(by_seed) == {0, 1, 3}
    assert by_seed[1] == ("env_error", 0.0, "guess", "outcome", "KeyError: 'grades'")
    assert by_seed[3] == ("env_error", 0.0, "guess", "outcome",
                          "outcome returned score=nan: not a finite real number")
    assert by_seed[0][0] != "env_error" and by_seed[0][2] is None


@pytest.fixture(scope="module")
def guess_store(tmp_path_factory):
    """The example trained through the real CLI: 1 SFT step, 1 RL step, evaluations."""
    base = tmp_path_factory.mktemp("guess")
    db = base / "store.duckdb"
    proc = _cli(["--env", "examples.guess:Factory", "--env-options", "high=8", "--steps", "1",
                 "--sft-steps", "1", "--sft-batch-size", "2", "--max-turns", "4",
                 "--eval-every", "1", "--eval-tasks", "2", "--db", str(db), "--name", "guess",
                 *SMALL])
    assert proc.returncode == 0, proc.stderr[-3000:]
    [(run_id,)] = _q(db, "SELECT run_id FROM runs")
    return base, str(db), run_id


def test_the_example_trains_and_is_recorded(guess_store):
    _, db, run_id = guess_store
    assert _q(db, "SELECT status, config->>'env' FROM runs") == [
        ("finished", "examples.guess:Factory")]
    splits = dict(_q(db, "SELECT split, count(*) FROM trajectories GROUP BY 1"))
    assert splits == {"sft": 2, "train": 4, "eval": 4}
    # the scripted expert's demonstrations solve their tasks, turn by turn with state keys
    assert _q(db, "SELECT bool_and(success) FROM trajectories WHERE split = 'sft'") == [(True,)]
    keys = _q(db, "SELECT state_key FROM turns WHERE traj_id = 's1-d0' ORDER BY turn")
    assert keys[0] == ("1..8",)
    assert _q(db, "SELECT count(DISTINCT name) FROM metrics WHERE name IN "
                  "('sft/loss', 'reward/mean', 'grad/norm', 'eval/success')") == [(4,)]


def test_the_example_run_opens_on_every_page(guess_store, monkeypatch, tmp_path):
    base, db, run_id = guess_store
    monkeypatch.setattr(app_test, "PagesManager", _NavigationPagesManager)
    monkeypatch.setenv(queries.STORE_DIRS_ENV, str(base))
    monkeypatch.setenv(_jobs.RUNS_DIR_ENV, str(tmp_path / "runs"))
    monkeypatch.chdir(ROOT)
    st.cache_data.clear()
    for page, title in PAGES.items():
        at = AppTest.from_file(APP, default_timeout=60).run()
        # a link carries the parameters its page reads (pages/_params.py refuses the others)
        wanted = {"store": db, "run": run_id, "step": "2", "traj": "s2-g0-r0"}
        at.query_params.update({k: v for k, v in wanted.items() if k in _params.COMMON
                                or k in _params.PAGES[page]})
        at = at.switch_page(f"pages/{page}.py").run()
        assert not at.exception, f"{page}: {at.exception}"
        assert at.title and at.title[0].value == title, page
        assert at.session_state["pick_run"] == (db, run_id), page
