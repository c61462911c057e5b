"""Runs moved between stores of either kind (a DuckDB file, a team store on DuckLake, a Parquet
export as a source), every table's rows unchanged.

The rows stream from the source's read connection to the destination's write transaction as
Arrow record batches (``BATCH_ROWS`` at a time): nothing holds a whole table in memory, and the
two stores never need to be attached to one connection, so any kind meets any kind. The copy is
one transaction on the destination: a copy that fails or is killed leaves no part of a run
there. A run already in the destination is refused, never written twice; a source of an older
schema copies with the newer columns NULL, as the store reads it; one newer than this code is
refused before anything is written.

``digests`` is the check: an md5 per table over the md5 of each row's text, sorted, so two
stores that hold the same rows agree whatever order or file layout they hold them in (a zero's
sign aside: a team store's Parquet files keep 0.0 and -0.0 as one value).
"""
from __future__ import annotations

from pathlib import Path

from storage import db
from storage.migrations import check_version, prepare

BATCH_ROWS = 100_000
SKIPPED = ("_migrations",)   # each store's own schema record


def _tables(con) -> list[str]:
    return [t for (t,) in con.execute(
        "SELECT DISTINCT table_name FROM duckdb_columns() WHERE column_name = 'run_id' "
        "AND database_name = current_database() AND schema_name = 'main' ORDER BY 1").fetchall()
        if t not in SKIPPED]


def _runs(con, wanted: list[str] | None, where: str) -> list[str]:
    have = [r for (r,) in con.execute("SELECT run_id FROM runs ORDER BY created_at").fetchall()]
    if wanted is None:
        return have
    missing = [r for r in wanted if r not in have]
    if missing:
        raise db.StoreError(f"{where} holds no run {', '.join(missing)}")
    return list(dict.fromkeys(wanted))


def copy(src: str | Path, dst: str | Path, run_ids: list[str] | None = None
         ) -> tuple[list[str], dict[str, int]]:
    """Copy ``run_ids`` (default: every run) from ``src`` to ``dst`` (made if missing, as a
    DuckDB file; a team store is made first with ``agentrl store init``). Returns the runs
    copied and the rows copied per table."""
    if Path(src).resolve() == Path(dst).resolve():
        raise db.StoreError(f"{src} is both the source and the destination")
    prepare(dst)
    copied: dict[str, int] = {}
    with db.reading(src) as scon:
        check_version(scon, where=str(src))
        runs = _runs(scon, run_ids, str(src))
        if not runs:
            return runs, copied
        tables = _tables(scon)
        with db.writing(dst) as dcon:
            present = [r for (r,) in dcon.execute(
                "SELECT run_id FROM runs WHERE run_id IN (SELECT unnest(?))", [runs]).fetchall()]
            if present:
                raise db.StoreError(f"{dst} already holds run {', '.join(present)}: nothing "
                                    "copied (a run is never written twice)")
            have = set(_tables(dcon))
            for table in tables:
                if table not in have:
                    raise db.StoreError(f"{dst} has no table {table}: upgrade the project that "
                                        "wrote it, or copy into a new store")
                reader = scon.execute(f'SELECT * FROM "{table}" WHERE run_id IN '
                                      "(SELECT unnest(?))", [runs]
                                      ).to_arrow_reader(BATCH_ROWS)
                n = 0
                for batch in reader:
                    dcon.register("_copy_batch", batch)
                    try:
                        dcon.execute(f'INSERT INTO "{table}" BY NAME SELECT * FROM _copy_batch')
                    finally:
                        dcon.unregister("_copy_batch")
                    n += batch.num_rows
                copied[table] = n
    return runs, copied


def columns(path: str | Path) -> dict[str, list[str]]:
    """Each run table's columns, in order."""
    with db.reading(path) as con:
        return {t: _columns(con, t) for t in _tables(con)}


def _columns(con, table: str) -> list[str]:
    return [c for (c,) in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = ? "
        "AND database_name = current_database() ORDER BY column_index", [table]).fetchall()]


def _floats(con, table: str) -> set[str]:
    return {c for (c,) in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = ? AND database_name = "
        "current_database() AND data_type IN ('DOUBLE', 'FLOAT')", [table]).fetchall()}


def digests(path: str | Path, run_ids: list[str] | None = None,
            only: dict[str, list[str]] | None = None) -> dict[str, tuple[int, str]]:
    """(row count, md5) per table of the store's rows of ``run_ids`` (default every run), over
    the columns ``only`` names per table (default all)."""
    out = {}
    with db.reading(path) as con:
        runs = _runs(con, run_ids, str(path))
        for table in _tables(con):
            cols = (only or {}).get(table) or _columns(con, table)
            # a struct's text quotes strings, so NULL and 'NULL' differ, and floats print
            # exactly (the shortest text that reads back to the same double)
            # exactly (the shortest text that reads back to the same double). A zero's sign is
            # left out: DuckDB's Parquet writer (a team store's files) stores 0.0 and -0.0 as one
            # dictionary value, equal as numbers, so + 0.0 makes both +0.0 on either side.
            floats = _floats(con, table)
            row = "CAST(struct_pack(" + ", ".join(
                f'"{c}" := "{c}"' + (" + 0.0" if c in floats else "") for c in cols
            ) + ") AS VARCHAR)"
            n, md5 = con.execute(
                f"SELECT count(*), coalesce(md5(string_agg(h, '' ORDER BY h)), '') FROM "
                f'(SELECT md5({row}) AS h FROM "{table}" WHERE run_id IN (SELECT unnest(?)))',
                [runs]).fetchone()
            out[table] = (int(n), md5)
    return out


def same_rows(a: str | Path, b: str | Path, run_ids: list[str] | None = None) -> list[str]:
    """The tables whose rows of ``run_ids`` differ between stores ``a`` and ``b`` (empty: equal),
    over the columns both have (a column the older store lacks reads NULL in the newer one). A
    table the older store lacks counts as empty there."""
    ca, cb = columns(a), columns(b)
    only = {t: [c for c in ca[t] if c in cb[t]] for t in ca if t in cb}
    da, db_ = digests(a, run_ids, only), digests(b, run_ids, only)
    empty = (0, "")
    return [t for t in sorted(set(da) | set(db_)) if da.get(t, empty) != db_.get(t, empty)]
