"""Failures: why trajectories failed, searched and filtered; tags, one task over time, export,
and a read-only SQL box."""
from __future__ import annotations

import streamlit as st

from pages import _clusterjob, _common as c
from pages import _terms
from pages import _failfilters, _panels, _params
from storage import queries
from storage.failures import DESCRIPTIONS
from storage.embeddings import confidence as cluster_confidence

c.ensure_app()
MAX_BARS = 100
SHOWN_ROWS = 500  # rows of the results table; the count and the export cover every match
CLASS_WIDTH = 215  # px: the longest class name (wrong_answer_without_evidence) whole
OPEN_MEANING = ("Not a failure: an agent still running, received over OpenTelemetry. Its "
                "trajectory grows as its spans arrive and has no reward, success or class until "
                "it ends; this page shows it as it stands.")


# Cached per (store, run, version, facets): a rerun (selecting a row, typing a tag) re-reads
# nothing. Tags are read again when the store was written (run_tags): this page writes them.
@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def search(store: str, run_id: str, version: str, text: str, classes: tuple | None,
           step_range: tuple[int, int], splits: tuple | None, success: bool | None,
           tags: tuple | None = None, tags_seen: str = ""):
    """``tags_seen``: the run's tags as read now, so a tag saved here is searched at once."""
    return queries.search_trajectories(store, run_id, text=text, step_range=step_range,
                                       classes=list(classes) if classes else None,
                                       splits=list(splits) if splits else None, success=success,
                                       limit=SHOWN_ROWS, tags=list(tags) if tags else None)


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def count(store: str, run_id: str, version: str, text: str, classes: tuple | None,
          step_range: tuple[int, int], splits: tuple | None, success: bool | None,
          tags: tuple | None = None, tags_seen: str = "") -> int:
    """How many match, when more than the table shows."""
    return queries.count_trajectories(store, run_id, text=text, step_range=step_range,
                                      classes=list(classes) if classes else None,
                                      splits=list(splits) if splits else None, success=success,
                                      tags=list(tags) if tags else None)


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def load_clusters(store: str, run_id: str, version: str, computed: str):
    """``computed``: when the last cluster job finished, so a new result is read once."""
    return queries.failure_clusters(store, run_id)


def cluster_panel(pick: c.Pick) -> None:
    """Clusters of similar failures: computed by a job (core/jobs/clusters.py), only read here."""
    st.subheader("Clusters of similar failures")
    job = _clusterjob.state(pick.store, pick.run_id)
    running = bool(job and job["alive"])
    done_at = str(job.get("at", "")) if job and job.get("phase") == "done" else ""
    found = c.read_or_stop(load_clusters, pick.store, pick.run_id, pick.version, done_at)
    table, per_step, members = found["clusters"], found["per_step"], found["members"]
    right = _cluster_job(pick, job, running, computed=not table.empty)
    if table.empty:
        if not running:
            right.info("Not computed yet for this run: Compute clusters embeds its failing "
                       "trajectories (or run `agentrl clusters --db STORE --run RUN`).")
        return
    _cluster_views(pick, table, per_step, members)


def _cluster_job(pick: c.Pick, job: dict | None, running: bool, computed: bool):
    """The (Re)compute button, the running job's progress or the failed job's error; returns
    the column beside the button, for what is said next."""
    left, right = st.columns([1, 3])
    if left.button("Recompute clusters" if computed else "Compute clusters",
                   key="cluster_start", disabled=running,
                   help="Embeds this run's failing trajectories (actions, observation starts, "
                        "errors) in a separate process, caches the vectors in the store and "
                        "clusters them. Reruns embed only new trajectories."):
        _clusterjob.launch(pick.store, pick.run_id)
        st.rerun()
    if running:
        @st.fragment(run_every=2)
        def progress():
            now = _clusterjob.state(pick.store, pick.run_id) or {}
            if not now.get("alive"):
                st.rerun(scope="app")
            fraction, text = _clusterjob.progress(now)
            st.progress(fraction, text=text)
        with right:
            progress()
    elif job and job.get("phase") == "failed":
        right.error("The cluster job failed:")
        right.code(str(job.get("error", "")), language=None, wrap_lines=True)
    return right


def _cluster_views(pick: c.Pick, table, per_step, members) -> None:
    """The clusters' table, their share of each step's failures, and one cluster's members."""
    first = table.iloc[0]
    score = "" if first["silhouette"] != first["silhouette"] else \
        f", {_terms.link('silhouette')} {first['silhouette']:.2f}"
    st.caption(f"{len(members)} failing trajectories in {len(table)} clusters (k chosen by "
               f"silhouette{score}); embedding {c.safe_label(first['model'])}, computed "
               f"{str(first['created_at'])[:16]} UTC. Terms: what sets a cluster apart "
               "(class-based TF-IDF, names masked); central: its most typical members.")
    level, named, verdict = cluster_confidence(int(first["k"]), first["silhouette"])
    {"reasonable": st.success, "single": st.info}.get(level, st.warning)(verdict)
    if not named:   # a partition without structure: its terms would read as findings
        table = table.assign(terms="(not named: no substantial structure)")
    steps = members.groupby("traj_id")["step"].first().to_dict()
    shown = table.assign(
        share=(table["share"] * 100).round(1),
        replay=[c.replay_url(pick, steps[t.split(", ")[0]], t.split(", ")[0])
                for t in table["central"]])
    st.dataframe(shown, key="cluster_table", hide_index=True,
                 column_order=["cluster", "size", "share", "replay", "terms", "classes", "central"],
                 column_config={"share": st.column_config.NumberColumn("share %"),
                                "replay": st.column_config.LinkColumn(
                                    "most central", display_text="open in Replay"),
                                "classes": st.column_config.TextColumn("failure classes",
                                                                       width="large")})
    names = {int(r.cluster): f"{int(r.cluster)}: {str(r.terms)[:40]}" for r in table.itertuples()}
    if per_step["step"].nunique() > 1:
        lines = per_step.assign(cluster=per_step["cluster"].map(
            lambda k: c.plot_text(names[int(k)])), share=per_step["share"] * 100)
        # Stacked to 100% per step: a cluster's band widening over the steps is a failure mode
        # training makes more common (12 crossing lines were unreadable).
        st.plotly_chart(c.bar_chart(lines, x="step", y="share", color="cluster", height=360,
                               title="Share of each step's failures per cluster (%)"),
                        key="cluster_share")
    pickable = list(names)
    chosen = st.selectbox("Members of cluster", pickable, key="cluster_pick",
                          format_func=lambda k: names[k])
    own = members[members["cluster"] == chosen].head(200)
    own = own.assign(replay=[c.replay_url(pick, s, t) for s, t in zip(own["step"], own["traj_id"])])
    st.dataframe(own, key="cluster_members", hide_index=True,
                 column_order=["replay", "traj_id", "step", "failure_class", "distance", "split",
                               "task_id"],
                 column_config={"replay": st.column_config.LinkColumn("Replay",
                                                                      display_text="open")})


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def task_ids(store: str, run_id: str, version: str) -> list[str]:
    return queries.task_ids(store, run_id)


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def task_history(store: str, run_id: str, version: str, task: str):
    return queries.task_history(store, run_id, task)


@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def run_tags(store: str, run_id: str, stamp: tuple):
    return queries.tags(store, run_id)


def class_meanings(counts) -> None:
    """The run's classes, how many trajectories each, and what each means (storage/failures.py):
    open by itself for an evaluation (every trajectory held out: an imported evaluation log,
    whose classes -- wrong answer, refused, limit, sample error -- are not a trainer's)."""
    per = counts.groupby("failure_class", as_index=False)["n"].sum().sort_values(
        "n", ascending=False)
    per["share"] = per["n"] / per["n"].sum() * 100
    meanings = {**DESCRIPTIONS, queries.OPEN_CLASS: OPEN_MEANING}
    per["meaning"] = [meanings.get(k, "A class this version's rules do not define (set by "
                                      "the imported file).") for k in per["failure_class"]]
    per = per[["failure_class", "n", "share", "meaning"]]
    evaluation = set(counts["split"].dropna()) <= {"eval"}
    with st.expander(f"What the {len(per)} classes of this run mean", expanded=evaluation):
        st.markdown("\n".join(f"- **{c.safe_label(k)}** · {n} ({share:.0f}%): {meaning}"
                               for k, n, share, meaning in per.itertuples(index=False)))


def count_charts(counted, left_out: int, first: int, last: int, counted_splits: list) -> None:
    """Failed trajectories per class, and the classes per step (steps ``first``-``last``)."""
    left, right = st.columns(2)
    shown = counted.assign(failure_class=counted["failure_class"].map(c.plot_text))
    # Solved trajectories are a bar of their own no more: on a run that learns they outnumber every
    # failure class together and squash the bars that matter; the title says how many.
    failed = shown[~shown["failure_class"].isin(["success", queries.OPEN_CLASS])]
    per_class = failed.groupby("failure_class", as_index=False)["n"].sum().sort_values("n")
    solved_n = int(shown.loc[shown["failure_class"] == "success", "n"].sum())
    open_n = int(shown.loc[shown["failure_class"] == queries.OPEN_CLASS, "n"].sum())
    left.plotly_chart(c.bar_chart(per_class, x="n", y="failure_class", orientation="h", height=320,
                             title=f"Failed trajectories per class ({solved_n} solved"
                                   + (f", {open_n} still open" if open_n else "")
                                   + " not drawn)"),
                      key="fail_per_class")
    # One bar per step drew ~20k SVG bars on the 3,125-step bench run (seconds of browser time):
    # long runs get one bar per `width` steps, labelled by the bin's first step.
    width = max(1, -(-(last - first + 1) // MAX_BARS))  # ceil: at most MAX_BARS bars
    binned = shown.assign(step=(shown["step"] - first) // width * width + first)
    per_step = binned.groupby(["step", "failure_class"], as_index=False)["n"].sum()
    right.plotly_chart(c.bar_chart(per_step, x="step", y="n", color="failure_class", height=320,
                              title="Failure classes per step" if width == 1
                              else f"Failure classes per {width} steps"), key="fail_per_step")
    if left_out:
        st.caption(f"Counted: the splits picked below "
                   f"({', '.join(map(c.safe_label, counted_splits))}); {left_out} trajectories "
                   "of other splits (branch continuations unless picked) are left out.")


pick = c.picked()
_terms.title("Failures", "failures")
counts = c.read_or_stop(c.load_failure_counts, pick.store, pick.run_id, pick.version)
if counts.empty:
    c.stop("This run recorded no trajectories (metrics only): nothing to classify.")

# The filters' state first (from a link, this session's copy, or the defaults): the counts below
# are of the splits they pick (branch continuations are left out unless picked).
classes = sorted(counts["failure_class"].unique())
splits = sorted(counts["split"].dropna().unique())
first, last = int(counts["step"].min()), int(counts["step"].max())
# read again whenever the store was written (this page writes them): not on every rerun
tagged = c.read_or_stop(run_tags, pick.store, pick.run_id, c.store_stamp(pick.store))
tag_names = sorted(tagged["tag"].unique())
view = _failfilters.restore(pick, classes, splits, first, last, tag_names)
counted_splits = st.session_state["fail_splits"] or splits     # none picked: every split
counted = counts[counts["split"].isin(counted_splits) | counts["split"].isna()]
left_out = int(counts["n"].sum() - counted["n"].sum())

# -- counts ----------------------------------------------------------------------------------------
# A TRL run's completions are scored by its reward functions, not graded as agent episodes: the
# taxonomy's classes (read from turns, answers and finish reasons) say nothing about them.
trl_functions = c.trl_reward_functions(pick.store, pick.run_id)
if trl_functions:
    st.info("A TRL run: its completions are scored by its reward functions ("
            + ", ".join(map(c.safe_label, trl_functions)) + "), not graded as agent episodes, so "
            "no failure class applies. Search and filter them below by outcome, step and text; "
            "Groups lists each step's completions with every reward function.")
else:
    count_charts(counted, left_out, first, last, counted_splits)
    class_meanings(counts)

# -- find trajectories: facets and search ----------------------------------------------------------
# Above the clusters, under a heading of their own: drawn under the cluster-members table they
# looked as if they filtered it. Each filter that differs from its default is in the URL.
st.subheader("Find trajectories")
f1, f2, f3 = st.columns(3)
if not trl_functions:
    f1.multiselect("Failure class", classes, key="fail_classes", on_change=_params.forget,
                   args=("classes",))
f2.multiselect("Split", splits, key="fail_splits", on_change=_params.forget, args=("splits",),
               help="Branch continuations (split 'branch') are left out unless picked.")
f3.radio("Outcome", list(_failfilters.OUTCOMES), key="fail_outcome", horizontal=True,
         on_change=_params.forget, args=("outcome",))
if first < last:
    st.slider("Steps", first, last, key="fail_steps", on_change=_params.forget, args=("steps",))
s1, s2 = st.columns([3, 1])
s1.text_input("Search text", key="fail_search", placeholder="e.g. capital of")
s2.multiselect("Tag", tag_names, key="fail_tags", on_change=_params.forget, args=("tags",),
               placeholder="any", help="Only trajectories carrying one of these tags.")
st.caption("Searches the prompt, every turn's action and observation, and the tags and notes "
           "saved on a trajectory (case-insensitive substring). A trajectory is listed when it "
           "matches the search and every filter above.")
kept = _failfilters.publish(pick, view)
if any(_params.flagged(p) for p in _failfilters.PARAMS.values()):
    st.caption("0 trajectories match: the address asks for a filter value this run does not "
               "have, and a filter that cannot be applied selects nothing (no export).")
_params.refuse(*_failfilters.PARAMS.values(), what="this run's filters")
matching = _failfilters.current(view, first, last)
seen = f"{len(tagged)}:{tagged['created_at'].max() if len(tagged) else ''}"
found = search(pick.store, pick.run_id, pick.version, **matching, tags_seen=seen)
total = len(found) if len(found) < SHOWN_ROWS else \
    count(pick.store, pick.run_id, pick.version, **matching, tags_seen=seen)
st.caption(f"{total} trajectories match" + (f" (first {SHOWN_ROWS} shown; export writes all)"
                                            if total > len(found) else "")
           + ". Select a row to read it and tag it.")
_failfilters.notes(matching, total, first, last, lambda: count(
    pick.store, pick.run_id, pick.version, **{**matching, "classes": ("success",)},
    tags_seen=seen), classes_shown=not trl_functions)
found["replay"] = [c.replay_url(pick, s, t) for s, t in zip(found["step"], found["traj_id"])]
ids = found["traj_id"].tolist()
opened = kept.get("opened")
event = st.dataframe(
    found, key="fail_results", hide_index=True, on_select="rerun", selection_mode="single-row",
    column_order=[*(["failure_class"] if not trl_functions else []), "replay", "step",
                  "traj_id", "reward", "success", "num_turns", "task_id", "group_id", "split",
                  "finish_reason"],
    selection_default={"selection": {"rows": [ids.index(opened)], "columns": []}}
    if opened in ids else None,
    column_config={"failure_class": st.column_config.TextColumn("failure class",
                                                                width=CLASS_WIDTH),
                   "replay": st.column_config.LinkColumn("Replay", display_text="open")})
rows = [r for r in (event.selection.rows if event else []) if r < len(found)]
kept["opened"] = found["traj_id"].iloc[rows[0]] if rows else None

_failfilters.export_buttons(pick, matching, total)
if rows:
    _panels.trajectory_panel(pick, found.iloc[rows[0]].to_dict())

if not tagged.empty:
    with st.expander(f"Tags and notes in this run ({len(tagged)})"):
        st.dataframe(tagged, key="fail_all_tags", hide_index=True)

# -- clusters, one task across steps, SQL: tabs drawn only when open ----------------------------
# Lazy tabs: only the open tab's script runs and is drawn. With all three on the page a load took
# 0.4-0.6 s more browser CPU (bench/pages.py --walkthrough --links failures); the clusters, which
# the walkthrough opens, come first. A link names another tab with tab=task or tab=sql.
TABS = {"clusters": "Clusters of similar failures", "task": "One task across steps",
        "sql": "SQL (read-only)"}
if st.query_params.get("tab") and st.query_params["tab"] not in TABS and not _params.flagged("tab"):
    _params.flag("tab", "the tabs are " + ", ".join(TABS))
_params.refuse("tab", what="this page's tabs")
asked = TABS.get(st.query_params.get("tab", ""), TABS["clusters"])
clusters_tab, task_tab, sql_tab = st.tabs(list(TABS.values()), default=asked, key="fail_tab",
                                          on_change="rerun")
if clusters_tab.open:
    with clusters_tab:
        cluster_panel(pick)
if task_tab.open:
    with task_tab:
        tasks = task_ids(pick.store, pick.run_id, pick.version)
        if not tasks:
            st.info("No task ids recorded in this run.")
        else:
            task = st.selectbox("Task", tasks, key="fail_task", format_func=str)
            history = task_history(pick.store, pick.run_id, pick.version, task)
            solved = history[history["successes"] > 0]
            st.caption("First solved at step " + str(int(solved["step"].iloc[0]))
                       if not solved.empty else "Never solved in this run.")
            st.dataframe(history, key="fail_task_history", hide_index=True)
if sql_tab.open:
    with sql_tab:
        _panels.sql_box(pick)
