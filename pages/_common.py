"""What every page shares: the run picked in the sidebar, cached reads, links, empty states.

Cached reads are keyed on (store, run_id, version, ...): ``version`` is what changes when the
run's data does (its last step and a fingerprint of its trajectories, storage/queries.py
``run_version``), read again every few seconds, so a live run's pages refresh -- an imported or
OTLP run too, whose trajectories all sit at step 0 while they arrive and grow -- while a finished
run's data is read once. The run list itself is re-read every few seconds.

Untrusted text (model actions, observations, imported prompts, error messages from tools) is only
ever shown through ``st.code``, ``st.text``, ``st.dataframe``, ``st.json`` or the escaped HTML of
pages/_tokens.py -- never through markdown, whose links, images and HTML would be live.
"""
from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass
from urllib.parse import urlencode

import pandas as pd
import streamlit as st

from pages import _jobs, _params
from storage import db, queries

REPLAY = "pages/replay.py"
RUN_TTL_S = 5      # the run list: status and last_step of live runs
LIVE_TTL_S = 3600  # data of one run at one version: the key changes when the run moves on, so
#                    this only bounds how long a run nobody looks at stays in memory (30 s made
#                    every page re-read and re-pivot 100k-trajectory runs on most visits)
MAX_ENTRIES = 64   # per loader: a live run leaves one entry per step it was viewed at


def ensure_app() -> None:
    """Run the page through app.py's navigation, never alone.

    Streamlit treats an app with a ``pages/`` folder as an old-style multipage app until the first
    ``st.navigation`` call of the server process, so the very first request of a deep link
    (``/replay?...``) would run the page without app.py's sidebar picker. This switches that mode
    off and reruns, and app.py then routes the same URL itself.
    """
    # deferred: Streamlit's internals, read once on the first run
    from streamlit.runtime.pages_manager import PagesManager
    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        st.rerun()
    one_history_entry_per_page()


# -- deep links ------------------------------------------------------------------------------------
# A widget whose value lives in the URL: on each run, a URL value that differs from the one this
# session last wrote came from outside (a shared link, a page link, an edited address) and is
# adopted; afterwards the widget's value is written back. (Streamlit's own bind="query-params"
# lets a widget's current browser value win over a link that switches pages, so a link from
# Dynamics to a trajectory of another step would open the wrong step.)
def adopt_url(param: str, key: str, options: list | None = None, cast=str) -> None:
    """Before creating widget ``key``: take ``param`` from the URL if it changed from outside."""
    raw = st.query_params.get(param)
    seen = st.session_state.setdefault("_url_seen", {})
    if raw is None:
        seen.pop(param, None)
        return
    if seen.get(param) == raw:
        return
    seen[param] = raw
    try:
        value = cast(raw)
    except (TypeError, ValueError, LookupError):
        _params.flag(param, f"{raw} is not a whole number" if cast is int else f"{raw} cannot be read")
        return
    if options is None or value in options:
        st.session_state[key] = value
    else:   # never quietly another view: pages/_params.py
        _params.flag(param, f"{raw} is not one of the {len(options)} this view offers")


def publish_url(param: str, value) -> None:
    """After creating a widget: its value into the URL (so the address is a link to this view)."""
    if _params.flagged(param):
        return          # the address keeps what the user typed until they pick another value
    raw = str(value)
    # Only a change is written: each write sends the whole address to the browser, and one sent
    # while the browser still shows the previous page lands in that page's history entry.
    if st.query_params.get(param) != raw:
        st.query_params[param] = raw
    st.session_state.setdefault("_url_seen", {})[param] = raw


# Streamlit's frontend calls history.pushState for every write to st.query_params that changes
# the address, so each view change inside a page (a turn, a trajectory, a step, the defaults a
# page writes on arrival) became a Back stop: leaving Replay took one press per turn stepped
# through. This keeps one history entry per page visited: a push that stays on the same page
# replaces the current entry instead (the address is still a link to the view shown); a move
# to another page still pushes, so Back returns to it with the address, and so the view, it had.
# Between a click on a link to another page and the push of that page's path, the next page's
# own writes arrive while the browser still shows the previous path: they are dropped (the path's
# push carries the latest address) instead of overwriting the previous page's entry.
ONE_ENTRY_PER_PAGE = """<script>
(() => {
  const h = window.history;
  if (h.agentrlOneEntryPerPage) return;
  h.agentrlOneEntryPerPage = true;
  const push = h.pushState.bind(h);
  let leaving = 0;  // when a link to another page was clicked (its path comes within seconds)
  document.addEventListener("click", (e) => {
    const a = e.target.closest && e.target.closest("a[href]");
    if (!a || e.button !== 0 || e.ctrlKey || e.metaKey || e.shiftKey) return;
    if (a.target === "_blank") return;
    const to = new URL(a.href, location.href);
    leaving = to.origin === location.origin && to.pathname !== location.pathname ? Date.now() : 0;
  }, true);
  window.addEventListener("popstate", () => { leaving = 0; });
  h.pushState = (state, unused, url) => {
    const path = url == null ? location.pathname : new URL(url, location.href).pathname;
    if (path !== location.pathname) {
      leaving = 0;
      return push(state, unused, url);
    }
    return Date.now() - leaving < 30000 ? undefined : h.replaceState(state, unused, url);
  };
})();
</script>"""


def one_history_entry_per_page() -> None:
    """Install ONE_ENTRY_PER_PAGE in the browser tab (a constant script: no data goes in)."""
    st.sidebar.html(ONE_ENTRY_PER_PAGE, unsafe_allow_javascript=True)


def url_select(label: str, options: list, key: str, param: str, default=None, cast=str,
               container=st, **kwargs):
    """A selectbox kept in sync with URL parameter ``param``. A URL value it cannot show is
    named in a warning and the page stops there until the user picks one (pages/_params.py)."""
    adopt_url(param, key, options, cast)
    if st.session_state.get(key) not in options:
        st.session_state[key] = default if default in options else options[0]
    value = container.selectbox(label, options, key=key, on_change=_params.forget, args=(param,),
                                **kwargs)
    publish_url(param, value)
    _params.refuse(param)
    return value


# -- the run picked in the sidebar -----------------------------------------------------------------
@dataclass
class Pick:
    store: str
    run_id: str
    run: dict
    step: int | None
    """The step picked in the sidebar (None when the run recorded no trajectories)."""

    @property
    def last_step(self) -> int:
        return int_of(self.run.get("last_step"), -1)

    @property
    def version(self) -> str:
        """What the cached reads of this run are keyed by (see the module's docstring)."""
        return read_or_stop(run_version, self.store, self.run_id)

    @property
    def config(self) -> dict:
        return queries.run_config(self.run.get("config"))


def picked() -> Pick:
    """The run (and step) chosen in the sidebar; an info box and stop when there is none."""
    choice = st.session_state.get("pick_run")
    table = run_table()
    if not choice or table.empty:
        stop("No run to show yet. Record one with `agentrl train ...` or start one on the "
             "Train page; every DuckDB file in the store directories is listed.")
    store, run_id = choice
    rows = table[(table["store"] == store) & (table["run_id"] == run_id)]
    if rows.empty:
        stop("The picked run is no longer in its store.")
    return Pick(store, run_id, rows.iloc[0].to_dict(), st.session_state.get("_picked_step"))


def stop(message: str) -> None:
    st.info(message)
    st.stop()


WORD_JOINER = "\u2060"
"""Invisible and unbreakable: set between the characters of a pattern that markdown would turn
into a link, so that the text reads (and wraps) the same but no longer matches."""


def safe_label(text, limit: int = 60) -> str:
    """Identifiers from a store (imported files choose them) for places Streamlit renders as
    markdown (captions, metric values, link labels), where no stored value may become a link,
    an image, an icon or formatting:

    * characters outside a small inert set become '?' (no brackets, '*', '`', '<', '$', '#');
    * '_' is escaped, so that ids like a_b_c do not turn into italics;
    * GitHub-flavoured markdown's autolinks (``https://x``, ``www.x``, ``a@x``) and Streamlit's
      ``:emoji:`` / ``:material/icon:`` shortcodes are broken by a word joiner after every ':'
      and '@' and between 'www' and '.';
    * a leading '-', '+' or '1)' is escaped, so that the label cannot start a list."""
    kept = re.sub(r"[^A-Za-z0-9_.:@ ()=,/+-]", "?", str(text))[:limit]
    kept = re.sub(r"^(\d*)([-+)])", r"\1\\\2", kept)
    kept = re.sub(r"([:@])", r"\1" + WORD_JOINER, kept)
    kept = re.sub(r"(?i)(www)\.", r"\1" + WORD_JOINER + ".", kept)
    return kept.replace("_", "\\_")


def missing(value) -> bool:
    """Whether a value read from the store is NULL. The one test for it: pandas hands a NULL over
    as None, NaN, ``pd.NA`` (nullable integer and string columns, e.g. a new run's ``last_step``
    before its first step) or ``NaT``, and ``pd.NA`` cannot be compared, cast or tested for truth
    (``int(pd.NA)`` and ``bool(pd.NA)`` raise; ``str(pd.NA)`` is the text "<NA>")."""
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    try:
        return bool(pd.isna(value)) if pd.api.types.is_scalar(value) else False
    except (TypeError, ValueError):
        return False


def text_of(value) -> str | None:
    """A stored text value, or None for NULL (see ``missing``) or empty."""
    if missing(value):
        return None
    value = str(value)
    return value if value else None


def algo_label(config: dict) -> str | None:
    """A run's algorithm as its users name it: TRL's GRPOTrainer as "GRPO (loss_type=...)", its
    loss being TRL's loss_type (runs recorded before stored that as the algo), else the algo."""
    config = config or {}
    if config.get("trainer") == "trl.GRPOTrainer":
        loss = config.get("loss_type")
        return f"GRPO (loss_type={loss})" if loss else "GRPO"
    return text_of(config.get("algo"))


def int_of(value, default: int) -> int:
    """A stored integer, or ``default`` for NULL (see ``missing``)."""
    return default if missing(value) else int(value)


CHAT_MARKER = re.compile(
    r"<\|im_start\|>(?:[\w-]{1,20}(?:\n|\Z))?"                 # ChatML: <|im_start|>user\n
    r"|<\|start_header_id\|>[\w-]{0,20}<\|end_header_id\|>\n{0,2}"  # Llama 3's role header
    r"|<\|[\w.:-]{1,40}\|>\n?")                                  # any <|name|>: im_end, eot_id..


def readable(value) -> str | None:
    """A stored text for reading: chat-template markers removed (``<|im_start|>user\\n``,
    ``<|im_end|>\\n``, any ``<|name|>`` special token and the newline after it), because the
    recorded observations carry the template's turn boundaries around the environment's words.
    Only for views of text: the token view shows every token as the model saw it. None (NULL,
    NaN, empty) stays None."""
    text = text_of(value)
    return None if text is None else CHAT_MARKER.sub("", text)


def flag(value) -> bool:
    """A stored boolean; NULL / NaN count as False (bool(NaN) would be True)."""
    return value is not None and value == value and bool(value)


def plot_text(text) -> str:
    """Text for plotly labels: plotly renders a subset of HTML (links, <b>, <span style>) in
    names and ticks, so data-chosen strings are escaped (plotly shows the entities as text)."""
    return html.escape(str(text))


def replay_link(pick: Pick, step: int, traj_id: str, label: str | None = None, key=None) -> None:
    """A link into Replay showing ``traj_id`` (the same URL a user can share)."""
    st.page_link(REPLAY, label=safe_label(label or f"Replay {traj_id}", 80),
                 query_params={"store": pick.store, "run": pick.run_id, "step": str(int(step)),
                               "traj": str(traj_id)})


def replay_url(pick: Pick, step: int, traj_id: str) -> str:
    """Relative URL of a Replay view, for link columns of tables."""
    return "replay?" + urlencode({"store": pick.store, "run": pick.run_id, "step": int(step),
                                  "traj": traj_id})


# -- cached reads ----------------------------------------------------------------------------------
def store_stamp(path: str) -> tuple:
    """What changes when a store is written: size and modification time of the file and of its
    write-ahead log (a commit appends to the log, a checkpoint rewrites the file); a stat is
    microseconds where opening a store to read it is 15-30 ms. A team store's stamp is its
    latest snapshot id (a few ms on the connection the process keeps attached)."""
    if queries.is_team_store(path):
        try:
            return ("snapshot", queries.team_store_snapshot(path))
        except db.StoreError:
            return ("snapshot", None)       # the read that follows names the error
    stamp = []
    for p in (path, path + ".wal"):
        try:
            st_ = os.stat(p)
            stamp.append((st_.st_size, st_.st_mtime_ns))
        except OSError:
            stamp.append(None)
    return tuple(stamp)


@st.cache_data(ttl=LIVE_TTL_S, max_entries=4 * MAX_ENTRIES, show_spinner=False)
def _store_runs(path: str, stamp: tuple) -> pd.DataFrame:
    """One store's runs (or its error row), read again only when the store was written."""
    return queries.all_runs([path])


@st.cache_data(ttl=RUN_TTL_S, show_spinner=False)
def run_table() -> pd.DataFrame:
    """Every run of every store (unreadable stores as rows with an error). Every RUN_TTL_S the
    stores are looked at again, and only those written since are read (each opened store cost
    15-30 ms, so a click after a few seconds of reading re-read every store: ~1 s on 12)."""
    frames = [_store_runs(p, store_stamp(p)) for p in queries.discover_stores()]
    return queries.all_runs([], frames)


@st.cache_data(ttl=RUN_TTL_S, max_entries=MAX_ENTRIES, show_spinner=False)
def run_version(store: str, run_id: str) -> str:
    """A run's data version (queries.run_version), looked at every RUN_TTL_S seconds and read
    again only when its store was written."""
    return _version_at(store, run_id, store_stamp(store))


@st.cache_data(ttl=LIVE_TTL_S, max_entries=4 * MAX_ENTRIES, show_spinner=False)
def _version_at(store: str, run_id: str, stamp: tuple) -> str:
    return queries.run_version(store, run_id)


@st.cache_data(ttl=LIVE_TTL_S, max_entries=MAX_ENTRIES, show_spinner=False)
def load_steps(store: str, run_id: str, version: str) -> list[int]:
    return [int(s) for s in queries.steps(store, run_id)["step"]]


@st.cache_data(ttl=LIVE_TTL_S, max_entries=MAX_ENTRIES, show_spinner=False)
def load_metrics(store: str, run_id: str, version: str) -> pd.DataFrame:
    """Metrics as a wide table: one row per step, one column per metric name."""
    long = queries.metrics(store, run_id)
    if long.empty:
        return pd.DataFrame()
    wide = long.pivot_table(index="step", columns="name", values="value", aggfunc="last")
    return wide.sort_index()


@st.cache_data(ttl=LIVE_TTL_S, max_entries=MAX_ENTRIES, show_spinner=False)
def load_trajectories(store: str, run_id: str, version: str, step: int | None = None,
                      group_id: str | None = None) -> pd.DataFrame:
    return queries.trajectories(store, run_id, step=step, group_id=group_id)


@st.cache_data(ttl=LIVE_TTL_S, max_entries=MAX_ENTRIES, show_spinner=False)
def load_groups(store: str, run_id: str, version: str, step: int) -> pd.DataFrame:
    return queries.groups(store, run_id, step)


# A trajectory's rows, keyed by the run's version too: an OTLP trajectory is rewritten as its
# agent goes on, a followed import may replace one; a finished run's stay cached.
def load_turns(store: str, run_id: str, traj_ids: tuple[str, ...]) -> pd.DataFrame:
    return _turns(store, run_id, traj_ids, run_version(store, run_id))


def load_tokens(store: str, run_id: str, traj_id: str) -> pd.DataFrame:
    return _tokens(store, run_id, traj_id, run_version(store, run_id))


def load_rewards(store: str, run_id: str, traj_ids: tuple[str, ...]) -> pd.DataFrame:
    return _rewards(store, run_id, traj_ids, run_version(store, run_id))


def load_tests(store: str, run_id: str, traj_ids: tuple[str, ...]) -> pd.DataFrame:
    return _tests(store, run_id, traj_ids, run_version(store, run_id))


@st.cache_data(ttl=LIVE_TTL_S, max_entries=MAX_ENTRIES, show_spinner=False)
def _turns(store: str, run_id: str, traj_ids: tuple[str, ...], version: str) -> pd.DataFrame:
    return queries.turns(store, run_id, list(traj_ids))


@st.cache_data(ttl=LIVE_TTL_S, max_entries=MAX_ENTRIES, show_spinner=False)
def _tokens(store: str, run_id: str, traj_id: str, version: str) -> pd.DataFrame:
    return queries.tokens(store, run_id, traj_id)


@st.cache_data(ttl=LIVE_TTL_S, max_entries=MAX_ENTRIES, show_spinner=False)
def _rewards(store: str, run_id: str, traj_ids: tuple[str, ...], version: str) -> pd.DataFrame:
    return queries.rewards(store, run_id, list(traj_ids))


@st.cache_data(ttl=LIVE_TTL_S, max_entries=MAX_ENTRIES, show_spinner=False)
def _tests(store: str, run_id: str, traj_ids: tuple[str, ...], version: str) -> pd.DataFrame:
    return queries.test_results(store, run_id, list(traj_ids))


@st.cache_data(ttl=LIVE_TTL_S, max_entries=MAX_ENTRIES, show_spinner=False)
def load_failure_counts(store: str, run_id: str, version: str) -> pd.DataFrame:
    return queries.failure_counts(store, run_id)


@st.cache_data(ttl=LIVE_TTL_S, max_entries=MAX_ENTRIES, show_spinner=False)
def bar_chart(frame: pd.DataFrame, **kwargs) -> dict:
    """``px.bar(frame, **kwargs)`` as the figure's dict, cached by its data and arguments: plotly
    express took ~0.3 s a chart (grouping, colours, subplots) on every rerun, where drawing a
    built figure again costs Streamlit ~0.03 s (it validates the dict into a figure)."""
    import plotly.express as px   # deferred: only the pages with such a chart need it
    return px.bar(frame, **kwargs).to_dict()


def reward_components(store: str, run_id: str, traj_ids: list[str]) -> pd.DataFrame:
    """Reward components as a wide table: one row per trajectory, one column per component.

    A TRL run's components are its reward functions, in the trainer's order: the store also
    holds the contract's outcome/format/cost/process, which restate them (``format_reward`` is
    ``format`` again, storage/integrations/trl_rows.py), so those are not shown twice."""
    long = load_rewards(store, run_id, tuple(traj_ids))
    if long.empty:
        return pd.DataFrame(index=pd.Index(traj_ids, name="traj_id"))
    wide = long.pivot_table(index="traj_id", columns="component", values="value", aggfunc="last")
    functions = [f for f in trl_reward_functions(store, run_id) if f in wide.columns]
    return wide[functions] if functions else wide


def trl_reward_functions(store: str, run_id: str) -> list[str]:
    """The reward functions' names of a run recorded from TRL's GRPOTrainer ([] otherwise)."""
    table = run_table()
    rows = table[(table["store"] == store) & (table["run_id"] == run_id)]
    config = queries.run_config(rows["config"].iloc[0]) if not rows.empty else {}
    if config.get("trainer") != "trl.GRPOTrainer":
        return []
    return [str(f) for f in config.get("reward_funcs") or []]


def read_or_stop(fn, *args, **kwargs):
    """Call a read; a store that cannot be read becomes a message, not a traceback."""
    try:
        return fn(*args, **kwargs)
    except db.StoreError as exc:
        st.error("The store could not be read:")
        st.code(str(exc), language=None, wrap_lines=True)
        st.stop()


def job_progress(job: dict, stop, waiting: str, unit: str, button: str, key: str) -> None:
    """A running job's progress bar (from the ``progress DONE/TOTAL`` lines of its log) and its
    Stop button; ``stop(job)`` raises ``_jobs.JobError`` with the reason it could not."""
    done = _jobs.progress_of(_jobs.log_tail(job, lines=40))
    st.progress(0.0 if done is None or not done[1] else done[0] / done[1],
                text=waiting if done is None else f"{done[0]} of {done[1]} {unit} finished")
    if st.button(button, key=key):
        try:
            stop(job)
        except _jobs.JobError as exc:
            st.error(str(exc))
