"""Compare: checkpoint A vs B on held-out tasks -- solved in A / in B, gained and lost tasks with
their failure classes before and after, the first turn where a task's two trajectories diverge,
and aggregate shifts. Everything is computed in storage/evaldiff.py; this page only draws it.

Deep link: ``/compare?store=S&run=R&a=RUN_A:STEP_A&b=RUN_B:STEP_B&task=TASK_ID``.
"""
from __future__ import annotations

from urllib.parse import urlencode

import streamlit as st

from pages import _common as c
from pages import _terms
from pages import _evaljob
from storage import queries

c.ensure_app()
CLASS_WIDTH = 215  # px: the longest class name (wrong_answer_without_evidence) whole


@st.cache_data(ttl=c.RUN_TTL_S * 6, max_entries=c.MAX_ENTRIES, show_spinner=False)
def load_evaluations(store: str, imported_train: bool = False):
    return queries.evaluations(store, imported_train)


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def load_diff(store: str, a: str, b: str, imported_train: bool = False):
    return queries.eval_diff(store, _parse(a), _parse(b), imported_train)


def _forget() -> None:
    """A cross-evaluation job ended: its new run and evaluation must show."""
    load_evaluations.clear()
    c.run_table.clear()


def _parse(option: str) -> tuple[str, int]:
    run_id, step = option.rsplit(":", 1)
    return run_id, int(step)


def _replay(store: str, run_id: str, step: int, traj_id: str, turn: int | None = None) -> str:
    params = {"store": store, "run": run_id, "step": int(step), "traj": traj_id}
    return "replay?" + urlencode(params | ({"turn": int(turn)} if turn is not None else {}))


def _relation(a: str, b: str) -> str:
    """What the pair is: one run before and after training, or two runs side by side."""
    (run_a, step_a), (run_b, step_b) = _parse(a), _parse(b)
    if run_a == run_b:
        order = "after" if step_b > step_a else "before"
        return (f"One run at two steps: B (step {step_b}) is {abs(step_b - step_a)} steps {order} "
                f"A (step {step_a}). Gained: solved at B's step and not at A's.")
    return ("Two runs side by side (two checkpoints, agents or models on the same tasks): "
            "gained means solved by B and not by A, lost the reverse.")


pick = c.picked()
_terms.title("Compare", "compare")
st.caption("Two held-out evaluations side by side: tasks gained and lost, how failures changed, "
           "where the trajectories first diverge.")
evals = c.read_or_stop(load_evaluations, pick.store)
# Imported runs without an eval split (every import but Inspect's, unless marked --split eval):
# their train steps can be paired too, on the task ids two runs (or two steps) share.
wider = c.read_or_stop(load_evaluations, pick.store, True)
train_only = {f"{r.run_id}:{int(r.step)}" for r in wider.itertuples() if r.split != "eval"}
train_too = False
if train_only:
    linked = any(st.query_params.get(p) in train_only for p in ("a", "b"))
    train_too = st.toggle("Imported runs' train splits too", value=linked, key="cmp_train",
                          help="Lists the steps of imported runs that hold no eval split, to "
                               "pair two imported runs (two agents or models on the same "
                               "prompts) or two steps of one on the task ids they share. A "
                               "trainer's train steps sample new tasks each step: they seldom "
                               "share any.")
    if train_too:
        evals = wider
if evals.empty:
    c.stop("No held-out evaluation in this store: runs evaluate with `--eval-every N` (trajectories "
           "of split 'eval'), and Compare sets two of them side by side. An imported run has "
           "one when it is imported with `--split eval` (`agentrl import FILE --db STORE --split "
           "eval`; verl's `validation_data_dir` folders and Inspect logs are eval by themselves): "
           "two runs, or two steps of one, are then paired on the task ids they share"
           + (", or switch on \"Imported runs' train splits too\" above." if train_only else "."))
names = {}
for r in evals.itertuples():
    label = f"{c.text_of(r.name) or r.run_id} · {r.run_id[-6:]} · step {int(r.step)}" + (
        " · train split" if r.split != "eval" else "")
    names[f"{r.run_id}:{int(r.step)}"] = f"{label} · {r.solved:.0%} solved of {int(r.tasks)} tasks"
options = list(names)
# Defaults: the sidebar run's first and last evaluations; a run evaluated once is compared with
# the store's latest other evaluation.
own = [o for o in options if _parse(o)[0] == pick.run_id] or options[:1]
others = [o for o in options if o != own[0]]
left, right = st.columns(2)
# Plain "A" and "B": two steps of one run are before and after, but two imported logs (two
# agents or models on the same samples) are not, and the caption below says which it is.
a = c.url_select("A", options, key="cmp_a", param="a",
                 default=own[0], container=left, format_func=names.__getitem__)
b = c.url_select("B", options, key="cmp_b", param="b",
                 default=own[-1] if len(own) > 1 else (others or own)[-1], container=right,
                 format_func=names.__getitem__)
if a == b:
    c.stop("A and B are the same evaluation: pick two." if len(options) > 1 else
           "This store holds one evaluation only: Compare needs two.")
st.caption(_relation(a, b))
try:
    d = load_diff(pick.store, a, b, train_too)
except ValueError as exc:
    c.stop(str(exc))
(run_a, step_a), (run_b, step_b) = _parse(a), _parse(b)
cov, counts, paired = d["coverage"], d["counts"], d["paired"]
key = "task id and episode seed" if cov["seeded"] else "task id"
splits = " and ".join(dict.fromkeys(f"'{'train' if o in train_only else 'eval'}'" for o in (a, b)))
st.caption(f"What is compared: the trajectories of split {splits} of A and of B, paired "
           f"on {key}: {cov['shared']} in both, {cov['only_a']} only in A, {cov['only_b']} only "
           "in B. A key with several rollouts counts as solved when at least half succeeded.",
           help="An imported run's task id is the source's own (Inspect's sample id, a line's "
                "task_id), else a hash of its prompt: two runs on the same prompts pair.")

# -- same tasks? -----------------------------------------------------------------------------------
if not cov["same"]:
    st.warning(
        f"A and B did not use the same held-out tasks and seeds: {cov['only_a']} only in A, "
        f"{cov['only_b']} only in B" + (f", {cov['seeds_differ']} tasks with other seeds"
                                         if cov["seeds_differ"] else "")
        + f". The comparison below covers the {cov['shared']} they share. To compare on one "
          "task set, evaluate one side's checkpoint on the other side's tasks and seeds:")
    _evaljob.panel(pick.store, pick.run_id, (run_a, step_a), (run_b, step_b),
                  on_done=_forget)
if paired.empty:
    c.stop("A and B share no task: nothing to compare.")

# -- the headline ----------------------------------------------------------------------------------
m = st.columns(5)
m[0].metric("solved in A", f"{d['solved']['A']} / {len(paired)}")
m[1].metric("solved in B", f"{d['solved']['B']} / {len(paired)}",
            delta=d["solved"]["B"] - d["solved"]["A"])
m[2].metric("gained", counts["gained"])
m[3].metric("lost", counts["lost"])
m[4].metric("sign test p", f"{d['p_value']:.2g}",
            help="Two-sided exact sign test of gained vs lost tasks (ties left out).")
st.caption(f"Paired on task and episode seed: {counts['gained']} gained, {counts['lost']} lost, "
           f"{counts['kept']} solved in both, {counts['unsolved']} in neither."
           if cov["seeded"] else "Paired on task id (no episode seeds recorded).")

# -- transitions -----------------------------------------------------------------------------------
st.subheader("Failure class in A and in B")
st.caption("Rows: the class of a task's trajectory in A; columns: in B. 'success' is a class, "
           "so the 'success' column holds the gained tasks and the 'success' row the lost ones.")
st.dataframe(d["transitions"], key="cmp_transitions")

changed = paired[paired["change"].isin(["gained", "lost"])].copy()
st.subheader(f"Gained and lost tasks ({len(changed)})")
table = paired.assign(
    replay_a=[_replay(pick.store, run_a, s, t) for s, t in zip(paired["step_a"], paired["traj_a"])],
    replay_b=[_replay(pick.store, run_b, s, t) for s, t in zip(paired["step_b"], paired["traj_b"])])
show_all = st.toggle("Show every paired task", key="cmp_all")
shown = table if show_all else table[table["change"].isin(["gained", "lost"])]
st.dataframe(shown, key="cmp_tasks", hide_index=True,
             column_order=["change", "task_id", "class_a", "class_b", "replay_a", "replay_b",
                           "seed"],
             column_config={"class_a": st.column_config.TextColumn("class in A",
                                                                   width=CLASS_WIDTH),
                            "class_b": st.column_config.TextColumn("class in B",
                                                                   width=CLASS_WIDTH),
                            "replay_a": st.column_config.LinkColumn("A", display_text="open"),
                            "replay_b": st.column_config.LinkColumn("B", display_text="open")})

# -- one task side by side -------------------------------------------------------------------------
st.subheader("Where the two trajectories of a task diverge")
tasks = list(dict.fromkeys(changed["task_id"].tolist() + paired["task_id"].tolist()))
# Each task is marked with what happened to it, so the picker itself lists gained and lost ones.
CHANGE_MARKS = {"gained": "▲ gained", "lost": "▼ lost", "kept": "solved in both",
                "unsolved": "solved in neither"}
marks = {t: CHANGE_MARKS.get(ch, str(ch)) for t, ch in zip(paired["task_id"], paired["change"])}
task = c.url_select("Task", tasks, key="cmp_task", param="task",
                    format_func=lambda t: f"{marks.get(t, '')} · {t}",
                    help=f"Gained and lost tasks first ({counts['gained']} gained, "
                         f"{counts['lost']} lost), then the others.")
row = paired[paired["task_id"] == task].iloc[0]
turns = d["turns"]
ta = turns[(turns["side"] == "A") & (turns["traj_id"] == row["traj_a"])].reset_index(drop=True)
tb = turns[(turns["side"] == "B") & (turns["traj_id"] == row["traj_b"])].reset_index(drop=True)
at = queries.first_divergence(ta, tb)
if at is None:
    st.info("The two trajectories are identical turn for turn.")
else:
    same = "they differ from the first turn (turn 0)" if at == 0 else \
        f"turns 0-{at - 1} are identical; they diverge at turn {at}"
    st.caption(f"{c.safe_label(row['change'])}: {same}. Class in A: "
               f"{c.safe_label(row['class_a'])}; in B: {c.safe_label(row['class_b'])}.")
cols = st.columns(2)
for col, side, frame, run_id, step, traj in ((cols[0], "A", ta, run_a, row["step_a"], row["traj_a"]),
                                             (cols[1], "B", tb, run_b, row["step_b"], row["traj_b"])):
    with col:
        st.page_link(c.REPLAY, label=c.safe_label(f"{side}: {traj} in Replay", 80),
                     query_params={"store": pick.store, "run": run_id, "step": str(int(step)),
                                   "traj": str(traj), "turn": str(at or 0)})
        shown_turn = at if at is not None else 0
        if at is not None and shown_turn >= len(frame):
            st.text(f"(ended after {len(frame)} turns)")
            continue
        for i in range(shown_turn, min(len(frame), shown_turn + 2)):
            st.text(f"turn {i} action")
            st.code(c.readable(frame.at[i, "action"]) or "", language=None, wrap_lines=True)
            st.text(f"turn {i} observation")
            st.code(c.readable(frame.at[i, "observation"]) or "", language=None, wrap_lines=True)

# -- aggregates ------------------------------------------------------------------------------------
st.subheader("Aggregate shifts")
st.caption("Means over each evaluation's trajectories (all of them, paired or not). Tool calls "
           "are search/tool/code/docs/api actions; a repeated action is an action text that "
           "already occurred earlier in the same trajectory.")
st.dataframe(d["aggregates"].round(3), key="cmp_aggregates", hide_index=True)
