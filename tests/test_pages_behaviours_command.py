"""Dynamics' behaviours panel on a run without behaviour rows, through Streamlit's AppTest on a
committed sample store: the command it offers is copy-paste text (it showed markdown escapes,
``sample\\_runs``) and never writes into the committed store (it named that store as ``--db``)."""
from __future__ import annotations

import shlex

from pages._behaviours import behaviours_command
from tests.test_pages import ROOT, app, demo  # noqa: F401  (fixtures)

STORE = ROOT / "sample_runs" / "spike_frozenlake.duckdb"
RUN = "20261129-224034-6beb19"


def test_the_behaviours_command_is_plain_text_and_writes_a_copy(app):
    at = app("dynamics", store_dir=str(ROOT / "sample_runs"), store=str(STORE), run=RUN)
    assert not at.exception, at.exception
    command = [c.value for c in at.code if "agentrl behaviours" in c.value]
    assert command == [behaviours_command(str(STORE), RUN, committed=True)]
    assert "\\_" not in command[0]
    copy, compute = command[0].splitlines()
    db = shlex.split(compute)[shlex.split(compute).index("--db") + 1]
    assert db == "runs/spike_frozenlake.duckdb"                      # not the committed store
    assert shlex.split(copy)[-4:] == ["cp", "-n", str(STORE), db]
    assert any("committed sample run" in c.value for c in at.caption)


def test_a_store_of_ones_own_is_named_as_it_is():
    assert behaviours_command("runs/my store.duckdb", "r1", committed=False) == \
        "agentrl behaviours --db 'runs/my store.duckdb' --run r1"
