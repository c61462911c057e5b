"""Replay: one trajectory turn by turn, its outcome, and every token of its context."""
from __future__ import annotations

import json

import streamlit as st

from pages import _common as c
from pages import _terms
from pages import _boards, _branches, _calls, _info_gain, _live, _panels, _params, _states, _tokens
from storage import queries

c.ensure_app()
pick = c.picked()
_terms.title("Replay", "replay")
if pick.step is None:
    c.stop("This run recorded no trajectories (metrics only): nothing to replay.")
trajs = c.read_or_stop(c.load_trajectories, pick.store, pick.run_id, pick.version, pick.step)
if st.query_params.get("traj") and st.query_params["traj"] not in set(trajs["traj_id"]):
    # a link to a trajectory recorded since the cached read (a branch job's continuation)
    trajs = c.read_or_stop(_branches.fresh_trajectories, pick)
if trajs.empty:
    c.stop(f"Step {pick.step} recorded no trajectories.")

traj_id = c.url_select("Trajectory", trajs["traj_id"].tolist(), key="traj", param="traj",
                       format_func=str)
row = trajs.set_index("traj_id").loc[traj_id].to_dict()
row, read_now = _live.fresh(pick, traj_id, row)  # an OTel agent still running: read it now
_live.hint(row)
cols = st.columns(5)
cols[0].metric("Reward", "-" if c.missing(row["reward"]) else f"{row['reward']:.3f}",
               help=_terms.help_for("reward"))
cols[1].metric("Advantage", "-" if c.missing(row["advantage"]) else f"{row['advantage']:.3f}",
               help=_terms.help_for("advantage"))
still_open = c.text_of(row["failure_class"]) == queries.OPEN_CLASS   # no outcome yet
cols[2].metric("Success", "open" if still_open else "yes" if c.flag(row["success"]) else "no",
               help=_terms.help_for("success"))
cols[3].metric("Turns", c.int_of(row["num_turns"], 0))
# Not a metric: st.metric cuts a long value ("collateral...") to its column's width.
with cols[4].container(key="replay_failure_class"):
    st.caption("Failure class", help=_terms.help_for("failure-class"))
    st.markdown("**" + c.safe_label(c.text_of(row["failure_class"]) or "unclassified", 80) + "**")
st.caption(f"group {c.safe_label(row['group_id'])} · task {c.safe_label(row['task_id'])} · "
           f"split {c.safe_label(row['split'])} · finish "
           f"{'none yet (the agent still runs)' if still_open else c.safe_label(row['finish_reason'])}"
           + (" · filtered out of the update (StarPO-S)" if c.flag(row["filtered"]) else "")
           + ". " + _terms.reward_beside_success(pick.config))
if c.text_of(row.get("prompt")):
    with st.expander("Prompt (the task as the model was asked it)"):
        st.code(row["prompt"], language=None, wrap_lines=True)

# -- turn by turn ----------------------------------------------------------------------------------
turns = _live.turns(pick, traj_id, read_now)
ERROR_SAID_BY = ("A tool or the evaluation reported an error on this turn:"
                 if str(pick.run.get("source") or "").startswith(("import:inspect",
                                                                   "import:messages"))
                 else "The environment reported an error on this turn:")
n = len(turns)
# pictures of each state: the env's own (schema 7), else a grid world's board read from its text
renders = c.read_or_stop(_states.load_renders, pick.store, pick.run_id, traj_id)
boards = _boards.trajectory_boards(row.get("prompt"), turns.to_dict("records"))
if st.session_state.get("_replay_traj") != (pick.run_id, traj_id):
    st.session_state["_replay_traj"] = (pick.run_id, traj_id)
    st.session_state["turn"] = 0  # a new trajectory starts at its first turn (unless linked)


def move(delta: int) -> None:
    st.session_state["turn"] = min(max(int(st.session_state.get("turn") or 0) + delta, 0), n - 1)


def show_turn(t: dict, k: int) -> None:
    _states.pictures(boards, renders, k, row.get("info"), t.get("info"))
    left, right = st.columns(2)
    with left:
        st.markdown(f"**Action** · {c.safe_label(t['action_type'])}"
                    + (" · invalid" if t["action_valid"] is False
                       and c.text_of(t["action_type"]) != "invalid" else "")
                    + (" · cut by the token limit" if t["action_truncated"] else ""))
        if not _calls.show_action(t):
            st.code(c.readable(t["action"]) or "", language=None, wrap_lines=True)
    with right:
        shows = _states.env_turn(c.readable(t["observation"]))
        st.markdown("**Observation**" + (f" · the environment's turn {shows} state (what the "
                                         "next turn acts on)" if shows is not None else "")
                    + (" · truncated" if t["obs_truncated"] else ""))
        st.code(c.readable(t["observation"]) or "(none)", language=None, wrap_lines=True)
    if any(c.readable(t[k]) != c.text_of(t[k]) for k in ("action", "observation")):
        st.caption("Chat-template markers (`<|im_start|>`, `<|im_end|>`, ...) are hidden in this "
                   "text; the token view below shows every token.")
    if c.text_of(t["error"]):
        st.error(ERROR_SAID_BY)
        st.code(t["error"], language=None, wrap_lines=True)
    if c.text_of(t["state_diff"]):
        _states.diff_table(t["state_diff"])
    info, key = c.text_of(t.get("info")), c.text_of(t.get("state_key"))
    if info or key:  # NULL in runs recorded before these were stored
        with st.expander("Step info (what the environment reported for this turn)"):
            if key:
                st.markdown("State key (the state this turn acted from; GiGPO's anchor)")
                st.code(key, language=None, wrap_lines=True)
            if info:
                try:
                    st.json(json.loads(info), expanded=True)
                except ValueError:
                    st.code(info, language=None, wrap_lines=True)


def turn_player() -> None:
    if st.session_state.get("replay_play") and int(st.session_state.get("turn") or 0) < n - 1:
        move(+1)
    c.adopt_url("turn", "turn", list(range(n)), int)
    _params.refuse("turn", what="this trajectory")   # a turn it does not have: none shown
    if not 0 <= int(st.session_state.get("turn") or 0) < n:
        st.session_state["turn"] = 0
    if n > 1:
        b1, b2, b3 = st.columns([1, 1, 6])
        b1.button("◀ Prev", key="replay_prev", on_click=move, args=(-1,))
        b2.button("Next ▶", key="replay_next", on_click=move, args=(+1,))
        turn = b3.slider("Turn", 0, n - 1, key="turn")
    else:
        turn = 0
    c.publish_url("turn", turn)
    # One numbering everywhere: the stored turn index, as in links, Groups, Failures and the
    # branch panel below. An environment that numbers its own turns (RAGEN's grid worlds start
    # at 'Turn 1') is named beside it, so the observation's 'Turn k' never seems to disagree.
    _states.filmstrip(boards, renders, n, turn)
    t = turns.iloc[turn].to_dict()
    shows = _states.env_turn(c.readable(t["observation"]))
    st.caption(f"Turn {turn} of {n} (numbered from 0, as in links and the other pages)"
               + (f" · the environment's turn {shows - 1}" if shows else ""))
    show_turn(t, turn)


st.subheader("Turns")
if n == 0:
    st.info("This trajectory recorded no turns.")
else:
    playing = st.toggle("Play (advance one turn per second)", key="replay_play")
    st.fragment(turn_player, run_every=1.0 if playing else None)()

# -- tokens (right under the turns: the page's heart, not below every panel) ---------------------
st.subheader("Tokens")
tokens = _tokens.with_mismatch(c.load_tokens(pick.store, pick.run_id, traj_id))
if tokens.empty:
    st.info("No token records for this trajectory (imported runs carry text only).")
else:
    # Held-out evaluations, rollouts filtered out of the update and an endpoint's collection
    # rounds (split 'collect', core/run/collection.py) and branch continuations (core/jobs/branch.py)
    # train nothing, by design.
    updated = row["split"] not in ("eval", "collect", "branch") and not c.flag(row["filtered"])

    @st.fragment
    def token_view() -> None:
        """A fragment: another colouring redraws the tokens alone, not the whole page."""
        c.adopt_url("colour", "replay_colour", list(_tokens.MODES))  # a link may ask for one
        _params.refuse("colour", what="the token view")
        mode = st.selectbox("Colour by", list(_tokens.MODES), key="replay_colour")
        column = _tokens.MODES[mode]
        if column and tokens[column].isna().all():
            st.info(f"This run recorded no {column} values; showing the tokens uncoloured.")
        st.caption(_tokens.LEGEND[mode] + ". Hover a token for its exact values.")
        st.html(_tokens.token_html(tokens, mode, updated))

    token_view()
    lint = _tokens.mask_lint(tokens, turns, updated)
    st.markdown("**Mask lint**")
    if lint.empty:
        st.success("Loss mask consistent: only the model's own tokens were trained; "
                   "no turn was cut.")
    else:
        st.warning(f"{len(lint)} mask or length issue(s) in this trajectory.")
        st.dataframe(lint, key="replay_lint", hide_index=True)

# -- outcome ---------------------------------------------------------------------------------------
st.subheader("Outcome")
left, right = st.columns(2)
with left:
    comps = c.reward_components(pick.store, pick.run_id, [traj_id])
    if comps.empty or comps.shape[1] == 0:
        st.info("No reward components recorded for this trajectory.")
    else:
        st.dataframe(comps.T.rename(columns={traj_id: "value"}), key="replay_rewards")
with right:
    st.markdown("**Answer**")
    st.code(c.text_of(row.get("answer")) or "(no answer)", language=None)
    if c.text_of(row.get("golds")):
        st.markdown("**Gold**")
        st.code(c.text_of(row["golds"]), language=None)
_calls.sample_panel(row.get("info"))
tests = c.load_tests(pick.store, pick.run_id, (traj_id,))
if not tests.empty:
    st.markdown(f"**Tests** · {int(tests['passed'].sum())} of {len(tests)} passed")
    st.dataframe(tests.drop(columns="traj_id"), key="replay_tests", hide_index=True)

# -- information gain (IGPO) -----------------------------------------------------------------------
_info_gain.replay_panel(pick, traj_id, turns)

# -- branches --------------------------------------------------------------------------------------
_branches.panel(pick, traj_id, row, n)

# -- tags ------------------------------------------------------------------------------------------
st.subheader("Tags")
_panels.tag_form(pick, traj_id, "replay")

