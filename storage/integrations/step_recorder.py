"""What the trainer-side recorders (verl's batch, SkyRL's generator output) share: a run of
their own in a store, each step's generic records (storage/interchange.py) validated and written
in bounded batches (storage/ingest/feed.py), the run ``running`` until ``close()``."""
from __future__ import annotations

import time
from typing import Any, Iterable, Iterator

from storage.ingest.door import convert, failure
from storage.ingest.feed import write_records
from storage.ingest.import_batch import finish_import, finish_in, refuse_foreign, run_source
from storage.ingest.report import ImportReport
from storage.migrations import prepare
from storage.recorder import check_run_id


STEP_BATCH_RECORDS = 4096
"""Rollouts a step writes in one transaction: a step arrives in memory whole, so its batches are
bounded by their token rows and text (storage/token_rows.py ``BatchSize``, 500k rows) rather
than by a count of records; each transaction costs a commit and a checkpoint (a 256 x 1,500-token
verl step in two transactions, 200 + 56 rollouts: 1.13 s; in one: 0.96 s)."""


class StepRecorder:
    """Writes each step's records into ``run_id`` of the store at ``db_path`` (default id
    ``{fmt}-{date}-{time}``); the source the store records is ``import:{fmt}``."""

    def __init__(self, db_path, fmt: str, run_id: str | None = None, run_name: str | None = None,
                 config: dict | None = None):
        self.db, self.fmt = db_path, fmt
        self.run_id = check_run_id(run_id) if run_id else time.strftime(f"{fmt}-%Y%m%d-%H%M%S")
        prepare(db_path)
        refuse_foreign(self.run_id, run_source(db_path, self.run_id))  # never a trainer's run
        self.run = {"name": run_name or self.run_id, "config": config, "created": False}

    def write(self, records: Iterable[Any], step: int) -> ImportReport:
        """Write one step's records (each a record, or a function of no arguments making one);
        a record whose making raises anything, or that fails validation, fails alone, in the
        report's errors, and the trainer goes on (storage/ingest/door.py). Returns what was
        written."""
        report = ImportReport(self.run_id, f"step {step}", self.fmt)
        steps: set[int] = set()

        def finish(con, counts):  # in the step's last transaction (only its steps derived)
            finish_in(con, self.run_id, self.fmt, self.run, report, live=True,
                      steps=sorted(steps), counts=counts)
        if not write_records(_items(records, step, steps), self.db, self.fmt, self.run_id,
                             self.run, report, records=STEP_BATCH_RECORDS, then=finish):
            finish_import(self.db, self.run_id, self.fmt, self.run, report, live=True,
                          steps=sorted(steps))
        return report

    def close(self) -> None:
        """Mark the run finished (it stays ``running`` while steps come in)."""
        finish_import(self.db, self.run_id, self.fmt, self.run,
                      ImportReport(self.run_id, "end of training", self.fmt))


def _items(records: Iterable[Any], step: int, steps: set[int]
           ) -> Iterator[tuple[str, Any, int]]:
    """(where, record or LineError, 0) of each of a step's records, each made under the
    framework's guard, the steps they give added to ``steps``; a step whose records cannot even
    be listed (a field missing from the trainer's output) is one error, said, never raised into
    the trainer."""
    where = f"step {step}"
    try:
        for i, make in enumerate(records):
            for at, rec in convert(f"{where} sample {i}", make if callable(make)
                                   else (lambda rec=make: rec)):
                if isinstance(rec, dict) and type(rec.get("step", 0)) is int:
                    steps.add(rec.get("step", 0))
                yield at, rec, 0
    except Exception as exc:
        yield where, failure(exc), 0
