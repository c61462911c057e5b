"""Screenshots for the README, taken from the real app serving the real sample runs.

    .venv/bin/python docs/screenshots.py            -> docs/screenshots/*.png, deep links printed
    .venv/bin/python docs/screenshots.py a.png,b.png -> only those (links.md left as it is)

Serves ``app.py`` with ``streamlit run`` on a free local port (AGENTRL_STORE_DIRS=sample_runs),
drives headless Chromium through playwright (the browser test's machinery, tests/test_browser.py)
and opens each view by its deep link, so every picture is exactly what that link shows. The
links are printed (and written to docs/screenshots/links.md) for the README's walkthrough.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pages import _signals  # noqa: E402
from storage import queries  # noqa: E402
from tests.test_browser import (CHROMIUM, CHROMIUM_ARGS, _free_port, _wait_healthy,  # noqa: E402
                                settle, snap)

OUT = ROOT / "docs" / "screenshots"
STORES = "sample_runs"


def _store(name: str) -> str:
    return f"{STORES}/{name}"


def _runs(name: str):
    return queries.runs(str(ROOT / _store(name)))


def _wide(name: str, run_id: str):
    m = queries.metrics(str(ROOT / _store(name)), run_id)
    return m.pivot_table(index="step", columns="name", values="value")


def _finished(name: str) -> bool:
    """The store exists and all its runs ended (finished, or stopped on purpose; one still
    recording or failed is left out)."""
    if not (ROOT / _store(name)).exists():
        return False
    runs = _runs(name)
    return len(runs) > 0 and bool(runs["status"].isin(["finished", "stopped"]).all())


def views() -> list[tuple[str, str, str, dict]]:
    """(file name, page path, page title, query params) of each screenshot, from the stores."""
    out = []
    search = "search_smollm2.duckdb" if _finished("search_smollm2.duckdb") else None
    runs = _runs("collapse_bandit.duckdb")
    grpo = runs[runs["config"].map(lambda c: queries.run_config(c).get("algo")) == "grpo"]
    grpo = grpo["run_id"].iloc[0]  # the run that collapses
    out.append(("runs.png", "runs", "Runs", {"store": _store("collapse_bandit.duckdb"),
                                             "run": grpo}))
    # Replay's token view: the search run when it is recorded, else the apps run
    replay_store = search or "apps_tiny.duckdb"
    rid = _runs(replay_store)["run_id"].iloc[0]
    trajs = queries.trajectories(str(ROOT / _store(replay_store)), rid)
    if search:  # the last RL step's successful rollout with the most turns (trained tokens)
        rl = trajs[trajs["split"] == "train"]
        last = rl[rl["step"] == rl["step"].max()]
        pick = last[last["success"]].sort_values(["num_turns", "traj_id"],
                                                 ascending=[False, True]).iloc[0]
    else:
        rl = trajs[trajs["split"] == "train"]
        pick = rl[rl["num_turns"] == rl["num_turns"].max()].iloc[0]
    out.append(("replay-token-mask.png", "replay", "Replay",
                {"store": _store(replay_store), "run": rid, "step": int(pick["step"]),
                 "traj": pick["traj_id"], "turn": 0}))
    # Replay in the apps world: the careless agent's collateral-damage episode that passed the
    # most other tests (damage its only fault), on the turn whose write the damage test names
    apps = _runs("apps_tiny.duckdb")
    rid = apps[apps["source"] != "trainer"]["run_id"].iloc[0]
    trajs = queries.trajectories(str(ROOT / _store("apps_tiny.duckdb")), rid)
    bad = trajs[trajs["failure_class"] == "collateral_damage"].sort_values(
        ["reward", "step", "traj_id"], ascending=[False, True, True]).iloc[0]
    turns = queries.turns(str(ROOT / _store("apps_tiny.duckdb")), rid, [bad["traj_id"]])
    tests = queries.test_results(str(ROOT / _store("apps_tiny.duckdb")), rid, [bad["traj_id"]])
    named = tests[tests["name"] == "no_collateral_damage"]["detail"].iloc[0]  # "... emails#54"
    table, key = re.search(r"(\w+)#(\w+)", named).groups()
    hit = turns[turns["state_diff"].fillna("").map(
        lambda d: any(ch.get("table") == table and str(ch.get("key")) == key
                      for ch in (json.loads(d) if d.startswith("[") else [])))]
    out.append(("replay-apps-state-diff.png", "replay", "Replay",
                {"store": _store("apps_tiny.duckdb"), "run": rid, "step": int(bad["step"]),
                 "traj": bad["traj_id"], "turn": int(hit["turn"].iloc[0])}))
    # Groups on the credit-assignment run: a group whose rollouts disagree
    rid = _runs("credit_gigpo.duckdb")["run_id"].iloc[0]
    trajs = queries.trajectories(str(ROOT / _store("credit_gigpo.duckdb")), rid)
    rl = trajs[trajs["split"] == "train"]
    spread = rl.groupby(["step", "group_id"])["reward"].std().sort_values(ascending=False)
    (step, group), _ = next(iter(spread.items()))
    out.append(("groups-credit.png", "groups", "Groups",
                {"store": _store("credit_gigpo.duckdb"), "run": rid, "step": int(step),
                 "group": group}))
    # Dynamics with the collapse alarm: the GRPO run
    out.append(("dynamics-collapse-alarm.png", "dynamics", "Dynamics",
                {"store": _store("collapse_bandit.duckdb"), "run": grpo}))
    # Dynamics spike -> its trajectories
    rid = _runs("spike_frozenlake.duckdb")["run_id"].iloc[0]
    sp = _signals.spike_threshold(_wide("spike_frozenlake.duckdb", rid)["grad/norm"])
    spike = int(sp.index[sp["spike"]][0])
    out.append(("dynamics-spike-trajectories.png", "dynamics", "Dynamics",
                {"store": _store("spike_frozenlake.duckdb"), "run": rid, "spike": spike}))
    # Failures with classes: the careless agent in the apps world
    rid = apps[apps["source"] != "trainer"]["run_id"].iloc[0]
    out.append(("failures-apps.png", "failures", "Failures",
                {"store": _store("apps_tiny.duckdb"), "run": rid}))
    out.append(("failures-imported.png", "failures", "Failures",
                {"store": _store("imported_greedy_lake.duckdb"), "run": "greedy-lake"}))
    out.append(("train.png", "train", "Train", {}))
    if _finished("branch_failures.duckdb"):
        # Replay's Branches panel on the FrozenLake trajectory that fell into a hole, picked by
        # the rule make.sh branched it by, shown at its hole turn
        run_id, traj_id = _pick_failure().pick(str(ROOT / _store("branch_failures.duckdb")),
                                               "frozenlake-branch", "hole")
        traj = queries.trajectory(str(ROOT / _store("branch_failures.duckdb")), run_id, traj_id)
        out.append(("replay-branches.png", "replay", "Replay",
                    {"store": _store("branch_failures.duckdb"), "run": run_id,
                     "step": int(traj["step"]), "traj": traj_id,
                     "turn": int(traj["num_turns"]) - 1}))
        # the same fall as pictures: the lake before and after the turn, with the path walked
        out.append(("replay-frozenlake-board.png", "replay", "Replay",
                    {"store": _store("branch_failures.duckdb"), "run": run_id,
                     "step": int(traj["step"]), "traj": traj_id,
                     "turn": int(traj["num_turns"]) - 1}))
    if search:
        # Failure clusters and checkpoint A vs B on the search run (SFT, then 10 GRPO steps)
        rid = _runs(search)["run_id"].iloc[0]
        out.append(("failures-clusters.png", "failures", "Failures",
                    {"store": _store(search), "run": rid}))
        out.append(("compare-search.png", "compare", "Compare",
                    {"store": _store(search), "run": rid, "a": f"{rid}:20", "b": f"{rid}:30",
                     "task": "capital>mayor:Giakrohae"}))
    return out


def _pick_failure():
    """sample_runs/pick_failure.py (a script, not a package module)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("pick_failure",
                                                  ROOT / "sample_runs" / "pick_failure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    from playwright.sync_api import sync_playwright
    OUT.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = dict(os.environ, AGENTRL_STORE_DIRS=STORES, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false",
               AGENTRL_RUNS_DIR="tmp/screenshot-runs")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
         "--server.headless", "true", "--server.address", "127.0.0.1",
         "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url, links = f"http://127.0.0.1:{port}", []
    try:
        _wait_healthy(url, proc)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            ctx = browser.new_context(viewport={"width": 1400, "height": 1800})
            page = ctx.new_page()
            only = set(sys.argv[1].split(",")) if len(sys.argv) > 1 else None
            for name, path, title, params in views():
                if only and name not in only:
                    continue
                query = urllib.parse.urlencode(params)
                page.goto(f"{url}/{path}" + (f"?{query}" if query else ""))
                page.get_by_role("heading", name=title, exact=True).first.wait_for(timeout=90_000)
                settle(page)
                errors = page.locator('[data-testid="stException"]')
                if errors.count():
                    raise RuntimeError(f"{name}: the page shows an exception: "
                                       f"{errors.first.inner_text()[:500]}")
                _focus(page, name)
                snap(page, OUT / name)
                link = f"/{path}" + (f"?{query}" if query else "")
                links.append((name, link))
                print(f"{name}: http://127.0.0.1:8501{link}")
            browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    if len(sys.argv) > 1:  # a subset: links.md keeps every screenshot's link
        return 0
    (OUT / "links.md").write_text(
        "Deep links of the screenshots (app served by `make run` at http://127.0.0.1:8501):\n\n"
        + "".join(f"- `{name}`: http://127.0.0.1:8501{link}\n" for name, link in links))
    return 0


def _focus(page, name: str) -> None:
    """Scroll to the part of the page a screenshot is about."""
    heading = {"replay-token-mask.png": "Tokens",
               "dynamics-spike-trajectories.png": "Gradient norm and spikes",
               "groups-credit.png": "Credit: stored advantage vs. what each estimator would give",
               "failures-clusters.png": "Clusters of similar failures",
               "replay-branches.png": "Branches: which turn lost the reward?",
               "replay-frozenlake-board.png": "Turns",
               }.get(name)
    if heading:
        page.get_by_role("heading", name=heading).first.evaluate(
            "e => e.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(500)


if __name__ == "__main__":
    sys.exit(main())
