"""tools/convert_store.py (storage/compact.py's convert): a store file copied into a new file in
an older storage format, every table's rows the same; an existing destination or a missing source
refused by name, and no half-written file left."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb

from storage import store_copy

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_runs" / "inspect_agents.duckdb"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "tools/convert_store.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_convert_writes_every_row_in_the_named_storage_version(tmp_path):
    new = tmp_path / "new.duckdb"
    done = run(str(SAMPLE), str(new), "--storage-version", "v1.4.0")
    assert done.returncode == 0, done.stderr
    assert store_copy.same_rows(SAMPLE, new) == []
    con = duckdb.connect(str(new), read_only=True)
    try:
        (version,) = con.execute("SELECT tags['storage_version'] FROM duckdb_databases() "
                                 "WHERE database_name = 'new'").fetchone()
    finally:
        con.close()
    assert version.startswith("v1.4"), version
    again = run(str(SAMPLE), str(new))
    assert again.returncode == 1 and "exists; name a new file" in again.stderr
    missing = run(str(tmp_path / "none.duckdb"), str(tmp_path / "other.duckdb"))
    assert missing.returncode == 1 and "no file" in missing.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.duckdb"]
