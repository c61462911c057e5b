"""Writes a run into a DuckDB store: one transaction and one batched insert per table per step.

    rec = Recorder("runs/store.duckdb")
    run_id = rec.start_run(config={"env": "search", "model": "tiny", "algo": "grpo"})
    rec.record_step(0, metrics={"reward/mean": 0.4}, trajectories=[...], tokens=df, ...)
    rec.finish("finished")

Rows are given without ``run_id``/``step`` (the recorder adds both) as a DataFrame, a list of
dicts or a dict of columns. Columns a table has but the rows lack are stored as NULL / default;
dict or list values in JSON columns are serialised. ``NullRecorder`` has the same methods and
records nothing (``DummyWandb``-style: no ``if recorder:`` in the trainer).

Every row headed for DuckDB, the trainer's and the importer's (storage/io.py), passes
``clean_column``/``to_json`` here: text from a model, a tool or a file is stored whatever it holds,
and never fails a step. Measured (DuckDB 1.x and pandas 3 alike): a Python string holding a lone
UTF-16 surrogate (``chr(55296)``, or invalid UTF-8 decoded with ``surrogateescape``) fails every
insert path, and already building the step's DataFrame, with ``UnicodeEncodeError``; it is stored
with U+FFFD in its place. NUL is stored by DuckDB but invisible and cut short by C tools: it becomes
U+2400 (the symbol for NUL). Other control characters (``\n``, ``\t``, ANSI escapes) are stored as
they are; pages render all stored text escaped. In JSON columns NaN and +-Infinity, which JSON
cannot hold, become the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.
"""
from __future__ import annotations

import json
import math
import re
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from storage import db
from storage.migrations import migrate, prepare
from storage.trajectory import TABLES, json_columns

STEP_TABLES = ("metrics", "trajectories", "rewards", "turns", "tokens", "grad_stats", "test_results",
               "turn_signals", "renders", "behaviours")
JSON_COLUMNS = {t: json_columns(t) for t in TABLES if json_columns(t)}
"""The model's JSON columns (storage/trajectory.py), which the recorder serialises."""
RUN_STATUSES = ("running", "finished", "failed", "stopped")

RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

Rows = pd.DataFrame | list[Mapping[str, Any]] | Mapping[str, Any] | None


def now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def check_run_id(run_id: str) -> str:
    """``run_id`` if it is safe as one path component (exports derive directories from it)."""
    if not isinstance(run_id, str) or not RUN_ID_RE.fullmatch(run_id):
        raise ValueError(f"run id {run_id!r} must be 1-128 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return run_id


# -- the recording boundary ----------------------------------------------------------------------
NUL_MARK = "\u2400"
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""How JSON (our columns, our exports) writes the numbers it has no literal for."""


def clean_text(text: str) -> str:
    """``text`` as it can be stored: lone surrogates -> U+FFFD, NUL -> U+2400, the rest as is.

    A surrogate pair left as two code units is joined into the one character it encodes."""
    if "\x00" in text:
        text = text.replace("\x00", NUL_MARK)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def _cell(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, (bytes, bytearray)):
        return clean_text(bytes(value).decode("utf-8", "replace"))
    return value


def clean_column(values):
    """``values`` itself when no cell needs cleaning, else a cleaned list.

    A column is taken as text when its first non-null cell is text; only then are its cells
    looked at, with one join and one scan: about 0.15 ms per text column of a 30k-token step,
    nothing for numeric ones (measured: to_frame of a 30k-row tokens step, 22.0 -> 22.5 ms)."""
    cells = values.tolist() if hasattr(values, "tolist") else values
    cells = cells if isinstance(cells, list) else list(cells)
    if not cells or (cells[0] is None and cells.count(None) == len(cells)):  # count() runs in C
        return values
    first = cells[0] if cells[0] is not None else next(v for v in cells if v is not None)
    if not isinstance(first, (str, bytes, bytearray)):
        return values
    try:
        joined = "".join(cells)
    except TypeError:  # NULLs (or bytes) among the strings
        joined = "".join([v for v in cells if isinstance(v, str)])
        if any(isinstance(v, (bytes, bytearray)) for v in cells):
            return [_cell(v) for v in cells]
    if "\x00" not in joined:
        if joined.isascii():
            return values
        try:
            joined.encode("utf-8")
            return values
        except UnicodeEncodeError:
            pass
    return [_cell(v) for v in cells]


def clean_json(value: Any) -> Any:
    """``value`` with every string cleaned and NaN/+-inf as ``"NaN"``/``"Infinity"``/``"-Infinity"``
    (dict keys too), so its JSON is standard JSON that our importer reads back."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {clean_json(k) if isinstance(k, (str, float)) else
                k if k is None or isinstance(k, (int, bool)) else clean_text(str(k)):
                clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return _cell(value)


def to_json(value: Any, ensure_ascii: bool = True) -> Any:
    """The JSON text stored for ``value`` (None stays NULL; a string is taken as JSON text)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):  # pandas' missing
        return None
    if isinstance(value, str):
        return clean_text(value)
    try:
        text = json.dumps(clean_json(value), default=str, ensure_ascii=ensure_ascii)
    except (ValueError, TypeError, RecursionError):  # cyclic or too deep: keep what it showed
        text = json.dumps(clean_text(repr(value)[:100_000]), ensure_ascii=ensure_ascii)
    return clean_text(text)  # what ``default=str`` made of unknown objects


def from_json(value: Any) -> Any:
    """A stored JSON column read back: its value when it is JSON text (None when the text does
    not parse), anything else as it is (DuckDB may hand a JSON column over already parsed)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return None
    return value


def to_frame(table: str, rows: Rows) -> pd.DataFrame:
    """Normalise rows for ``table`` into a DataFrame (metrics may be a {name: value} dict),
    cleaned at the recording boundary (module docstring) before pandas sees a string."""
    if rows is None:
        return pd.DataFrame()
    if table == "metrics" and isinstance(rows, Mapping) and not any(
            isinstance(v, (list, tuple)) for v in rows.values()):
        rows = [{"name": k, "value": float(v)} for k, v in rows.items() if v is not None]
    json_names = JSON_COLUMNS.get(table, ())
    if isinstance(rows, pd.DataFrame):
        columns = {c: rows[c] for c in rows.columns}
    elif isinstance(rows, Mapping):
        columns = dict(rows)
    else:
        rows = list(rows)
        names = list(dict.fromkeys(k for r in rows for k in r))
        columns = {n: [r.get(n) for r in rows] for n in names}
    changed = {}
    for name, values in columns.items():
        cleaned = [to_json(v) for v in values] if name in json_names else clean_column(values)
        if cleaned is not values:
            changed[name] = cleaned
    if isinstance(rows, pd.DataFrame):  # keep its index and dtypes; the caller's frame stays
        return rows.assign(**changed) if changed else rows
    return pd.DataFrame({**columns, **changed})


def insert_frame(con, table: str, frame: pd.DataFrame, run_id: str, step: int | None) -> None:
    """One batched ``INSERT ... BY NAME`` of ``frame`` (sets ``run_id``, and ``step`` if absent).

    The constants are added by DuckDB, not as pandas columns: copying a step's 30k-row frame to
    add them cost more than the insert itself (bench/storage.py).
    """
    if frame.empty:
        return
    select = "* EXCLUDE (run_id)" if "run_id" in frame.columns else "*"
    select, params = f"{select}, ?::VARCHAR AS run_id", [run_id]
    if step is not None and "step" not in frame.columns:
        select, params = f"{select}, ?::INTEGER AS step", [run_id, step]
    con.register("_rows", frame)
    # Not in a ``finally``: after a failed insert the transaction is aborted and unregistering
    # would raise over the real error; the next register replaces the stale view anyway.
    con.execute(f"INSERT INTO {table} BY NAME SELECT {select} FROM _rows", params)
    con.unregister("_rows")


class Recorder:
    """Records one run. Holds the database file only while writing (see storage/db.py)."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self.run_id: str | None = None
        self._memory = db.connect(None) if self.path == ":memory:" else None
        if self._memory is not None:
            for attempt in self._attempts():
                with attempt as con:
                    migrate(con, where=self.path)
        else:
            prepare(self.path)  # refuses a foreign or newer file without touching it

    # -- connections ---------------------------------------------------------------------------
    def _attempts(self):
        """Each write's transaction: once on a file or in memory; on a team store again while
        another writer's commit conflicts with it (storage/db.py ``attempts``)."""
        if self._memory is not None:
            return [_MemoryTx(self._memory)]
        return db.attempts(self.path)

    # -- run lifecycle -------------------------------------------------------------------------
    def start_run(self, config: Mapping[str, Any], name: str | None = None,
                  run_id: str | None = None, source: str = "trainer") -> str:
        self.run_id = check_run_id(run_id) if run_id else new_run_id()
        for attempt in self._attempts():
            with attempt as con:
                # a team store keeps no primary key (storage/lake.py): the id is checked here,
                # as a file's key would refuse it
                if con.execute("SELECT count(*) FROM runs WHERE run_id = ?",
                               [self.run_id]).fetchone()[0]:
                    raise db.StoreError(f"{self.path} already holds a run {self.run_id!r}")
                con.execute(
                    "INSERT INTO runs (run_id, name, created_at, status, config, updated_at, "
                    "source) VALUES (?, ?, ?, 'running', ?, ?, ?)",
                    [self.run_id, clean_text(name or self.run_id), now(), to_json(dict(config)),
                     now(), source])
        return self.run_id

    def resume_run(self, run_id: str, config: Mapping[str, Any] | None = None) -> int | None:
        """Reopen ``run_id`` for writing; return its last recorded step (None if none).

        With ``config`` (the configuration the run goes on with, e.g. ``--resume`` with a new
        ``--steps``), the stored configuration becomes it, and what changed is kept in its
        ``resumed`` list (the last recorded step and each changed key's old and new value), so
        the app never shows the settings a run no longer trains with, nor loses the earlier ones.
        """
        for attempt in self._attempts():
            with attempt as con:
                row = con.execute("SELECT last_step, config FROM runs WHERE run_id = ?",
                                  [run_id]).fetchone()
                if row is None:
                    raise db.StoreError(f"no run {run_id!r} in {self.path}")
                con.execute("UPDATE runs SET status = 'running', error = NULL, updated_at = ? "
                            "WHERE run_id = ?", [now(), run_id])
                if config is not None:
                    old = json.loads(row[1]) if row[1] else {}
                    new = json.loads(to_json(dict(config)))
                    changed = {k: [old.get(k), v] for k, v in new.items()
                               if k != "resumed" and old.get(k) != v}
                    if changed:
                        new["resumed"] = old.get("resumed", []) + [{"after_step": row[0],
                                                                   "changed": changed}]
                        con.execute("UPDATE runs SET config = ? WHERE run_id = ?",
                                    [json.dumps(new), run_id])
        self.run_id = run_id
        return row[0]

    def delete_steps_after(self, step: int) -> None:
        """Remove every row of steps > ``step`` (used when resuming from a checkpoint)."""
        for attempt in self._attempts():
            with attempt as con:
                for table in STEP_TABLES:
                    con.execute(f"DELETE FROM {table} WHERE run_id = ? AND step > ?",
                                [self.run_id, step])
                con.execute("UPDATE runs SET last_step = (SELECT max(step) FROM metrics "
                            "WHERE run_id = ?) WHERE run_id = ?", [self.run_id, self.run_id])

    def set_status(self, status: str, error: str | None = None) -> None:
        if status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {RUN_STATUSES}, got {status!r}")
        for attempt in self._attempts():
            with attempt as con:
                con.execute("UPDATE runs SET status = ?, error = ?, updated_at = ? "
                            "WHERE run_id = ?",
                            [status, None if error is None else clean_text(str(error)), now(),
                             self.run_id])

    def finish(self, status: str = "finished", error: str | None = None) -> None:
        self.set_status(status, error)

    # -- per-step writes -------------------------------------------------------------------------
    def record_step(self, step: int, **tables: Rows) -> None:
        """Write everything of one step in one transaction: all of it is visible, or none."""
        unknown = set(tables) - set(STEP_TABLES)
        if unknown:
            raise ValueError(f"unknown tables {sorted(unknown)}; expected {STEP_TABLES}")
        frames = {t: to_frame(t, rows) for t, rows in tables.items()}
        for attempt in self._attempts():
            with attempt as con:
                for table, frame in frames.items():
                    insert_frame(con, table, frame, self.run_id, step)
                con.execute("UPDATE runs SET last_step = greatest(coalesce(last_step, ?), ?), "
                            "updated_at = ? WHERE run_id = ?", [step, step, now(), self.run_id])

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.record_step(step, metrics=metrics)

    def close(self) -> None:
        if self._memory is not None:
            self._memory.close()
            self._memory = None

    def connection(self):
        """The open in-memory connection (tests only); file stores are opened per write."""
        return self._memory


class NullRecorder:
    """Same methods as Recorder; records nothing."""

    path = None
    run_id = "null"

    def start_run(self, config, name=None, run_id=None, source="trainer") -> str:
        return self.run_id

    def resume_run(self, run_id: str, config: Mapping[str, Any] | None = None) -> int | None:
        return None

    def delete_steps_after(self, step: int) -> None: ...
    def set_status(self, status: str, error: str | None = None) -> None: ...
    def finish(self, status: str = "finished", error: str | None = None) -> None: ...
    def record_step(self, step: int, **tables: Rows) -> None: ...
    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None: ...
    def close(self) -> None: ...


class _MemoryTx:
    """Transaction on a long-lived in-memory connection (an in-memory store cannot be reopened)."""

    def __init__(self, con):
        self.con = con

    def __enter__(self):
        self.con.execute("BEGIN TRANSACTION")
        return self.con

    def __exit__(self, exc_type, exc, tb):
        self.con.execute("ROLLBACK" if exc_type else "COMMIT")
        return False
