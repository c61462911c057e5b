"""Panels an imported run can never fill (issue 51, item 6) say why in one line instead of
drawing an empty panel: information gain (only this trainer measures it) and branch values (a
branch job needs the trainer's adapter snapshots), through AppTest on the demo store's
imported verl run; a trainer's run keeps its panels."""
from __future__ import annotations

import pytest

from tests.test_pages import app, demo  # noqa: F401  (fixtures)

PANELS = {"replay": ("Information gain", "Branches: which turn lost the reward?"),
          "groups": ("Where values fell (branch analyses)",),
          "dynamics": ("Information gain per turn",)}


@pytest.mark.parametrize("page", sorted(PANELS))
def test_an_import_gets_one_line_not_an_empty_panel(app, demo, page):  # noqa: F811
    at = app(page, store=demo[1], run=demo[2]["imported-verl"])
    assert not at.exception, at.exception
    heads = {h.value for h in at.subheader}
    assert not heads & set(PANELS[page]), heads
    lines = [cap.value for cap in at.caption if "recorded by" in cap.value
             and ("Information gain" in cap.value or "Branches" in cap.value
                  or "Where values fell" in cap.value)]
    assert len(lines) == len(PANELS[page]), lines     # once each, in one line
    assert not any("not computed yet" in i.value.lower() for i in at.info)


def test_a_trainer_run_keeps_its_information_gain_panel(app):  # noqa: F811
    """A run that recorded the gains (the committed shortcut run did) keeps its panels; one of
    this trainer's that has ended without any gets the one line (tests/test_info_gain.py)."""
    from pathlib import Path

    from storage import queries
    store = Path("sample_runs/shortcut.duckdb").resolve()
    run_id = queries.runs(str(store)).run_id.iloc[0]
    for page, head in (("replay", "Information gain"), ("dynamics", "Information gain per turn")):
        at = app(page, str(store.parent), store=str(store), run=run_id)
        assert not at.exception, at.exception
        assert head in {h.value for h in at.subheader}, page
