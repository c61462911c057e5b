"""Imported runs in Compare and out as training data, in a real headless Chromium (issues #51.3
and #50.2): a verl output folder imported whole gives its validation dumps split eval, so Compare
pairs two of its steps on shared tasks and says what it pairs; the Failures page's "Export
messages (SFT)" downloads the filtered trajectories as a chat dataset.

Run alone: ``.venv/bin/python -m pytest -q tests/test_browser_compare_imports.py``.
"""
from __future__ import annotations

import json
import re
import urllib.parse

import pytest

from storage.io import main
from tests.browser_harness import ROOT, browser_fixtures, scratch_dir, served_app
from tests.test_browser import no_exception, settle

pytestmark = pytest.mark.browser
RUN = "verl-outputs"
SOLVED = {1: [1, 0, 0, 1], 2: [1, 1, 0, 0]}  # per validation step, question k scored 1 or 0:
# from step 1 to 2, question 1 is gained, 3 lost, 0 kept, 2 unsolved


def _dump(folder, step: int, scores: list[int]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{step}.jsonl").write_text("".join(json.dumps(
        {"input": f"question {k}?", "output": f"<answer>a{k}</answer>", "gts": [f"a{k}"],
         "score": float(s), "step": step}) + "\n" for k, s in enumerate(scores)))


@pytest.fixture(scope="module")
def server():
    """(base URL, store) of an app serving one store: verl's rollout and validation dumps
    (trainer.rollout_data_dir, trainer.validation_data_dir under one outputs folder) imported."""
    base = scratch_dir("browser-compare-imports")
    stores, runs = base / "stores", base / "runs"
    (ROOT / runs / "logs").mkdir(parents=True)
    outputs = ROOT / base / "outputs"
    for step, scores in SOLVED.items():
        _dump(outputs / "rollout", step, [0, 1, 1, 0])
        _dump(outputs / "validation", step, scores)
    store = stores / "verl.duckdb"
    (ROOT / stores).mkdir(parents=True)
    assert main(["import", str(outputs), "--db", str(ROOT / store), "--format", "verl",
                 "--run-id", RUN]) == 0
    with served_app(base, [stores], runs) as url:
        yield url, str(store)


browser, page = browser_fixtures(1400, 900)


def _open(page, server, path: str, title: str, **params) -> None:
    url, store = server
    page.goto(f"{url}/{path}?" + urllib.parse.urlencode({"store": store, "run": RUN, **params}))
    page.get_by_role("heading", name=title, exact=True).first.wait_for(timeout=60_000)
    settle(page)


def _metric(page, label: str) -> str:
    box = page.locator('[data-testid="stMetric"]').filter(has_text=label).first
    return box.locator('[data-testid="stMetricValue"]').inner_text()


def test_compare_pairs_two_validation_steps_of_an_imported_run(page, server):
    _open(page, server, "compare", "Compare")
    page.get_by_text(re.compile(r"^What is compared")).wait_for(timeout=60_000)
    said = page.get_by_text(re.compile(r"^What is compared")).inner_text()
    assert "split 'eval'" in said and "paired on task id: 4 in both, 0 only in A, 0 only in B" \
        in said, said
    assert "One run at two steps: B (step 2) is 1 steps after A (step 1)" in \
        page.locator("[data-testid=stMain]").inner_text()
    assert _metric(page, "solved in A") == "2 / 4" and _metric(page, "solved in B") == "2 / 4"
    assert _metric(page, "gained") == "1" and _metric(page, "lost") == "1"
    no_exception(page)


def test_failures_exports_the_filtered_trajectories_as_messages_for_sft(page, server):
    _open(page, server, "failures", "Failures", classes="success", outcome="solved")
    note = page.get_by_text(re.compile(r"^\d+ trajectories match")).first
    note.wait_for(timeout=60_000)
    shown = int(note.inner_text().split()[0])
    assert shown == 8  # 4 of 8 rollouts and 4 of 8 validation samples scored 1
    with page.expect_download(timeout=60_000) as got:
        page.get_by_role("button", name="Export messages (SFT)").click()
    lines = [json.loads(x) for x in open(got.value.path(), encoding="utf-8").read().splitlines()]
    assert len(lines) == shown and all(line["success"] for line in lines)
    assert {m["role"] for line in lines for m in line["messages"]} == {"user", "assistant"}
    assert {line["split"] for line in lines} == {"train", "eval"}
    no_exception(page)
