"""Schema as an ordered list of small migrations, each applied once and recorded.

Add a migration by appending a function to ``MIGRATIONS``; never edit one that has shipped.
A database whose recorded version is newer than this code knows is refused, never touched.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import duckdb

from storage import db, lake
from storage.db import StoreError


def m001_initial(con: duckdb.DuckDBPyConnection) -> None:
    """The CONTRACTS.md tables plus the columns the trainer and the app need."""
    con.execute("""
        CREATE TABLE runs (
            run_id VARCHAR PRIMARY KEY, name VARCHAR, created_at TIMESTAMP, status VARCHAR,
            config JSON, updated_at TIMESTAMP, error VARCHAR, source VARCHAR DEFAULT 'trainer',
            last_step INTEGER)""")
    con.execute("""
        CREATE TABLE metrics (run_id VARCHAR, step INTEGER, name VARCHAR, value DOUBLE)""")
    con.execute("""
        CREATE TABLE trajectories (
            run_id VARCHAR, step INTEGER, traj_id VARCHAR, group_id VARCHAR, task_id VARCHAR,
            reward DOUBLE, advantage DOUBLE, success BOOLEAN, num_turns INTEGER,
            finish_reason VARCHAR,
            split VARCHAR DEFAULT 'train',      -- train | eval | sft | expert | import
            rank INTEGER DEFAULT 0,             -- torchrun rank that rolled it out
            prompt VARCHAR,                     -- the task as the model was asked it
            answer VARCHAR,                     -- the parsed final answer, if any
            golds JSON,                         -- gold answers / expected result, if any
            failure_class VARCHAR,              -- storage/failures.py, computed when recorded
            filtered BOOLEAN DEFAULT FALSE,     -- dropped from the update (StarPO-S, |A| small)
            grad_norm DOUBLE,                   -- norm of this trajectory's gradient increment
            response_tokens INTEGER,
            info JSON)""")
    con.execute("""
        CREATE TABLE rewards (run_id VARCHAR, step INTEGER, traj_id VARCHAR, component VARCHAR,
                              value DOUBLE)""")
    con.execute("""
        CREATE TABLE turns (
            run_id VARCHAR, step INTEGER, traj_id VARCHAR, turn INTEGER, action VARCHAR,
            observation VARCHAR, action_valid BOOLEAN,
            action_type VARCHAR,                -- search | answer | tool | code | move | invalid
            parsed JSON,                        -- the parsed action arguments
            obs_truncated BOOLEAN DEFAULT FALSE,
            action_truncated BOOLEAN DEFAULT FALSE,  -- cut by max new tokens
            latency_s DOUBLE,
            error VARCHAR,
            state_diff JSON,                    -- rows a mutating action changed (apps)
            advantage DOUBLE,                   -- turn-level advantage (GiGPO), else trajectory's
            step_reward DOUBLE)""")
    con.execute("""
        CREATE TABLE tokens (
            run_id VARCHAR, step INTEGER, traj_id VARCHAR, pos INTEGER, token_id INTEGER,
            text VARCHAR, role VARCHAR, trained BOOLEAN, logprob DOUBLE, advantage DOUBLE,
            turn INTEGER,                       -- turn index (-1 for the prompt)
            entropy DOUBLE,                     -- sampling distribution's entropy at this token
            new_logprob DOUBLE,                 -- the updated policy's logprob (last epoch)
            ref_logprob DOUBLE,                 -- the reference (adapter-disabled) logprob
            value DOUBLE)                       -- value-head estimate (ppo)""")
    con.execute("""
        CREATE TABLE grad_stats (run_id VARCHAR, step INTEGER, module VARCHAR, norm DOUBLE)""")
    con.execute("""
        CREATE TABLE test_results (run_id VARCHAR, step INTEGER, traj_id VARCHAR, name VARCHAR,
                                   passed BOOLEAN, detail VARCHAR)""")
    con.execute("""
        CREATE TABLE tags (run_id VARCHAR, traj_id VARCHAR, tag VARCHAR, note VARCHAR,
                           created_at TIMESTAMP)""")


def m002_imports(con: duckdb.DuckDBPyConnection) -> None:
    """Provenance of imported runs: one row per import of a file (storage/io.py)."""
    con.execute("""
        CREATE TABLE imports (
            run_id VARCHAR, source VARCHAR,     -- the file's name (never a full path)
            format VARCHAR, imported_at TIMESTAMP,
            lines INTEGER, imported INTEGER, skipped INTEGER, failed INTEGER,
            errors JSON)                        -- the first line-numbered errors""")


def m003_turn_state(con: duckdb.DuckDBPyConnection) -> None:
    """Per turn: the env's state key (GiGPO's anchor) and the step's info (slips, sandbox
    layers, counters). Rows recorded before stay NULL; readers take NULL as 'not recorded'."""
    con.execute("ALTER TABLE turns ADD COLUMN state_key VARCHAR")
    con.execute("ALTER TABLE turns ADD COLUMN info JSON")


def m004_turn_analyses(con: duckdb.DuckDBPyConnection) -> None:
    """Per-turn analyses of recorded trajectories.

    * ``branches``: one row per branch-from-turn continuation (core/jobs/branch.py). ``kind`` is
      ``resample`` (a new action sampled at the turn) or ``keep`` (the recorded action kept, new
      samples after it); the continuation itself is an ordinary trajectory with split 'branch'.
    * ``turn_signals``: per-turn quantities computed after or during recording (``info_gain``,
      ``progress``, ``prm``, ``q``, ``v``, ...), one row per (trajectory, turn, name).
    * ``embeddings``: a cached vector per trajectory and embedding model (failure clusters), so
      a page never embeds on load.
    """
    con.execute("""
        CREATE TABLE branches (
            run_id VARCHAR, traj_id VARCHAR, turn INTEGER, kind VARCHAR,
            child_traj_id VARCHAR, return DOUBLE, checkpoint_step INTEGER,
            job_id VARCHAR, seed INTEGER)""")
    con.execute("""
        CREATE TABLE turn_signals (
            run_id VARCHAR, step INTEGER, traj_id VARCHAR, turn INTEGER, name VARCHAR,
            value DOUBLE, source VARCHAR)       -- train | branch | analysis""")
    con.execute("""
        CREATE TABLE embeddings (
            run_id VARCHAR, traj_id VARCHAR, model VARCHAR, text_hash VARCHAR,
            vector FLOAT[], created_at TIMESTAMP)""")


def m005_failure_clusters(con: duckdb.DuckDBPyConnection) -> None:
    """Failure clusters of a run (core/jobs/clusters.py), computed by a job from ``embeddings``.

    One row per clustered (failing) trajectory: its ``cluster`` (0.. k-1, by size), its cosine
    ``distance`` to the cluster's centroid (the smallest are the cluster's most central members)
    and the cluster's distinguishing ``terms`` (class-based TF-IDF), repeated per member so that
    a page reads one table. ``k`` and ``silhouette`` describe the whole clustering. A new job
    replaces the run's rows for that embedding ``model``.
    """
    con.execute("""
        CREATE TABLE failure_clusters (
            run_id VARCHAR, model VARCHAR, traj_id VARCHAR, step INTEGER, cluster INTEGER,
            distance DOUBLE, terms VARCHAR, k INTEGER, silhouette DOUBLE,
            created_at TIMESTAMP)""")


def m006_train_logprob(con: duckdb.DuckDBPyConnection) -> None:
    """The trainer's own logprob of each trained token under the weights that sampled it,
    computed before the update (core/learn/mismatch.py); ``logprob`` stays the sampler's. NULL where
    not computed (older rows, untrained tokens, imports without it)."""
    con.execute("ALTER TABLE tokens ADD COLUMN train_logprob DOUBLE")


def m007_renders(con: duckdb.DuckDBPyConnection) -> None:
    """An environment's own pictures of its state (the optional ``Episode.render()``): one row
    per picture, ``turn`` -1 for the state after reset, t for the state after turn t's action.
    ``kind`` is svg | png | table and ``body`` the SVG text, the PNG as base64 or the table's
    rows as JSON, each already capped by the rollout. Stores recorded before have no such table:
    readers return no pictures for them (Replay then draws grid worlds from their text)."""
    con.execute("""
        CREATE TABLE renders (
            run_id VARCHAR, step INTEGER, traj_id VARCHAR, turn INTEGER, kind VARCHAR,
            body VARCHAR)""")


def m008_spans(con: duckdb.DuckDBPyConnection) -> None:
    """Every OpenTelemetry span and log record the OTLP receiver took (storage/otlp/), raw, with
    the trajectory it was assembled into, so nothing is lost and a later assembly can change.
    Ids are lowercase hex; times Unix nanoseconds; ``attributes``, ``resource`` and ``events``
    the span's own, as JSON. ``span_logs`` holds log records (GenAI event mode)."""
    con.execute("""
        CREATE TABLE spans (
            run_id VARCHAR, traj_id VARCHAR, trace_id VARCHAR, span_id VARCHAR,
            parent_span_id VARCHAR, name VARCHAR, kind INTEGER, start_ns BIGINT, end_ns BIGINT,
            status_code INTEGER, status_message VARCHAR, attributes JSON, resource JSON,
            scope VARCHAR, events JSON, received_at TIMESTAMP)""")
    con.execute("""
        CREATE TABLE span_logs (
            run_id VARCHAR, traj_id VARCHAR, trace_id VARCHAR, span_id VARCHAR, time_ns BIGINT,
            event_name VARCHAR, body JSON, attributes JSON, resource JSON,
            received_at TIMESTAMP)""")


def m009_behaviours(con: duckdb.DuckDBPyConnection) -> None:
    """Behaviours of each trajectory (storage/behaviours/): one row per (trajectory, behaviour)
    whose value is defined; a behaviour that cannot be computed for a trajectory has no row.
    ``step`` is the trajectory's, so a step's rows are read without a join. Written by the
    trainer at each step and by ``agentrl behaviours`` (which replaces a run's rows)."""
    con.execute("""
        CREATE TABLE behaviours (
            run_id VARCHAR, step INTEGER, traj_id VARCHAR, name VARCHAR, value DOUBLE)""")


def m010_token_rejected(con: duckdb.DuckDBPyConnection) -> None:
    """Rollout correction's rejection (``--rollout-correction mis|rs``, core/learn/mismatch.py):
    TRUE on a generated token the trainer scored whose ratio left the band, so the loss left it
    out; FALSE on one it kept; NULL where no rejection ran (older rows, none/tis, imports).
    ``trained`` stays the loss mask exactly as the optimiser applied it; the mismatch figures
    (storage/mismatch_queries.py) read trained and rejected tokens, as the trainer's metrics do,
    and the trainer's logprob is kept on the rejected tokens for them."""
    con.execute("ALTER TABLE tokens ADD COLUMN rejected BOOLEAN")


MIGRATIONS = [m001_initial, m002_imports, m003_turn_state, m004_turn_analyses,
              m005_failure_clusters, m006_train_logprob, m007_renders, m008_spans,
              m009_behaviours, m010_token_rejected]
SCHEMA_VERSION = len(MIGRATIONS)


def current_version(con: duckdb.DuckDBPyConnection) -> int:
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = '_migrations'"
    ).fetchone()[0]
    if not exists:
        return 0
    return con.execute("SELECT coalesce(max(version), 0) FROM _migrations").fetchone()[0]


def check_version(con: duckdb.DuckDBPyConnection, where: str = "database") -> int:
    """The schema version, or StoreError if this code is too old to read it."""
    version = current_version(con)
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{where} has schema version {version}, newer than this code knows ({SCHEMA_VERSION}); "
            "upgrade the project to read it. The file was not modified.")
    return version


def _store_version(con: duckdb.DuckDBPyConnection, where: str) -> int:
    """The schema version; StoreError for a foreign database or one newer than this code."""
    if current_version(con) == 0:
        tables = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'main'"
        ).fetchone()[0]
        if tables:
            raise StoreError(f"{where} holds tables but no migration record: not a store of this "
                             "project. The file was not modified.")
    return check_version(con, where)


class _Keyless:
    """A connection whose CREATE statements leave PRIMARY KEY out: DuckLake keeps no keys
    (storage/lake.py), and each writer checks a run id before it inserts one."""

    def __init__(self, con):
        self._con = con

    def execute(self, sql: str, *args):
        return self._con.execute(sql.replace(" PRIMARY KEY", ""), *args)

    def __getattr__(self, name):
        return getattr(self._con, name)


def migrate(con: duckdb.DuckDBPyConnection, where: str = "database") -> list[str]:
    """Apply every migration not yet recorded; return the names applied."""
    if lake.is_lake_connection(con):
        con = _Keyless(con)
    version = _store_version(con, where)
    con.execute("""CREATE TABLE IF NOT EXISTS _migrations (
                       version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)""")
    applied = []
    for version_no, fn in enumerate(MIGRATIONS, start=1):
        if version_no <= version:
            continue
        fn(con)
        con.execute("INSERT INTO _migrations VALUES (?, ?, ?)",
                    [version_no, fn.__name__, datetime.now(timezone.utc).replace(tzinfo=None)])
        applied.append(fn.__name__)
    return applied


def prepare(path: str | Path, where: str | None = None) -> list[str]:
    """Make the file at ``path`` a store of the current schema; return the migrations applied.

    An existing file is first inspected read-only, so a file this code must refuse (not DuckDB,
    not a store, a newer schema) is never opened for writing and stays byte-for-byte unchanged.
    """
    path = Path(path)
    where = where or str(path)
    if lake.is_lake(path):
        with db.reading(path) as con:
            if _store_version(con, where) == SCHEMA_VERSION:
                return []
        with db.writing(path) as con:
            return migrate(con, where)
    if path.is_dir():
        raise StoreError(f"{where} is a directory, not a store file (a Parquet export is "
                         "read-only)")
    if path.exists():
        with db.reading(path) as con:
            version = _store_version(con, where)
        if version == SCHEMA_VERSION:
            return []
    with db.writing(path) as con:
        return migrate(con, where)
