"""Hostile text on the pages not covered elsewhere (a run named with HTML; Runs, Groups and
Dynamics), the launcher's argument list, refused bad stores, and the loopback-only server."""
import json
import socket
import subprocess
import sys
import time
import tomllib

import pytest
import streamlit.testing.v1.app_test as app_test
from streamlit.testing.v1 import AppTest

from core.config import PRESETS, TrainConfig
from core.commands.train import main as train_main
from pages import _jobs
from storage import db, queries
from storage.migrations import SCHEMA_VERSION
from tests.app_fixtures import RUN_NAMES, make_demo_store
from tests.test_pages import _NavigationPagesManager

from .helpers import ROOT

HOSTILE = '<script>alert(1)</script><img src=x onerror=alert(2)>[x](javascript:alert(3))'
MARKS = ("<script", "<img", "javascript:")
MARKDOWN_KINDS = ("markdown", "caption", "title", "header", "subheader", "info", "warning",
                  "error", "success", "exception")


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    path = base / "store.duckdb"
    ids = dict(zip(RUN_NAMES, make_demo_store(path)))
    run = ids["demo-search-starpo"]
    with db.writing(path) as con:
        con.execute("UPDATE runs SET name = ?, config = json_merge_patch(config, ?) "
                    "WHERE run_id = ?", [HOSTILE, json.dumps({"env": HOSTILE, "note": HOSTILE}), run])
        con.execute("UPDATE trajectories SET task_id = ? WHERE run_id = ?", [HOSTILE, run])
        con.execute("INSERT INTO metrics VALUES (?, 1, ?, 1.0)", [run, HOSTILE])
    return base, str(path), run


@pytest.mark.parametrize("page", ["runs", "groups", "dynamics", "replay", "failures"])
def test_a_hostile_run_name_config_and_ids_render_as_text(monkeypatch, hostile_store, page):
    base, store, run = hostile_store
    monkeypatch.setattr(app_test, "PagesManager", _NavigationPagesManager)
    monkeypatch.setenv(queries.STORE_DIRS_ENV, str(base))
    monkeypatch.chdir(ROOT)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    at.query_params.update({"store": store, "run": run, "step": "4"})
    at = at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, at.exception
    for kind in MARKDOWN_KINDS:
        for element in getattr(at, kind):
            assert not any(m in str(element.value) for m in MARKS), (kind, element.value)
    for link in at.get("page_link"):
        assert not any(m in link.proto.label for m in MARKS)
    for chart in at.get("plotly_chart"):
        assert "<script" not in chart.proto.spec and "<img" not in chart.proto.spec


def test_the_launcher_passes_a_list_and_refuses_paths_out_of_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv(_jobs.RUNS_DIR_ENV, str(tmp_path / "runs"))
    cfg = TrainConfig.from_dict({**PRESETS["workshop-demo"],
                                 "lora_targets": "q_proj; touch PWNED $(id)"})
    written = _jobs.write_config(cfg, tmp_path / "demo.yaml")
    args = _jobs.command(written, "demo")
    assert args[:3] == [sys.executable, "-m", "core.train"]    # no shell: one argv element each
    assert args[3:5] == ["--config", str(written)]                # values travel in a file
    assert TrainConfig.from_yaml(written).lora_targets == "q_proj; touch PWNED $(id)"
    assert args[args.index("--db") + 1] == str(_jobs.store_path())
    for bad in ({"checkpoint_dir": "/tmp/elsewhere"}, {"model": str(ROOT)}, {"resume": "x"}):
        with pytest.raises(_jobs.JobError):
            _jobs.allowed(TrainConfig.from_dict({**PRESETS["workshop-demo"], **bad}))
    for name in ("../../etc/passwd", "/abs", "a/b", "--db=x", ".hidden", "a\x00b"):
        with pytest.raises(_jobs.JobError):
            _jobs.command(written, name)
        with pytest.raises(_jobs.JobError):
            _jobs.launch(cfg, name)                               # before any file is written
    assert not (tmp_path / "runs").exists()


def test_the_trainer_refuses_a_newer_store_and_leaves_it_untouched(tmp_path, capsys):
    path = tmp_path / "newer.duckdb"
    with db.writing(path) as con:
        con.execute("CREATE TABLE _migrations (version INTEGER, name VARCHAR, applied_at TIMESTAMP)")
        con.execute("INSERT INTO _migrations VALUES (?, 'future', now())", [SCHEMA_VERSION + 1])
    before = path.read_bytes()
    code = train_main(["--env", "bandit", "--model", "tiny", "--steps", "1", "--db", str(path),
                       "--quiet"])
    assert code == 2
    assert "newer than this code knows" in capsys.readouterr().err
    assert path.read_bytes() == before
    garbage = tmp_path / "garbage.duckdb"
    garbage.write_bytes(b"not a database" * 100)
    assert train_main(["--env", "bandit", "--db", str(garbage), "--quiet"]) == 2
    assert "cannot open" in capsys.readouterr().err
    assert garbage.read_bytes() == b"not a database" * 100


def test_the_server_binds_loopback_by_default():
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["server"]["address"] == "127.0.0.1"
    assert config["browser"]["gatherUsageStats"] is False
    dry = subprocess.run(["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "--server.address 127.0.0.1" in dry
    exposed = subprocess.run(["make", "-n", "run", "ADDRESS=0.0.0.0"], cwd=ROOT,
                             capture_output=True, text=True).stdout
    assert "--server.address 0.0.0.0" in exposed                # deliberate exposure only
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py",
                               "--server.port", str(port)], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import psutil
        deadline, listening = time.monotonic() + 60, []
        while not listening and time.monotonic() < deadline:
            listening = [c.laddr.ip for c in psutil.Process(server.pid).net_connections("inet")
                         if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
            time.sleep(0.3)
        assert listening == ["127.0.0.1"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_stopping_a_job_that_ended_after_the_check_is_a_clear_error(monkeypatch):
    """The Stop button checks the job is alive, then signals it; if it ends in between, the
    page gets a JobError to show, not a ProcessLookupError traceback."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    monkeypatch.setattr(_jobs, "process_alive", lambda pid, module: True)  # the check passed just before it ended
    with pytest.raises(_jobs.JobError, match="already ended"):
        _jobs.stop({"pid": proc.pid})
