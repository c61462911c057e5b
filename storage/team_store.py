"""Making a team store (``agentrl store init``): the catalog, the data directory and the
project's tables, then the marker that makes the directory a store (storage/lake.py opens it).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from storage import lake
from storage.migrations import migrate


def init(path: str | Path, catalog: str, data_path: str | None = None) -> Path:
    """Make a team store at ``path`` (a new or empty directory): the catalog, the data
    directory and the project's tables. The marker is written last, so a store whose making
    failed is not taken for one."""
    root = Path(path)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise lake.LakeError(f"{root} exists and is not an empty directory: a team store is "
                             "made in a new one")
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    try:
        return _make(root, catalog, data_path)
    except BaseException:
        # what a failed making left (its data directory, its catalog file) would refuse a rerun
        # of the same command as "not an empty directory"; a store made meanwhile is kept
        if not (root / lake.MARKER).exists():
            if data_path is None:
                shutil.rmtree(root / lake.DATA_DIR, ignore_errors=True)
            if catalog == "sqlite":
                (root / lake.CATALOG_FILE).unlink(missing_ok=True)
        raise


def _make(root: Path, catalog: str, data_path: str | None) -> Path:
    data = data_path or str(root / lake.DATA_DIR)
    if "://" not in data:
        Path(data).mkdir(parents=True, exist_ok=True)
    desc = {"catalog": lake.catalog_of(catalog, root), "data_path": data}
    try:
        con = lake.attach(root, desc)
    except lake.LakeError as exc:
        if "does not match existing data path" in str(exc):
            raise lake.LakeError(f"the catalog {lake.shown(desc['catalog'])} already holds "
                                 "another team store: make a team store with a new "
                                 "database") from exc
        raise
    try:
        held = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ?",
                           [lake.ALIAS]).fetchone()[0]
        if held:
            raise lake.LakeError(f"the catalog {lake.shown(desc['catalog'])} already holds a "
                                 f"team store ({held} tables): copy its runs with agentrl store "
                                 "copy, or use a new database")
        migrate(con, where=str(root))
    finally:
        con.close()
    stored = dict(desc)
    if catalog == "sqlite":
        stored["catalog"] = f"sqlite:{lake.CATALOG_FILE}"   # the store's own file: the folder moves
    if data_path is None:
        stored["data_path"] = lake.DATA_DIR
    tmp = root / (lake.MARKER + ".tmp")
    tmp.write_text(json.dumps({"format": "agentrl-team-store", "version": 1, **stored},
                              indent=1), encoding="utf-8")
    os.replace(tmp, root / lake.MARKER)
    return root
