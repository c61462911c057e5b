"""Tags and notes users attach to trajectories from the app: the app's only writes.

Each call is one short write transaction (``db.writing``), so it interleaves with a running
trainer's steps like any other writer. Only an existing store of this project is written to, and
only about a trajectory it holds: a tag can never create a file or a dangling row.
"""
from __future__ import annotations

from pathlib import Path

from storage import db
from storage.migrations import check_version
from storage.recorder import now

MAX_TAG = 64
MAX_NOTE = 2000


def _clean(text: str, what: str, limit: int, required: bool) -> str:
    if not isinstance(text, str):
        raise ValueError(f"{what} must be text, got {type(text).__name__}")
    text = text.strip()
    if required and not text:
        raise ValueError(f"{what} must not be empty")
    if len(text) > limit:
        raise ValueError(f"{what} is {len(text)} characters; at most {limit}")
    if any(ord(c) < 32 and c not in "\n\t" for c in text):
        raise ValueError(f"{what} contains control characters")
    return text


def _open_store(store: str | Path):
    if not Path(store).is_file():
        raise db.StoreError(f"no store at {store}")
    return db.writing(store)


def _check_trajectory(con, store, run_id: str, traj_id: str) -> None:
    if check_version(con, where=str(store)) == 0:
        raise db.StoreError(f"{store} is not a store of this project")
    found = con.execute("SELECT count(*) FROM trajectories WHERE run_id = ? AND traj_id = ?",
                        [run_id, traj_id]).fetchone()[0]
    if not found:
        raise ValueError(f"run {run_id!r} has no trajectory {traj_id!r}")


def add_tag(store: str | Path, run_id: str, traj_id: str, tag: str, note: str = "") -> None:
    """Attach ``tag`` (1-64 characters) with an optional ``note`` to one trajectory.

    Tagging the same trajectory with the same tag again replaces the note."""
    tag = _clean(tag, "tag", MAX_TAG, required=True)
    note = _clean(note or "", "note", MAX_NOTE, required=False)
    with _open_store(store) as con:
        _check_trajectory(con, store, run_id, traj_id)
        con.execute("DELETE FROM tags WHERE run_id = ? AND traj_id = ? AND tag = ?",
                    [run_id, traj_id, tag])
        con.execute("INSERT INTO tags (run_id, traj_id, tag, note, created_at) "
                    "VALUES (?, ?, ?, ?, ?)", [run_id, traj_id, tag, note or None, now()])


def remove_tag(store: str | Path, run_id: str, traj_id: str, tag: str) -> int:
    """Remove ``tag`` from one trajectory; returns how many rows went (0 or 1)."""
    with _open_store(store) as con:
        _check_trajectory(con, store, run_id, traj_id)
        n = con.execute("SELECT count(*) FROM tags WHERE run_id = ? AND traj_id = ? AND tag = ?",
                        [run_id, traj_id, tag]).fetchone()[0]
        con.execute("DELETE FROM tags WHERE run_id = ? AND traj_id = ? AND tag = ?",
                    [run_id, traj_id, tag])
    return int(n)
