"""Every page through Streamlit's AppTest: on the demo store (tests/app_fixtures.py) and on every
store committed under sample_runs/. No exception, the main elements present, deep links honoured,
hostile text shown as text, the SQL box unable to write, the launcher refusing bad input.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import streamlit as st
import streamlit.testing.v1.app_test as app_test
from streamlit.runtime.pages_manager import PagesManager
from streamlit.testing.v1 import AppTest

from pages import _credit, _jobs, _signals, _tokens
from storage import queries
from tests.app_fixtures import (LINT_TRAJ, RUN_NAMES, SCRIPT_TEXT, SCRIPT_TRAJ, SPIKE_STEP,
                                SPIKE_TRAJ, make_demo_store)

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
PAGES = {"runs": "Runs", "replay": "Replay", "groups": "Groups", "dynamics": "Dynamics",
         "failures": "Failures", "train": "Train"}


class _NavigationPagesManager(PagesManager):
    """AppTest forgets between runs that the app uses st.navigation (a served app remembers it
    after its first run), so with a pages/ folder it would run each page alone first and lose
    button clicks to pages._common.ensure_app's rerun. This restores the served app's state."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        PagesManager.uses_pages_directory = False


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """(store directory, store path, {run name: run_id}) of the demo store."""
    base = tmp_path_factory.mktemp("stores")
    path = base / "demo.duckdb"
    ids = make_demo_store(path)
    return base, str(path), dict(zip(RUN_NAMES, ids))


_CACHED_FOR: list[str] = []
"""The store directories Streamlit's data cache was filled on, for ``shared_cache`` tests."""


@pytest.fixture
def app(request, monkeypatch, tmp_path, demo):
    """A factory of AppTests on the demo store's directory (or another), at a page and URL.

    Streamlit's data cache starts empty, except for a test marked ``shared_cache``: that one
    keeps what the tests before it cached on the same store directories, as the sessions of an
    app served on them share one cache (a served app's store directories never change)."""
    monkeypatch.setattr(app_test, "PagesManager", _NavigationPagesManager)
    monkeypatch.setenv(queries.STORE_DIRS_ENV, str(demo[0]))
    monkeypatch.setenv(_jobs.RUNS_DIR_ENV, str(tmp_path / "runs"))
    monkeypatch.chdir(ROOT)
    shared = request.node.get_closest_marker("shared_cache") is not None
    if not shared:
        st.cache_data.clear()
        _CACHED_FOR.clear()

    def open_page(page: str, store_dir: str | None = None, first_run: bool = True,
                  **params) -> AppTest:
        """``page`` at ``params``: after a first run of the bare app (a session that was on the
        app before), or with ``first_run=False`` as the session's first request (a link opened
        in a new tab)."""
        if store_dir:
            monkeypatch.setenv(queries.STORE_DIRS_ENV, store_dir)
        if shared and _CACHED_FOR != [os.environ[queries.STORE_DIRS_ENV]]:
            st.cache_data.clear()      # it holds what other store directories showed
            _CACHED_FOR[:] = [os.environ[queries.STORE_DIRS_ENV]]
        at = AppTest.from_file(APP, default_timeout=60)
        if first_run:
            at.run()
            assert not at.exception, at.exception
        at.query_params.update({k: str(v) for k, v in params.items()})
        return at.switch_page(f"pages/{page}.py").run()
    return open_page


def texts(at: AppTest, kind: str) -> list[str]:
    return [e.value for e in getattr(at, kind)]


def shown_table(at: AppTest, *columns: str) -> pd.DataFrame:
    """The first dataframe shown with all of ``columns`` (read-only tables carry no key)."""
    for frame in at.dataframe:
        value = frame.value
        if set(columns) <= set(value.columns) | {value.index.name}:
            return value
    raise AssertionError(f"no table with columns {columns}")


# -- every page, every run -------------------------------------------------------------------------
GRID_SEED = re.compile(r"^\w+ credit \S+ seed [1-9]\d*$")
"""A credit grid's runs past seed 0 (sample_runs/credit_grid.sh): each has its seed-0 run's
config but the seed (tests/test_credit_grid.py and test_credit_corridor.py check it), so its
pages are the same code over the same shapes; 46 runs of ~2 s each are left to seed 0's."""


def _cases():
    cases = [("demo", None, name) for name in RUN_NAMES]
    for store in queries.discover_stores(("sample_runs",), root=ROOT):
        for run_id, name in queries.runs(store)[["run_id", "name"]].itertuples(index=False):
            if not GRID_SEED.match(str(name)):
                cases.append(("sample", store, run_id))
    return cases


RUN_FREE = ("train",)
"""Pages whose body reads no run (the sidebar's picker, which does, is Runs' and Failures' too):
drawn with the first run of each store, not again with every run."""
_DRAWN: set[tuple[str, str]] = set()


@pytest.mark.shared_cache
@pytest.mark.parametrize("kind,store,run", _cases())
def test_every_page_renders_every_run(app, demo, kind, store, run):
    """Each page's deep link to each run, opened as a session's first request (the bare app's
    own first run, the same for every run of a store directory, is the next test's). The cases
    share one data cache, as the sessions of a served app do: each store's run list and other
    reads not of the run are cached once, not once per run."""
    if kind == "demo":
        store, run = demo[1], demo[2][run]
        store_dir = None
    else:
        store_dir = str(Path(store).parent)
    for page, title in PAGES.items():
        if page in RUN_FREE and (store, page) in _DRAWN:
            continue
        _DRAWN.add((store, page))
        at = app(page, store_dir=store_dir, first_run=False, store=store, run=run)
        assert not at.exception, f"{page}: {at.exception}"
        assert at.title and at.title[0].value == title, page
        assert at.session_state["pick_run"] == (store, run), page


@pytest.mark.parametrize("kind", ["demo", "sample"])
def test_every_page_after_the_bare_app_on_each_store_directory(app, demo, kind):
    """The app opened without a link (its Runs page on the first run), then each page's link."""
    _, store, run = [c for c in _cases() if c[0] == kind][-1]
    if kind == "demo":
        store, run = demo[1], demo[2][run]
    store_dir = None if kind == "demo" else str(Path(store).parent)
    for page, title in PAGES.items():
        at = app(page, store_dir=store_dir, store=store, run=run)
        assert not at.exception, f"{page}: {at.exception}"
        assert at.title and at.title[0].value == title, page
        assert at.session_state["pick_run"] == (store, run), page


def test_every_page_renders_every_run_of_a_team_store(app, demo, tmp_path):
    """The demo store's runs copied into a team store (storage/lake.py): the app lists the
    directory beside the files and every page renders each run from it, as from the file."""
    from storage import team_store
    from storage.store_copy import copy
    lake_dir = tmp_path / "stores" / "team"
    team_store.init(lake_dir, "sqlite")
    runs, _ = copy(demo[1], lake_dir)
    assert str(lake_dir) in queries.discover_stores((str(lake_dir.parent),), root="/")
    for run in runs:
        for page, title in PAGES.items():
            at = app(page, store_dir=str(lake_dir.parent), first_run=False, store=str(lake_dir),
                     run=run)
            assert not at.exception, f"{page}: {at.exception}"
            assert at.title and at.title[0].value == title, page
            assert at.session_state["pick_run"] == (str(lake_dir), run), page


def test_a_link_cannot_open_a_store_outside_the_store_directories(app, demo, tmp_path):
    outside = tmp_path / "elsewhere" / "private.duckdb"
    outside.parent.mkdir()
    other_run = make_demo_store(outside)[0]
    at = app("replay", store=str(outside), run=other_run)
    assert not at.exception
    assert at.session_state["pick_run"][0] == demo[1]              # still a listed store
    assert any("not in any store" in t for t in texts(at, "warning"))


def test_a_live_run_can_be_followed(app, tmp_path):
    from storage.recorder import Recorder
    live = tmp_path / "live"
    rec = Recorder(live / "store.duckdb")
    run = rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo"}, name="live")
    rec.record_step(1, metrics={"reward/mean": 0.2, "grad/norm": 0.5})
    at = app("dynamics", store_dir=str(live), store=str(live / "store.duckdb"), run=run)
    assert not at.exception
    assert at.toggle(key="follow_live").value is True
    assert at.selectbox(key="pick_run").value == (str(live / "store.duckdb"), run)


def test_empty_store_directory_says_so(app, tmp_path):
    empty = tmp_path / "nothing"
    empty.mkdir()
    for page in PAGES:
        at = app(page, store_dir=str(empty))
        assert not at.exception
        if page != "train":
            assert any("No run" in t for t in texts(at, "info")), page


def run_list_rows(at: AppTest) -> dict[str, dict]:
    """The Runs page's run-list tables (HTML, pages/_runlist.py): run name -> {column: cell
    text, "sparklines": images in the row, "spark": the reward sparkline's points}."""
    import base64
    import html as html_lib
    import re
    rows = {}
    for block in at.html:
        if 'class="run-list"' not in block.value:
            continue
        heads = re.findall(r"<th\b[^>]*>(.*?)</th>", block.value)  # not <thead>
        for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", block.value)[1:]:
            cells = re.findall(r"<td[^>]*>(.*?)</td>", tr)
            text = [html_lib.unescape(re.sub(r"<[^>]+>", " ", c)).split() for c in cells]
            row = {h: " ".join(t) for h, t in zip(heads, text)}
            sparks = re.findall(r'base64,([A-Za-z0-9+/=]+)', cells[heads.index("reward/mean")])
            row["sparklines"] = tr.count("<img")
            row["spark"] = (base64.b64decode(sparks[0]).decode().split('points="')[1]
                            .split('"')[0].split() if sparks else [])
            name = re.search(r"<a [^>]*>(.*?)</a>", cells[0]).group(1)
            rows[html_lib.unescape(name)] = row
    return rows


def test_runs_page_lists_statuses_and_sparklines(app, demo):
    at = app("runs")
    rows = run_list_rows(at)
    assert rows["crashed-run"]["status"] == "interrupted"      # 'running', silent for an hour
    assert rows["demo-search-starpo"]["status"] == "finished"
    assert len(rows["demo-search-starpo"]["spark"]) == 10       # one point per RL step


def test_runs_page_diffs_configs(app, demo):
    at = app("runs")
    options = at.multiselect(key="runs_compare").options      # "name (run_id)", in order
    search, apps = [i for i, label in enumerate(options)
                    if label.split(" (")[0] in ("demo-search-starpo", "demo-apps-rloo")]
    at.multiselect(key="runs_compare").set_value([search, apps]).run()
    diff = at.dataframe[-1].value
    assert {"env", "algo"} <= set(diff.index)
    assert "model" not in diff.index                    # both tiny: not a difference


# -- replay ----------------------------------------------------------------------------------------
def test_replay_deep_link_opens_trajectory_and_turn(app, demo):
    run = demo[2]["demo-search-starpo"]
    at = app("replay", store=demo[1], run=run, step=4, traj=SCRIPT_TRAJ, turn=1)
    assert at.selectbox(key="traj").value == SCRIPT_TRAJ
    assert at.slider(key="turn").value == 1
    assert any(t.startswith("Turn 1 of 2 ") for t in texts(at, "caption"))  # as the slider
    assert "<answer>Marrenport</answer>" in texts(at, "code")


def test_replay_renders_hostile_text_as_text(app, demo):
    run = demo[2]["demo-search-starpo"]
    at = app("replay", store=demo[1], run=run, step=4, traj=SCRIPT_TRAJ, turn=0)
    codes = texts(at, "code")
    assert any(SCRIPT_TEXT in c for c in codes)                  # shown, as code text
    assert any("<img src=x onerror=alert(2)>" in c for c in codes)
    html = at.get("html")[0].proto.body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script" not in html and "<img" not in html and "<b>" not in html
    assert not any(SCRIPT_TEXT in m.value for m in at.markdown)  # never through markdown


def test_replay_buttons_step_through_turns(app, demo):
    run = demo[2]["demo-search-starpo"]
    at = app("replay", store=demo[1], run=run, step=4, traj=SCRIPT_TRAJ, turn=0)
    at.button(key="replay_next").click().run()
    assert at.slider(key="turn").value == 1
    at.button(key="replay_next").click().run()           # clamped at the last turn
    assert at.slider(key="turn").value == 1
    at.button(key="replay_prev").click().run()
    assert at.slider(key="turn").value == 0


def test_replay_colour_modes_and_mask_lint(app, demo):
    run = demo[2]["demo-search-starpo"]
    at = app("replay", store=demo[1], run=run, step=5, traj=LINT_TRAJ)
    lint = shown_table(at, "issue")
    assert "observation/prompt token trained" in set(lint["issue"])
    for mode in _tokens.MODES:
        at.selectbox(key="replay_colour").set_value(mode).run()
        assert not at.exception
        assert 'title="pos 0 | prompt' in at.get("html")[0].proto.body


def test_replay_imported_run_has_no_tokens_message(app, demo):
    at = app("replay", store=demo[1], run=demo[2]["imported-verl"])
    assert any("No token records" in t for t in texts(at, "info"))


def test_replay_apps_trajectory_shows_state_diff_error_and_tests(app, demo):
    at = app("replay", store=demo[1], run=demo[2]["demo-apps-rloo"], step=0, traj="a0-r0", turn=1)
    assert at.json and "contacts" in at.json[0].value
    tests = shown_table(at, "name", "passed")
    assert set(tests["name"]) == {"phone_updated", "no_collateral_damage"}
    at = app("replay", store=demo[1], run=demo[2]["demo-apps-rloo"], step=0, traj="a0-r0", turn=0)
    assert any("error" in t for t in texts(at, "error"))
    assert "KeyError: 'phone'" in texts(at, "code")


# -- groups ----------------------------------------------------------------------------------------
def test_groups_deep_link_estimators_and_flags(app, demo):
    run = demo[2]["demo-search-starpo"]
    at = app("groups", store=demo[1], run=run, step=4, group="s04-g0")
    assert at.selectbox(key="group").value == "s04-g0"
    assert any("StarPO-S" in t for t in texts(at, "info"))            # the filtered group
    credit = shown_table(at, "GRPO")
    assert credit["GRPO"].round(4).tolist() == credit["stored advantage"].round(4).tolist()
    assert "Rollouts first diverge at turn 0" in texts(at, "caption")
    at = app("groups", store=demo[1], run=run, step=11, group="s11-g0")  # collapsed: all solved
    assert any("Zero reward variance" in t for t in texts(at, "warning"))


# -- dynamics --------------------------------------------------------------------------------------
def test_dynamics_spike_lists_its_trajectories(app, demo):
    run = demo[2]["demo-search-starpo"]
    at = app("dynamics", store=demo[1], run=run)
    assert at.selectbox(key="spike").value == SPIKE_STEP          # the spike is offered first
    ranked = shown_table(at, "grad_norm", "traj_id")
    assert ranked["traj_id"].iloc[0] == SPIKE_TRAJ
    link = at.get("page_link")[0].proto
    assert SPIKE_TRAJ in link.query_string and f"step={SPIKE_STEP}" in link.query_string
    assert any("Collapse alarm at step 10" in t for t in texts(at, "warning"))


def test_dynamics_with_a_flickering_alarm_over_many_steps_stays_readable(app, tmp_path):
    """A repeat share that crosses its level every step starts an alarm every other step: the
    page lists five and folds the rest, and draws them as one trace (one shape per alarm took
    minutes on a 3,000-step run)."""
    import json

    from storage import db
    from storage.recorder import Recorder, insert_frame

    path = tmp_path / "stores" / "long.duckdb"
    path.parent.mkdir()
    rec = Recorder(path)
    run = rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo"}, name="long")
    steps = range(1, 601)
    frame = pd.DataFrame([{"step": s, "name": n, "value": v} for s in steps for n, v in (
        ("reward/mean", 0.5), ("collapse/repeat_frac", 0.6 if s % 2 else 0.4))])
    with db.writing(path) as con:
        insert_frame(con, "metrics", frame, run, None)
        con.execute("UPDATE runs SET last_step = 600 WHERE run_id = ?", [run])
    rec.finish()
    at = app("dynamics", store_dir=str(path.parent), store=str(path), run=run)
    assert not at.exception
    shown = [t for t in texts(at, "warning") if t.startswith("Collapse alarm")]
    assert len(shown) == 5
    assert any("295 more collapse alarms" in e.label for e in at.expander)
    specs = [json.loads(e.proto.spec) for e in at.get("plotly_chart")]
    repeat = next(f for f in specs if "Repeated" in json.dumps(f["layout"].get("title", "")))
    assert [t["name"] for t in repeat["data"]].count("repeats alarm") == 1       # one, by kind
    assert not repeat["layout"].get("shapes")


def test_dynamics_without_gradients_says_so(app, demo):
    at = app("dynamics", store=demo[1], run=demo[2]["imported-verl"])
    assert any("No gradient norms" in t for t in texts(at, "info"))


# -- failures --------------------------------------------------------------------------------------
def test_failures_search_finds_hostile_trajectory_and_shows_it_as_text(app, demo):
    run = demo[2]["demo-search-starpo"]
    at = app("failures", store=demo[1], run=run)
    at.multiselect(key="fail_classes").set_value([]).run()          # every class
    at.text_input(key="fail_search").input("<script>").run()
    found = shown_table(at, "failure_class", "traj_id")
    assert found["traj_id"].tolist() == [SCRIPT_TRAJ]
    at.session_state["fail_results"] = {"selection": {"rows": [0], "columns": []}}
    at.run()
    assert any(SCRIPT_TEXT in c for c in texts(at, "code"))
    assert not any(SCRIPT_TEXT in m.value for m in at.markdown)


def test_failures_tag_is_saved(app, demo):
    run = demo[2]["demo-apps-rloo"]
    at = app("failures", store=demo[1], run=run)
    at.session_state["fail_results"] = {"selection": {"rows": [0], "columns": []}}
    at.run()
    traj = shown_table(at, "failure_class", "traj_id")["traj_id"].iloc[0]
    at.text_input(key="fail_tag").input("deleted-contact")
    at.text_area(key="fail_note").input("removed Ada instead of updating")
    at.button(key="fail_tag_save").click().run()
    assert not at.exception
    saved = queries.tags(demo[1], run, [traj])
    assert saved["tag"].tolist() == ["deleted-contact"]


def test_failures_tag_is_not_saved_on_a_run_switched_to_after_drawing(app, demo):
    """The form is drawn for one trajectory; if the page shows another run when the submit
    arrives (two runs once shared a picker label), the tag goes nowhere rather than there."""
    drawn, other = demo[2]["demo-apps-rloo"], demo[2]["demo-search-starpo"]
    at = app("failures", store=demo[1], run=drawn)
    at.session_state["fail_results"] = {"selection": {"rows": [0], "columns": []}}
    at.run()
    at.text_input(key="fail_tag").input("meant-for-apps")
    at.session_state["pick_run"] = (demo[1], other)
    at.button(key="fail_tag_save").click().run()
    assert not at.exception
    assert any(e.value.startswith("Not saved") for e in at.error)
    for run in (drawn, other):
        assert "meant-for-apps" not in queries.tags(demo[1], run)["tag"].tolist()


def _fingerprint(path: str) -> tuple:
    counts = {t: len(queries._read(path, f"SELECT * FROM {t}")) for t in
              ("runs", "metrics", "trajectories", "turns", "tokens", "tags")}
    return counts, hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.parametrize("sql", [
    "DELETE FROM trajectories", "DROP TABLE turns", "UPDATE runs SET status = 'x'",
    "INSERT INTO tags VALUES ('a', 'b', 'c', 'd', now())", "SELECT 1; DELETE FROM runs",
    "COPY trajectories TO 'stolen.csv'", "ATTACH 'other.duckdb' AS o",
    "CREATE TABLE evil AS SELECT 1"])
def test_sql_box_refuses_writes_and_leaves_the_store_unchanged(app, demo, sql):
    run = demo[2]["demo-search-starpo"]
    before = _fingerprint(demo[1])
    at = app("failures", store=demo[1], run=run, tab="sql")
    at.text_area(key="fail_sql").input(sql)
    at.button(key="fail_sql_run").click().run()
    assert not at.exception
    assert "Query refused:" in texts(at, "error")
    assert _fingerprint(demo[1]) == before
    assert not (ROOT / "stolen.csv").exists()


def test_sql_box_runs_a_select(app, demo):
    run = demo[2]["demo-search-starpo"]
    at = app("failures", store=demo[1], run=run, tab="sql")
    at.button(key="fail_sql_run").click().run()                 # the default query
    result = shown_table(at, "n")
    assert int(result["n"].sum()) == 80                         # 10 steps x 8 rollouts


@pytest.mark.parametrize("sql, heading", [
    ("SELEC failure_class FROM trajectories", "Syntax error in the query:"),
    ("SELECT no_such_column FROM trajectories", "The query failed:")])
def test_sql_box_tells_a_typo_from_a_refusal(app, demo, sql, heading):
    at = app("failures", store=demo[1], run=demo[2]["demo-search-starpo"], tab="sql")
    at.text_area(key="fail_sql").input(sql)
    at.button(key="fail_sql_run").click().run()
    assert not at.exception
    errors = texts(at, "error")
    assert heading in errors and "Query refused:" not in errors


def test_failures_follows_a_task(app, demo):
    at = app("failures", store=demo[1], run=demo[2]["demo-apps-rloo"], tab="task")
    history = shown_table(at, "rollouts")
    assert history["step"].tolist() == [0, 1, 2]
    assert any(t.startswith("First solved at step") or t.startswith("Never solved")
               for t in texts(at, "caption"))


def test_failures_draws_only_the_open_tab(app, demo):
    """The clusters' tab is open by default and the task history and SQL box are not drawn
    until their tab is (each costs browser time on every load); tab=... in a link opens one."""
    run = demo[2]["demo-apps-rloo"]
    at = app("failures", store=demo[1], run=run)
    assert any(s.value == "Clusters of similar failures" for s in at.subheader)
    assert not [t for t in at.text_area if t.key == "fail_sql"]
    assert not [f for f in at.dataframe if "rollouts" in f.value.columns]
    at = app("failures", store=demo[1], run=run, tab="sql")
    assert [t for t in at.text_area if t.key == "fail_sql"]
    assert not any(s.value == "Clusters of similar failures" for s in at.subheader)


# -- train -----------------------------------------------------------------------------------------
def test_train_form_refuses_invalid_values(app):
    at = app("train")
    assert at.selectbox(key="train_preset").value == "workshop-demo"
    at.number_input(key="train_group_size").set_value(1)
    at.button(key="train_launch").click().run()
    assert "Not launched:" in texts(at, "error")
    assert any("group_size" in c for c in texts(at, "code"))
    at.text_input(key="train_name").input("../../etc/x")
    at.number_input(key="train_group_size").set_value(4)
    at.button(key="train_launch").click().run()
    assert any("run name" in c for c in texts(at, "code"))
    assert not _jobs.job_file().exists()


def test_train_refuses_a_second_job(app, tmp_path):
    # A stand-in for a running trainer: a process whose command line names core.train.
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "core.train"])
    try:
        _jobs.job_file().parent.mkdir(parents=True, exist_ok=True)
        _jobs.job_file().write_text(
            f'{{"pid": {stand_in.pid}, "name": "busy", "db": "x", "log": "{tmp_path / "x.log"}"}}')
        at = app("train")
        assert any("running" in m.value for m in at.markdown)
        at.button(key="train_launch").click().run()
        assert any("already running" in c for c in texts(at, "code"))
    finally:
        stand_in.kill()
        stand_in.wait()


def test_launch_command_is_an_argument_list_into_the_store(tmp_path):
    config = tmp_path / "demo-1.yaml"
    assert _jobs.command(config, "demo-1") == [
        sys.executable, "-m", "core.train", "--config", str(config),
        "--db", str(_jobs.store_path()), "--name", "demo-1"]
    for bad in ("", "a b", "x;rm -rf", "../x", "-flag", "a" * 65):
        with pytest.raises(_jobs.JobError):
            _jobs.command(config, bad)


def test_job_file_and_log_tail(app, tmp_path):
    assert _jobs.current() is None                                  # never started
    _jobs.job_file().parent.mkdir(parents=True, exist_ok=True)
    _jobs.job_file().write_text("{not json")
    assert _jobs.current() is None                                  # unreadable: no job
    log = tmp_path / "job.log"
    log.write_text(f"loading\n 10%|#  | 1/10\r 20%|## | 2/10\n{_jobs.ROOT}/core/x.py: warning\n")
    tail = _jobs.log_tail({"log": str(log)})
    assert tail.splitlines() == ["loading", " 20%|## | 2/10", "core/x.py: warning"]
    with pytest.raises(_jobs.JobError):
        _jobs.stop({"pid": 2 ** 22 + 12345})                         # no such process


# -- the pure helpers behind the pages -------------------------------------------------------------
def test_estimator_mirrors_match_core_advantages():
    torch = pytest.importorskip("torch")
    from core.credit import advantages
    for rewards in ([1.0, 0.0, 0.5, 0.0], [0.3, 0.3, 0.3], [2.0, -1.0], [0.9, -0.05, -0.15, -0.05]):
        t = torch.tensor(rewards, dtype=torch.float64)
        for mine, theirs in ((_credit.grpo, advantages.grpo), (_credit.dr_grpo, advantages.dr_grpo),
                             (_credit.rloo, advantages.rloo)):
            assert mine(rewards) == pytest.approx(theirs(t, [0] * len(rewards)).tolist(), abs=1e-9)


def test_gigpo_steps_hand_computed():
    trajs = pd.DataFrame({"traj_id": ["x", "y", "z"], "reward": [1.0, 0.0, 1.0],
                          "prompt": ["P"] * 3})
    turns = pd.DataFrame({"traj_id": ["x", "x", "y", "y", "z"], "turn": [0, 1, 0, 1, 0],
                          "observation": ["o1", "", "o2", "", ""], "action": ["a"] * 5,
                          "step_reward": [0.0] * 5})
    out = _credit.gigpo_steps(trajs, turns, gamma=0.5).set_index(["traj_id", "turn"])
    # Turn 0 of all three acts from the prompt: returns 0.5 (1 discounted once), 0, 1.
    returns = [0.5, 0.0, 1.0]
    mean, std = sum(returns) / 3, pd.Series(returns).std()
    assert out.loc[("x", 0), "A_step"] == pytest.approx((0.5 - mean) / (std + 1e-6))
    assert out.loc[("x", 1), "A_step"] == 0.0                       # a singleton anchor
    assert out.loc[("y", 0), "A_turn"] == pytest.approx(
        _credit.grpo([1.0, 0.0, 1.0])[1] + (0.0 - mean) / (std + 1e-6))
    assert _credit.divergence_turn(turns, ["x", "y"]) is None       # same actions throughout
    assert _credit.divergence_turn(turns, ["x", "z"]) == 1          # z ended after turn 0


def test_spike_detection_flags_only_the_outlier():
    norms = pd.Series([0.5, 0.52, 0.48, 0.51, 0.49, 6.0, 0.5, 0.53, 0.47], index=range(2, 11))
    sp = _signals.spike_threshold(norms)
    assert sp.index[sp["spike"]].tolist() == [7]
    flat = pd.Series([1.0] * 6 + [1.04], index=range(7))
    assert not _signals.spike_threshold(flat)["spike"].any()       # MAD floor: no false alarm


def test_collapse_alarm_where_std_and_entropy_fall_together():
    wide = pd.DataFrame({"reward/group_std_mean": [0.5, 0.6, 0.5, 0.2, 0.1],
                         "policy/entropy": [1.2, 1.2, 1.1, 0.5, 0.4],
                         "collapse/repeat_frac": [0.0, 0.1, 0.2, 0.6, 0.7]}, index=range(5))
    alarms = _signals.collapse_alarms(wide)
    assert [(a["step"], a["kind"]) for a in alarms] == [(3, "std+entropy"), (3, "repeats")]


def test_token_html_escapes_text_and_titles():
    tokens = pd.DataFrame({"pos": [0, 1], "text": ['<script>alert(1)</script>', '" onmouseover="x'],
                           "role": ["action", "observation"], "trained": [True, True],
                           "logprob": [-0.5, None], "turn": [0, 0], "token_id": [1, 2]})
    out = _tokens.token_html(tokens, "loss mask")
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert 'onmouseover="x' not in out
    assert "rgba(220,40,40,0.55)" in out                         # the trained observation token


def test_mask_lint_expects_untrained_actions_in_evaluations_and_filtered_rollouts():
    tokens = pd.DataFrame({"pos": [0, 1, 2, 3], "turn": [-1, 0, 0, 0],
                           "role": ["prompt", "action", "action", "observation"],
                           "trained": [False, False, False, False], "text": list("abcd")})
    turns = pd.DataFrame()
    assert set(_tokens.mask_lint(tokens, turns)["issue"]) == {"action token not trained"}
    assert _tokens.mask_lint(tokens, turns, updated=False).empty      # evaluations train nothing
    assert "rgba(220,40,40" not in _tokens.token_html(tokens, "loss mask", updated=False)
    assert "rgba(220,40,40" in _tokens.token_html(tokens, "loss mask")
    trained = tokens.assign(trained=[False, True, False, False])
    assert set(_tokens.mask_lint(trained, turns, updated=False)["issue"]) == {
        "token trained in a trajectory no update used"}
