"""Where storage/db.py keeps its advisory lock files: outside the store's folder (which sits in
the checkout that Streamlit and editors watch), yet shared by every path that names the store."""
import os
import time

import pytest

from storage import db, queries
from storage.recorder import Recorder


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(db.LOCK_DIR_ENV, str(tmp_path / "locks"))
    folder = tmp_path / "runs"
    rec = Recorder(folder / "a.duckdb")
    rec.start_run({"env": "search", "model": "tiny", "algo": "grpo"}, run_id="r")
    rec.record_step(0, metrics={"reward/mean": 0.5})
    rec.finish()
    return folder / "a.duckdb"


def test_reads_and_writes_leave_nothing_next_to_the_store(store, tmp_path):
    queries.runs(store)
    with db.writing(store) as con:
        con.execute("SELECT 1")
    assert sorted(p.name for p in store.parent.iterdir()) == ["a.duckdb"]
    assert sorted(p.suffix for p in (tmp_path / "locks").iterdir()) == [".lock", ".turn"]


def test_every_name_of_a_store_meets_the_same_lock(store, tmp_path, monkeypatch):
    link = tmp_path / "elsewhere.duckdb"
    link.symlink_to(store)
    monkeypatch.chdir(store.parent)
    names = [store, link, "a.duckdb", "./a.duckdb", "../runs/a.duckdb"]
    assert len({db.lock_paths(n) for n in names}) == 1
    # A writer holding the store by its link keeps a reader of the real path waiting.
    with db.writing(link):
        with pytest.raises(db.StoreError, match="stayed locked"):
            with db._turn(store, exclusive=False, deadline=time.monotonic() + 0.2):
                pass
    with db.reading("a.duckdb") as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (1,)


def test_a_lock_dir_of_another_user_or_open_to_others_is_not_used(tmp_path, monkeypatch):
    monkeypatch.delenv(db.LOCK_DIR_ENV, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    own = db.lock_dir()
    assert own is not None and own.parent == tmp_path and (own.stat().st_mode & 0o777) == 0o700
    os.chmod(own, 0o777)  # writable by others: someone could plant links in it
    assert db.lock_dir() is None


def test_the_served_app_watches_no_files():
    """Streamlit's default watcher follows the whole checkout, .venv included (inotify overflow,
    minutes of server CPU): `make run` and the shipped config switch it off."""
    import tomllib
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    config = tomllib.loads((root / ".streamlit" / "config.toml").read_text())
    assert config["server"]["fileWatcherType"] == "none"
    run = (root / "Makefile").read_text().split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert "--server.fileWatcherType none" in run
