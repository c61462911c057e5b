"""Replay's pictures in a real headless Chromium (Debian's package through playwright): a
FrozenLake trajectory of the committed sample stores shows the lake before and after each turn as
images that load, and Replay's turn heading names the environment's own turn so that it agrees
with the observation's ``Turn k: State`` (stored turn t is the environment's turn t + 1, and its
observation is the state of turn t + 2).

Run alone: ``.venv/bin/python -m pytest -q tests/test_browser_replay_pictures.py``.
"""
from __future__ import annotations

import re
import urllib.parse

import pytest

from storage import queries
from tests.browser_harness import ROOT, browser_fixtures, scratch_dir, served_app
from tests.test_browser import no_exception, settle

pytestmark = pytest.mark.browser
STORES = ("sample_runs/branch_failures.duckdb", "sample_runs/spike_frozenlake.duckdb")


def _longest_lake_trajectory(store: str) -> tuple[str, int, str, int]:
    """(run, step, trajectory, turns) of the store's FrozenLake trajectory with most turns."""
    runs = queries.runs(str(ROOT / store))
    run = runs[runs["config"].map(lambda c: queries.run_config(c).get("env")) == "frozenlake"]
    run_id = run["run_id"].iloc[0]
    trajs = queries.trajectories(str(ROOT / store), run_id)
    best = trajs.sort_values(["num_turns", "traj_id"], ascending=[False, True]).iloc[0]
    return run_id, int(best["step"]), best["traj_id"], int(best["num_turns"])


@pytest.fixture(scope="module")
def server():
    base = scratch_dir("browser-replay-pictures")
    (ROOT / base / "runs").mkdir(parents=True)
    with served_app(base, ["sample_runs"], base / "runs") as url:
        yield url


browser, page = browser_fixtures(1280, 1000)


def _open(page, url: str, store: str, run: str, step: int, traj: str, turn: int) -> None:
    query = urllib.parse.urlencode({"store": store, "run": run, "step": step, "traj": traj,
                                    "turn": turn})
    page.goto(f"{url}/replay?{query}")
    page.get_by_role("heading", name="Replay", exact=True).first.wait_for(timeout=60_000)
    settle(page)
    page.get_by_text(re.compile(r"^Turn \d+ of \d+")).first.wait_for(timeout=30_000)


def _turn_view(page) -> dict:
    """What the turn shows: Replay's heading, the observation's label and text, the pictures."""
    heading = page.get_by_text(re.compile(r"^Turn \d+ of \d+")).first.inner_text()
    label = page.locator("[data-testid=stMarkdownContainer]").filter(
        has_text=re.compile(r"^Observation")).first.inner_text()
    # the first shown: the prompt's, folded in its expander, is not. Wait for it: under load the
    # observation's code block can render a moment after the heading
    code_block = page.locator("[data-testid=stMain] [data-testid=stCode]").filter(
        has_text=re.compile(r"Turn \d+: State:")).locator("visible=true").first
    code_block.wait_for(state="visible", timeout=30_000)
    code = code_block.inner_text()
    boards = page.locator("img.board")
    boards.first.wait_for(timeout=30_000)
    page.wait_for_function("() => [...document.querySelectorAll('img.board')]"
                           ".every(i => i.complete && i.naturalWidth > 0)", timeout=30_000)
    return {"heading": heading, "label": label, "code": code,
            "alts": [boards.nth(i).get_attribute("alt") for i in range(boards.count())]}


def _env_turn(text: str, pattern: str) -> int:
    return int(re.search(pattern, text).group(1))


@pytest.mark.parametrize("store", STORES)
def test_a_frozenlake_turn_shows_the_lake_and_numbers_agree_with_the_environment(page, server,
                                                                                   store):
    run, step, traj, n = _longest_lake_trajectory(store)
    assert n >= 2
    _open(page, server, store, run, step, traj, 0)
    for turn in range(min(n, 3)):
        view = _turn_view(page)
        assert view["heading"].startswith(f"Turn {turn} of {n}"), view
        # Replay's stored turn t is the environment's turn t + 1 ...
        assert _env_turn(view["heading"], r"the environment's turn (\d+)") == turn + 1
        # ... and its observation, headed 'Turn t + 2: State', is named as that turn's state
        shown = _env_turn(view["code"], r"Turn (\d+): State:")
        assert shown == turn + 2
        assert _env_turn(view["label"], r"the environment's turn (\d+) state") == shown
        # the lake before and after the action, each named by the environment's turn
        assert view["alts"] == [f"Before the action: the environment's turn {turn + 1} state",
                                f"After the action: the environment's turn {turn + 2} state"]
        if turn + 1 < min(n, 3):
            page.get_by_role("button", name="Next ▶").click()
            page.get_by_text(re.compile(rf"^Turn {turn + 1} of {n}")).first.wait_for(
                timeout=30_000)
            settle(page)
    no_exception(page)
    assert "the cells walked so far" in page.locator("[data-testid=stMain]").inner_text()


def test_an_apps_state_diff_reads_as_a_table_of_changed_fields(page, server):
    """The first update the apps sample store recorded: one table row per changed field, with
    its before and after, not a JSON tree."""
    import json

    from pages._states import DIFF_COLUMNS, diff_rows
    store = "sample_runs/apps_tiny.duckdb"
    for run_id in queries.runs(str(ROOT / store))["run_id"]:
        trajs = queries.trajectories(str(ROOT / store), run_id)
        turns = queries.turns(str(ROOT / store), run_id, trajs["traj_id"].tolist())
        hits = turns[turns["state_diff"].fillna("").str.contains('"op": "update"')]
        if not hits.empty:
            break
    hit = hits.iloc[0]
    step = int(trajs.set_index("traj_id").loc[hit["traj_id"], "step"])
    _open(page, server, store, run_id, step, hit["traj_id"], int(hit["turn"]))
    table = page.locator("table.state-table").first
    table.wait_for(timeout=30_000)
    assert [c.inner_text() for c in table.locator("th").all()] == DIFF_COLUMNS
    expected = diff_rows(json.loads(hit["state_diff"]))
    cells = table.locator("tbody tr").first.locator("td").all()
    first = expected[0]
    assert [c.inner_text() for c in cells][:4] == [first["table"], str(first["row"]),
                                                  first["change"], first["field"]]
    assert table.locator("tbody tr").count() == len(expected)
    no_exception(page)
