"""Checkpoint A vs B: how two held-out evaluations differ, task by task. Torch-free, pandas only.

An *evaluation* is one (run, step) of trajectories with split 'eval' (``imported_train``: also
the split 'train' steps of an imported run that has no 'eval' split, so two imported runs, or
two steps of one, pair on the task ids they share). Two evaluations are compared
on what they share: a task is keyed by (task_id, episode seed) when the seed was recorded
(``info.episode_seed``), else by task_id alone. With several rollouts of one key, the key counts
as solved when at least half of them succeeded, and its other columns are the first rollout's.

* ``pair``: one row per key with solved in A / in B, the change (gained, lost, kept, unsolved),
  each side's failure class and trajectory.
* ``coverage``: whether the two used the same tasks and seeds (keys only in A, only in B, tasks
  whose seeds differ).
* ``transitions``: failure class in A x failure class in B over the paired keys.
* ``first_divergence``: the first turn where two trajectories' actions (or what came back) differ.
* ``aggregates``: per evaluation, turns used, tool calls per task, answer length, repeated
  actions; the shift is B - A.
* ``sign_test``: the two-sided sign test p-value of gained vs lost.
"""
from __future__ import annotations

from math import comb
from pathlib import Path

import pandas as pd

from storage import db
from storage.migrations import check_version

TOOL_ACTIONS = ("search", "tool", "code", "docs", "api")  # core.credit.rewards.TOOL_ACTIONS
CHANGES = ("gained", "lost", "kept", "unsolved")


# -- reads -----------------------------------------------------------------------------------------
def _compared(alias: str, imported_train: bool) -> str:
    """The SQL condition on trajectories ``alias`` that makes them an evaluation's."""
    if not imported_train:
        return f"{alias}.split = 'eval'"
    return (f"({alias}.split = 'eval' OR ({alias}.split = 'train' AND {alias}.run_id IN "
            "(SELECT run_id FROM runs WHERE starts_with(coalesce(source, ''), 'import')) AND "
            f"{alias}.run_id NOT IN (SELECT run_id FROM trajectories WHERE split = 'eval')))")


def evaluations(path: str | Path, imported_train: bool = False) -> pd.DataFrame:
    """Every evaluation in the store: run_id, name, step, split, trajectories, tasks, solved
    (rate)."""
    with db.reading(path) as con:
        if check_version(con, where=str(path)) == 0:
            raise db.StoreError(f"{path} is not a store of this project (no schema recorded)")
        return con.execute(f"""
            SELECT t.run_id, any_value(r.name) AS name, t.step, any_value(t.split) AS split,
                   count(*) AS trajectories, count(DISTINCT t.task_id) AS tasks,
                   avg(CASE WHEN t.success THEN 1.0 ELSE 0.0 END) AS solved
            FROM trajectories t LEFT JOIN runs r ON r.run_id = t.run_id
            WHERE {_compared("t", imported_train)}
            GROUP BY t.run_id, t.step ORDER BY any_value(r.created_at), t.run_id, t.step""").df()


def read_evaluation_pair(path: str | Path, a: tuple[str, int], b: tuple[str, int],
                         imported_train: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(trajectories, turns) of evaluations ``a`` and ``b`` = (run_id, step), in one open.

    trajectories: side ('A'/'B'), run_id, step, traj_id, task_id, seed, success, failure_class,
    num_turns, answer, finish_reason; turns: side, traj_id, turn, action, observation,
    action_type, action_valid."""
    frames, turn_frames, compared = [], [], _compared("t", imported_train)
    with db.reading(path) as con:
        if check_version(con, where=str(path)) == 0:
            raise db.StoreError(f"{path} is not a store of this project (no schema recorded)")
        for side, (run_id, step) in (("A", a), ("B", b)):
            traj = con.execute(f"""
                SELECT ? AS side, run_id, step, traj_id, task_id,
                       json_extract_string(info, '$.episode_seed') AS seed,
                       coalesce(success, false) AS success,
                       coalesce(failure_class, CASE WHEN success THEN 'success'
                                ELSE 'unclassified' END) AS failure_class,
                       num_turns, answer, finish_reason
                FROM trajectories t WHERE run_id = ? AND step = ? AND {compared}
                ORDER BY task_id, traj_id""", [side, run_id, int(step)]).df()
            turns = con.execute(f"""
                SELECT ? AS side, u.traj_id, u.turn, u.action, u.observation, u.action_type,
                       u.action_valid
                FROM turns u JOIN trajectories t ON t.run_id = u.run_id AND t.traj_id = u.traj_id
                WHERE u.run_id = ? AND t.step = ? AND {compared}
                ORDER BY u.traj_id, u.turn""", [side, run_id, int(step)]).df()
            frames.append(traj)
            turn_frames.append(turns)
    return pd.concat(frames, ignore_index=True), pd.concat(turn_frames, ignore_index=True)


# -- pure functions --------------------------------------------------------------------------------
def _keyed(traj: pd.DataFrame, use_seed: bool) -> pd.DataFrame:
    """One row per key: solved = mean(success) >= 0.5; the first rollout's class and id."""
    t = traj.assign(key=traj["task_id"].astype(str)
                    + (("#" + traj["seed"].fillna("").astype(str)) if use_seed else ""))
    grouped = t.groupby("key", sort=True)
    out = grouped.first()[["task_id", "seed", "traj_id", "step", "failure_class", "num_turns"]]
    out["solved"] = grouped["success"].mean() >= 0.5
    out["rollouts"] = grouped.size()
    return out


def pair(traj: pd.DataFrame) -> pd.DataFrame:
    """Per shared key: task_id, seed, solved_a, solved_b, change, class_a, class_b, traj_a,
    traj_b, step_a, step_b. ``traj`` holds both sides (column ``side``)."""
    use_seed = traj["seed"].notna().all()
    a = _keyed(traj[traj["side"] == "A"], use_seed)
    b = _keyed(traj[traj["side"] == "B"], use_seed)
    both = a.add_suffix("_a").join(b.add_suffix("_b"), how="inner")
    change = pd.Series("unsolved", index=both.index)
    change[both["solved_a"] & both["solved_b"]] = "kept"
    change[~both["solved_a"] & both["solved_b"]] = "gained"
    change[both["solved_a"] & ~both["solved_b"]] = "lost"
    out = pd.DataFrame({"task_id": both["task_id_a"], "seed": both["seed_a"],
                        "solved_a": both["solved_a"], "solved_b": both["solved_b"],
                        "change": change, "class_a": both["failure_class_a"],
                        "class_b": both["failure_class_b"], "traj_a": both["traj_id_a"],
                        "traj_b": both["traj_id_b"], "step_a": both["step_a"],
                        "step_b": both["step_b"]})
    order = {c: i for i, c in enumerate(CHANGES)}
    return out.sort_values(["change", "task_id"], key=lambda s: s.map(order) if s.name ==
                           "change" else s).reset_index(drop=True)


def coverage(traj: pd.DataFrame) -> dict:
    """Did A and B use the same tasks and seeds? Counts of tasks in each, shared keys, keys
    only in A / only in B, tasks whose seeds differ, and ``same`` (True when nothing differs)."""
    use_seed = traj["seed"].notna().all()
    keys = {s: set(_keyed(traj[traj["side"] == s], use_seed).index) for s in "AB"}
    tasks = {s: set(traj.loc[traj["side"] == s, "task_id"]) for s in "AB"}
    seeds_differ = 0
    if use_seed:
        seeds = {s: traj[traj["side"] == s].groupby("task_id")["seed"].agg(frozenset)
                 for s in "AB"}
        shared_tasks = tasks["A"] & tasks["B"]
        seeds_differ = sum(seeds["A"][t] != seeds["B"][t] for t in shared_tasks)
    only_a, only_b = len(keys["A"] - keys["B"]), len(keys["B"] - keys["A"])
    return {"keys_a": len(keys["A"]), "keys_b": len(keys["B"]),
            "shared": len(keys["A"] & keys["B"]), "only_a": only_a, "only_b": only_b,
            "seeds_differ": int(seeds_differ), "seeded": bool(use_seed),
            "same": only_a == 0 and only_b == 0 and seeds_differ == 0}


def transitions(paired: pd.DataFrame) -> pd.DataFrame:
    """Failure class in A (rows) x failure class in B (columns): how many paired tasks moved
    from each class to each other ('success' is a class)."""
    if paired.empty:
        return pd.DataFrame()
    return pd.crosstab(paired["class_a"], paired["class_b"]).rename_axis(
        index="class in A", columns="class in B")


def first_divergence(turns_a: pd.DataFrame, turns_b: pd.DataFrame) -> int | None:
    """The first turn index where the two trajectories differ: different action text, a
    different observation after the same action, or one ended while the other went on. None
    when they are identical turn for turn."""
    a = turns_a.sort_values("turn").reset_index(drop=True)
    b = turns_b.sort_values("turn").reset_index(drop=True)
    for i in range(min(len(a), len(b))):
        if str(a.at[i, "action"]) != str(b.at[i, "action"]) or \
                str(a.at[i, "observation"]) != str(b.at[i, "observation"]):
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def repeated_actions(actions: list) -> int:
    """Turns whose action text already occurred earlier in the same trajectory."""
    seen, repeats = set(), 0
    for action in actions:
        text = " ".join(str(action).split())
        repeats += text in seen
        seen.add(text)
    return repeats


def aggregates(traj: pd.DataFrame, turns: pd.DataFrame) -> pd.DataFrame:
    """Per side, means over its trajectories: solved, turns used, tool calls per task (named
    "searches per task" when every call of both sides is a search), answer length (characters),
    repeated actions; and the shift B - A. One row per measure."""
    called = set(turns["action_type"].dropna()) & set(TOOL_ACTIONS)
    calls = "searches per task" if called == {"search"} else "tool calls per task"
    rows = {}
    for side in "AB":
        t = traj[traj["side"] == side]
        u = turns[turns["side"] == side]
        per = u.groupby("traj_id")
        tools = per["action_type"].agg(lambda s: int(s.isin(TOOL_ACTIONS).sum()))
        repeats = per["action"].agg(lambda s: repeated_actions(list(s)))
        ids = t["traj_id"]
        rows[side] = {
            "solved (fraction)": t["success"].mean(),
            "turns used": t["num_turns"].mean(),
            calls: tools.reindex(ids, fill_value=0).mean(),
            "answer length (characters)": t["answer"].fillna("").astype(str).str.len().mean(),
            "repeated actions per task": repeats.reindex(ids, fill_value=0).mean(),
            "tasks with a repeated action": (repeats.reindex(ids, fill_value=0) > 0).mean(),
        }
    out = pd.DataFrame(rows).rename_axis("measure").reset_index()
    out["shift (B - A)"] = out["B"] - out["A"]
    return out


def sign_test(gained: int, lost: int) -> float:
    """Two-sided exact sign test: p = min(1, 2 * sum_{i <= min(g, l)} C(n, i) / 2^n), n = g + l;
    1.0 when nothing changed."""
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(comb(n, i) for i in range(min(gained, lost) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def diff(path: str | Path, a: tuple[str, int], b: tuple[str, int],
         imported_train: bool = False) -> dict:
    """Everything the Compare page shows for evaluations ``a`` and ``b`` = (run_id, step)."""
    traj, turns = read_evaluation_pair(path, a, b, imported_train)
    if traj[traj["side"] == "A"].empty or traj[traj["side"] == "B"].empty:
        missing = [f"{r} step {s}" for side, (r, s) in (("A", a), ("B", b))
                   if traj[traj["side"] == side].empty]
        raise ValueError("no evaluation at " + " and ".join(missing))
    paired = pair(traj)
    counts = paired["change"].value_counts().reindex(list(CHANGES), fill_value=0)
    return {"paired": paired, "coverage": coverage(traj), "transitions": transitions(paired),
            "aggregates": aggregates(traj, turns), "turns": turns,
            "counts": {k: int(v) for k, v in counts.items()},
            "p_value": sign_test(int(counts["gained"]), int(counts["lost"])),
            "solved": {s: int(paired[f"solved_{s.lower()}"].sum()) for s in "AB"}}
