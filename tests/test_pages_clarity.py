"""Runs newest first in a folding section per store, the newest worth opening picked (not a
cross-evaluation), the Groups grid a row per rollout (escaped), and the
Train page's job panel (eval/success with losses on their own axis, links to the run), through
Streamlit's AppTest; tests/test_browser_clarity.py checks the same in a real browser window.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse

import pandas as pd
import pytest

from pages import _common as c
from pages import _grid, _jobs, _runlist
from storage.recorder import Recorder
from tests.app_fixtures import SCRIPT_TEXT, SCRIPT_TRAJ
from tests.test_pages import app, demo, texts  # noqa: F401  (fixtures)


def _record(path, name: str, metrics: dict[int, dict] | None = None) -> str:
    rec = Recorder(path)
    run_id = rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo"}, name=name)
    for step, values in (metrics or {0: {"reward/mean": 0.5}}).items():
        rec.record_step(step, metrics=values)
    rec.finish("finished")
    return run_id


# -- runs ------------------------------------------------------------------------------------------
def test_runs_are_newest_first_across_stores_and_the_newest_is_picked(app, tmp_path):
    # 'a.duckdb' sorts first but holds the older run: the store order must not decide
    older = _record(tmp_path / "a.duckdb", "older")
    newer = _record(tmp_path / "b.duckdb", "newer")
    at = app("runs", store_dir=str(tmp_path))
    assert not at.exception
    assert at.session_state["pick_run"] == (str(tmp_path / "b.duckdb"), newer)
    # one folding section per store, the newest run's store first
    labels = [e.label for e in at.expander]
    assert [label.split(" · ")[0] for label in labels] == [
        c.safe_label(str(tmp_path / name), 80) for name in ("b.duckdb", "a.duckdb")], labels
    assert older != newer


def test_a_newer_cross_evaluation_is_not_the_default_pick(app, tmp_path):
    """The default pick is a run worth opening: a cross-evaluation (one evaluation of another
    run's checkpoint, no reward curve) recorded after it is passed over."""
    trained = _record(tmp_path / "a.duckdb", "trained")
    rec = Recorder(tmp_path / "a.duckdb")
    rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo",
                   "cross_eval": {"checkpoint_run": trained}}, name="trained@5 on other@5's tasks")
    rec.record_step(5, metrics={"eval/success": 0.5})
    rec.finish("finished")
    at = app("runs", store_dir=str(tmp_path))
    assert not at.exception
    assert at.session_state["pick_run"] == (str(tmp_path / "a.duckdb"), trained)


def test_run_list_tables_put_the_key_columns_first_and_escape_names():
    frame = pd.DataFrame([{"run": "<b>x</b> ![](http://h/i.png)", "status": "finished",
                           "env": "search", "algo": "grpo", "model": "tiny",
                           "reward/mean": [0.1, 0.3, 0.2], "last reward/mean": 0.2,
                           "success/rate": [0.0], "last success/rate": 0.0, "last step": 3,
                           "created": pd.Timestamp("2026-01-02 03:04"), "store": "s.duckdb",
                           "run_id": "r1", "experiment": "x"}])
    page = _runlist.table_html(frame, picked=("s.duckdb", "r1"))
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", page)
    assert heads[:7] == ["run", "status", "env", "algo", "model", "reward/mean",
                         "success/rate"], heads
    assert "<b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page and "<img alt" in page
    assert page.count("<img") == 1                      # one sparkline: success has one point
    assert 'href="dynamics?store=s.duckdb&amp;run=r1"' in page
    assert "shown in the sidebar" in page


def test_experiments_group_a_stores_runs_with_cross_evaluations_last():
    assert _runlist.experiment_of("credit grpo seed 0", "r", {}) == "credit"
    assert _runlist.experiment_of("search-smollm2: 60 SFT steps", "r", {}) == "search"
    assert _runlist.experiment_of("credit grpo@64 on x", "xeval-1", {}) == "cross-evaluations"
    assert _runlist.experiment_of(None, "run-7", {}) == "run"
    frame = pd.DataFrame({"store": ["s", "s", "s", "t"], "run_id": ["1", "2", "3", "4"],
                          "experiment": ["cross-evaluations", "credit", "credit", "x"]})
    groups = _runlist.groups(frame)
    assert [store for store, _ in groups] == ["s", "t"]
    assert [e for e, _ in groups[0][1]] == ["credit", "cross-evaluations"]


# -- groups ----------------------------------------------------------------------------------------
def test_turn_grid_is_a_row_per_rollout_and_escaped():
    turns = pd.DataFrame({"traj_id": ["r0", "r0", "r1"], "turn": [0, 1, 0],
                          "action": ["<b>go</b>", "x" * 500, "![](http://h/i.png)"]})
    grid = _grid.turn_grid(turns, ["r1", "r0", "r2"])
    assert grid.index.tolist() == ["r1", "r0", "r2"]              # the order given, all of them
    assert grid.columns.tolist() == ["turn 0", "turn 1"]
    assert grid.at["r1", "turn 1"] == "" and grid.at["r2", "turn 0"] == ""
    assert grid.at["r0", "turn 1"] == "x" * _grid.CELL_CHARS + " ..."
    page = _grid.grid_html(grid, mark="turn 0")
    assert "<b>" not in page and "&lt;b&gt;go&lt;/b&gt;" in page
    assert "<img" not in page and "![](http://h/i.png)" in page  # html, not markdown: inert
    assert page.count("rgba(255,190,0,0.3)") == 1 + 3             # the marked header and cells


def test_turn_grid_hides_chat_template_markers():
    turns = pd.DataFrame({"traj_id": ["r0"], "turn": [0],
                          "observation": ["<|im_end|>\n<|im_start|>user\nDoc 3: Paris<|im_end|>"]})
    grid = _grid.turn_grid(turns, ["r0"], field="observation")
    assert grid.at["r0", "turn 0"] == "Doc 3: Paris"


def test_groups_page_shows_every_rollout_as_a_row(app, demo):
    run = demo[2]["demo-search-starpo"]
    group = SCRIPT_TRAJ.rsplit("-", 1)[0]
    at = app("groups", store=demo[1], run=run, step=4, group=group)
    assert not at.exception
    html = [e.proto.body for e in at.get("html") if "turn-grid" in e.proto.body]
    assert len(html) == 1
    for k in range(4):
        assert f">{group}-r{k}</th>" in html[0]
    assert "&lt;script&gt;" in html[0] and SCRIPT_TEXT not in html[0]
    assert not [f for f in at.dataframe if group + "-r0" in map(str, f.value.columns)]


# -- train -----------------------------------------------------------------------------------------
@pytest.fixture
def ended_job(app):
    """A job that ended, as the launcher leaves it: job.json naming a process that has exited
    and a store holding the job's run (SFT loss, held-out success, RL loss and success)."""
    runs = _jobs.runs_dir()
    (runs / "logs").mkdir(parents=True)
    metrics = {0: {"sft/loss": 10.5}, 1: {"sft/loss": 6.0, "eval/success": 0.25},
               2: {"policy/pg_loss": 0.1, "success/rate": 0.5, "reward/mean": 0.4},
               3: {"policy/pg_loss": 0.05, "success/rate": 0.6, "eval/success": 0.5}}
    run_id = _record(_jobs.store_path(), "clarity-job", metrics)
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    log = runs / "logs" / "clarity-job.log"
    log.write_text("step 1: eval/success 0.250\n")
    _jobs.job_file().write_text(json.dumps({
        "pid": ended.pid, "name": "clarity-job",
        "db": str(_jobs.store_path()), "log": str(log), "total_steps": 3}))
    return run_id


def test_train_plots_eval_success_with_losses_on_their_own_axis(app, ended_job):
    at = app("train")
    assert not at.exception
    charts = at.get("plotly_chart")
    assert charts, "no live chart"
    data = json.loads(charts[0].proto.spec)["data"]
    axis = {t["name"]: t.get("yaxis", "y") for t in data}
    assert axis["eval/success"] == "y"
    assert axis["sft/loss"] == axis["policy/pg_loss"] == "y2"
    assert axis["success/rate"] == "y"


def test_train_links_the_ended_job_to_its_run(app, ended_job, monkeypatch):
    store = str(_jobs.store_path())
    monkeypatch.setenv("AGENTRL_STORE_DIRS", str(_jobs.runs_dir()))
    at = app("train")
    assert not at.exception
    assert any("ended" in m.value for m in at.markdown)
    links = {e.proto.page.rsplit("/", 1)[-1]: urllib.parse.parse_qs(e.proto.query_string)
             for e in at.get("page_link")}
    for page in ("dynamics", "replay"):
        assert links.get(page) == {"store": [store], "run": [ended_job]}, links
    # and the link opens the run there
    at = app("dynamics", store=store, run=ended_job)
    assert at.session_state["pick_run"] == (store, ended_job)
    assert not any("not in any store" in t for t in texts(at, "warning"))
