"""Groups' IGPO table: the turn advantages IGPO's released trainer would give one group, computed
from its stored information gains (pages/_credit.py igpo_table), on hand-worked numbers and on the
walkthrough's step-13 group (sample_runs/search_credit.duckdb)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from pages import _credit
from tests.test_pages import app, demo  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "sample_runs" / "search_credit.duckdb"
RUN = "20261201-022035-e5eaa1"


def test_igpo_table_on_hand_worked_numbers():
    """Two rollouts: gains 0.5 and 0.1 (mean 0.3, population std 0.2 -> z +1, -1), outcomes 1 and
    0 (z +1, -1). gamma 1: A = r_0 + r_1 = +2 / -2 on the first turn, +1 / -1 on the last;
    gamma 0: each turn its own, +1 / -1. A third rollout of one turn has no gain: its only turn
    carries its outcome's z alone, and a gain left unrecorded gets no gain reward."""
    trajs = pd.DataFrame({"traj_id": ["a", "b"], "reward": [1.0, 0.0], "num_turns": [2, 2]})
    gains = pd.DataFrame({"traj_id": ["a", "b"], "turn": [0, 0], "value": [0.5, 0.1]})
    table = _credit.igpo_table(trajs, gains).round(4)
    assert table["A, γ = 1"].tolist() == [2.0, 1.0, -2.0, -1.0]
    assert table["A, γ = 0"].tolist() == [1.0, 1.0, -1.0, -1.0]
    assert table["gain"].tolist()[::2] == [0.5, 0.1]
    # b's gain unrecorded: it gets r = 0 there, and a's gain is z-scored alone (std 1: centred to 0)
    table = _credit.igpo_table(trajs, gains[gains["traj_id"] == "a"]).round(4)
    assert table["A, γ = 0"].tolist() == [0.0, 1.0, 0.0, -1.0]


@pytest.mark.skipif(not STORE.exists(), reason="sample_runs/search_credit.duckdb not recorded")
def test_groups_shows_igpo_for_the_walkthrough_group(app):
    at = app("groups", store_dir=str(ROOT / "sample_runs"), store=str(STORE), run=RUN, step=63,
             group="s63-g2")
    assert not at.exception, at.exception
    (table,) = [f.value for f in at.dataframe if "A, γ = 1" in f.value.columns]
    by = table.set_index(["traj_id", "turn"])
    assert round(by.loc[("s63-g2-r1", 1), "A, γ = 1"], 2) == 3.11
    assert round(by.loc[("s63-g2-r1", 1), "stored turn advantage"], 2) == 2.95
    assert len(table) == 21                    # every turn of the 8 rollouts (five of 3 turns, three of 2)
    assert any("did not train on it" in m.value for m in at.markdown)
