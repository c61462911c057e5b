"""The receiver's stored records read back: which trajectories still need deriving after a
restart (``pending``), the spans and log records one derivation reads (``read_records``), and a
conversation absorbing the traces first stored under their own trajectory (``move``).

storage/otlp/store.py appends the records; storage/otlp/writer.py derives trajectories from what
these functions read, so a derivation only ever sees what was committed.
"""
from __future__ import annotations

import json

import pyarrow as pa

from storage import db
from storage.otlp.decode import LogRecord, Span


def known_rows(db_path) -> list[tuple[str, str, str]]:
    """(run id, traj id, trace id) of every stored span's trajectory (a late span's home)."""
    with db.reading(db_path) as con:
        return con.execute("SELECT DISTINCT run_id, traj_id, trace_id FROM spans").fetchall()


def pending(db_path) -> list[tuple[str, str, str]]:
    """(run id, traj id, a trace id) of every trajectory whose stored spans were not all
    derived: none derived, derived from fewer, or derived while open (a receiver killed or
    stopped before it closed them)."""
    with db.reading(db_path) as con:
        return con.execute("""
            WITH raw AS (SELECT run_id, traj_id, min(trace_id) AS trace_id,
                                count(DISTINCT span_id) AS n FROM spans GROUP BY ALL)
            SELECT raw.run_id, raw.traj_id, raw.trace_id FROM raw
            LEFT JOIN trajectories t USING (run_id, traj_id)
            WHERE t.traj_id IS NULL
               OR coalesce(TRY_CAST(t.info->'otel'->>'spans' AS BIGINT), -1) <> raw.n
               OR coalesce(TRY_CAST(t.info->'otel'->>'open' AS BOOLEAN), FALSE)""").fetchall()


def _load(text):
    return json.loads(text) if text else {}


def stored_records(db_path, keys: list[tuple[str, str]]
                   ) -> dict[tuple[str, str], tuple[list[Span], list[LogRecord]]]:
    """Each (run id, traj id)'s stored spans (one per span id) and log records, one read."""
    if not keys:
        return {}
    with db.reading(db_path) as con:
        return read_records(con, keys)


def read_records(con, keys: list[tuple[str, str]]
                 ) -> dict[tuple[str, str], tuple[list[Span], list[LogRecord]]]:
    """``stored_records`` on an open connection (the appender's, from the deriver)."""
    out: dict[tuple[str, str], tuple[list[Span], list[LogRecord]]] = {k: ([], []) for k in keys}
    if not keys:
        return out
    table = pa.table({"run_id": [k[0] for k in keys], "traj_id": [k[1] for k in keys]})
    con.register("_otlp_keys", table)
    try:
        spans = con.execute(
            "SELECT run_id, traj_id, trace_id, span_id, any_value(parent_span_id), "
            "any_value(name), any_value(kind), any_value(start_ns), any_value(end_ns), "
            "any_value(attributes), any_value(resource), any_value(scope), "
            "any_value(status_code), any_value(status_message), any_value(events) "
            "FROM spans JOIN _otlp_keys USING (run_id, traj_id) GROUP BY ALL").fetchall()
        logs = con.execute(
            "SELECT DISTINCT run_id, traj_id, trace_id, span_id, time_ns, event_name, body, "
            "attributes, resource FROM span_logs JOIN _otlp_keys USING (run_id, traj_id)"
        ).fetchall()
    finally:
        con.unregister("_otlp_keys")
    for r in spans:
        out[(r[0], r[1])][0].append(Span(r[2], r[3], r[4], r[5], r[6], r[7], r[8], _load(r[9]),
                                         _load(r[10]), r[11], r[12] or 0, r[13] or "",
                                         _load(r[14]) or []))
    for r in logs:
        out[(r[0], r[1])][1].append(LogRecord(r[2], r[3], r[4], r[5],
                                              _load(r[6]) if r[6] else None, _load(r[7]),
                                              _load(r[8])))
    return out


def move(con, run_id: str, absorbed: list[str], into: str) -> None:
    """Records first stored under their trace's own trajectory now belong to the conversation
    ``into`` (inside the caller's transaction)."""
    for table in ("spans", "span_logs"):
        con.execute(f"UPDATE {table} SET traj_id = ? WHERE run_id = ? AND traj_id IN "
                    "(SELECT unnest(?))", [into, run_id, absorbed])
