"""How Replay shows a turn's state: pictures before and after the action (the environment's own,
``Episode.render()`` stored in ``renders``; else a grid world's board drawn from its text,
pages/_boards.py) and the apps world's state diff as a table.

Everything shown here comes from a store, so from a model, a user's environment or an imported
file: text is escaped, a user's SVG or PNG is only ever an ``<img>`` with a data URI (a browser
runs no script of an image loaded so, and the page's HTML never holds its markup), and our own
boards are built from validated symbols and integers only (and shown as images too).
"""
from __future__ import annotations

import base64
import binascii
import html
import json

import pandas as pd
import streamlit as st

from pages import _boards
from pages import _common as c
from storage import queries

MAX_CELL = 300
"""Characters of one value shown in a table cell; the whole value is in 'As recorded'."""
LEGEND = {"frozenlake": "dot: the player · line and marks: the cells walked so far · pale: ice · "
                        "dark: a hole · gold: the goal",
          "sokoban": "dot: the player · line and marks: the cells walked so far · brown square: "
                     "a box (green on a target) · ring: a target · dark: a wall"}


# -- pure: HTML from stored values -------------------------------------------------------------
def env_picture_html(kind, body, label: str) -> str | None:
    """A stored picture as HTML: SVG or PNG as an ``<img>`` with a data URI, a table as an
    escaped table; None for an unknown kind or a body that is not what its kind says."""
    if not isinstance(body, str):
        return None
    alt = html.escape(label, quote=True)
    if kind in ("svg", "png"):
        uri = _data_uri(kind, body)
        return None if uri is None else _img_uri(uri, alt)
    if kind == "table":
        try:
            rows = json.loads(body)
        except ValueError:
            return None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            return None
        columns = list(dict.fromkeys(str(k) for r in rows for k in r))
        return html_table([{str(k): v for k, v in r.items()} for r in rows], columns)
    return None


def _img_uri(uri: str, alt: str, cls: str = "env-picture") -> str:
    return (f'<img class="{cls}" alt="{alt}" src="{uri}" '
            'style="max-width:100%;max-height:320px;border:1px solid #ddd"/>')


def board_img(svg: str, label: str) -> str:
    """Our own board (pages/_boards.py) as an ``<img>``, like any picture: st.html drops inline
    SVG, and one way of showing pictures is one thing to keep safe."""
    return _img_uri(_data_uri("svg", svg), html.escape(label, quote=True), "board")


def html_table(rows: list[dict], columns: list[str], caption: str = "") -> str:
    """An escaped HTML table of ``rows`` (values as text, each cut to ``MAX_CELL`` characters)."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_text(r.get(c)))}</td>" for c in columns)
                   + "</tr>" for r in rows)
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return ('<table class="state-table" style="border-collapse:collapse;font-size:0.85rem">'
            f"{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            "<style>.state-table td,.state-table th{border:1px solid #ddd;padding:2px 6px;"
            "text-align:left;vertical-align:top;overflow-wrap:anywhere}"
            ".state-table caption{text-align:left;color:#666}</style>")


def _text(value) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= MAX_CELL else text[:MAX_CELL] + "…"


DIFF_COLUMNS = ["table", "row", "change", "field", "before", "after"]


def diff_rows(diff) -> list[dict]:
    """A state diff (the apps world's ``[{table, op, key, before, after}]``) as one row per
    changed field: an update lists only the fields it changed, an insert every field of the new
    row (before empty), a delete every field of the old one. Entries of another shape become one
    row with the entry as text."""
    out = []
    for entry in diff if isinstance(diff, list) else [diff]:
        if not isinstance(entry, dict):
            out.append({"change": "(not a row change)", "after": entry})
            continue
        head = {"table": entry.get("table"), "row": entry.get("key"),
                "change": entry.get("op") or "change"}
        before, after = entry.get("before"), entry.get("after")
        before = before if isinstance(before, dict) else {}
        after = after if isinstance(after, dict) else {}
        fields = [f for f in dict.fromkeys([*before, *after])
                  if f not in before or f not in after or before[f] != after[f]]
        if not fields:
            out.append({**head, "before": entry.get("before"), "after": entry.get("after")})
        for f in fields:
            out.append({**head, "field": f, "before": before.get(f), "after": after.get(f)})
    return out


# -- drawing ---------------------------------------------------------------------------------
@st.cache_data(ttl=c.LIVE_TTL_S, max_entries=c.MAX_ENTRIES, show_spinner=False)
def load_renders(store: str, run_id: str, traj_id: str) -> pd.DataFrame:
    """The environment's pictures of one trajectory (empty for stores before schema 7)."""
    return queries.renders(store, run_id, traj_id)


def env_turn(observation) -> int | None:
    """The environment's own number of the state an observation shows (``Turn k: State``)."""
    block = _boards.state_block(observation)
    return None if block is None else block[0]


def render_notes(info, k: int) -> list[str]:
    """The rollout's notes on pictures of turn ``k``'s two states that were not kept (a render
    that raised or broke a cap), from the trajectory's stored info."""
    try:
        notes = json.loads(info).get("render_notes") if isinstance(info, str) else None
    except (ValueError, AttributeError):
        return []
    return [str(n.get("note"))[:500] for n in notes or [] if isinstance(n, dict)
            and n.get("turn") in (k - 1, k)]


FILMSTRIP_MAX = 24
"""The most states the filmstrip shows at once: a window around the current turn."""


def filmstrip_html(boards, renders: pd.DataFrame, n: int, current: int) -> str | None:
    """Every state of a trajectory of ``n`` turns as a row of small images: the start, then the
    state after each stored turn, from the environment's own SVG/PNG pictures when it stored
    them, else the grid world's boards; the current turn's two states outlined (solid: after
    its action). A window of ``FILMSTRIP_MAX`` around ``current``; None when there is nothing
    to draw (fewer than two pictures)."""
    frames: dict[int, str] = {}  # state index i: 0 the start, i the state after turn i - 1
    pictured = renders[renders["kind"].isin(["svg", "png"])] if not renders.empty else renders
    if not pictured.empty:
        for r in pictured.to_dict("records"):
            i = int(r["turn"]) + 1
            uri = _data_uri(r["kind"], r["body"])
            if 0 <= i <= n and uri:
                frames[i] = uri
    elif boards is not None:
        board, states = boards
        for i, entry in enumerate(states[:n + 1]):
            if entry is not None:
                state, path = entry
                frames[i] = _data_uri("svg", _boards.board_svg(board, state, path,
                                                               f"state {i}"))
    if len(frames) < 2:
        return None
    lo = max(0, min(current + 1 - FILMSTRIP_MAX // 2, n + 1 - FILMSTRIP_MAX))
    cells = []
    for i in range(lo, min(n + 1, lo + FILMSTRIP_MAX)):
        if i not in frames:
            continue
        name = "start" if i == 0 else f"after {i - 1}"
        ring = ("2px solid #d62728" if i == current + 1 else
                "2px dashed #d62728" if i == current else "1px solid #ddd")
        cells.append(f'<figure style="margin:0;text-align:center">'
                     f'<img class="frame" alt="{html.escape(name, quote=True)}" '
                     f'src="{frames[i]}" style="height:56px;border:{ring}"/>'
                     f'<figcaption style="font-size:0.7rem;color:#666">{name}</figcaption></figure>')
    return ('<div class="filmstrip" style="display:flex;gap:0.4rem;overflow-x:auto;'
            'align-items:flex-end;padding-bottom:0.3rem">' + "".join(cells) + "</div>")


def _data_uri(kind, body) -> str | None:
    """A stored SVG or PNG picture as a data URI (None for a body that is not what it says:
    not text, not base64, or bytes without PNG's signature)."""
    if not isinstance(body, str):
        return None
    if kind == "svg":
        return "data:image/svg+xml;base64," + base64.b64encode(
            body.encode("utf-8", "replace")).decode("ascii")
    if kind != "png":
        return None
    try:
        raw = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        return None
    if not raw.startswith(b"\x89PNG\r\n\x1a\n"):
        return None
    return "data:image/png;base64," + base64.b64encode(raw).decode("ascii")


def filmstrip(boards, renders: pd.DataFrame, n: int, current: int) -> None:
    """The trajectory's states in one row above the turn (``filmstrip_html``), when there are any."""
    strip = filmstrip_html(boards, renders, n, current)
    if strip:
        st.html(strip)


def pictures(boards, renders: pd.DataFrame, k: int, info=None, step_info=None) -> None:
    """The state turn ``k`` acted from and the one it left, side by side: the environment's own
    pictures when it stored them, else the grid world's boards, else nothing; then why any of
    the environment's pictures of them was not kept."""
    for note in render_notes(info, k):
        st.text(f"The environment's picture was not kept: {note}")
    figures = _env_figures(renders, k) if not renders.empty else None
    if figures is None and boards is not None:
        figures = _board_figures(boards, k, _boards.slips(step_info))
    if not figures:
        return
    st.html('<div class="state-pictures" style="display:flex;gap:1.5rem;align-items:flex-start;'
            'flex-wrap:wrap">' + "".join(
                f'<figure style="margin:0">{pic}<figcaption style="font-size:0.85rem;'
                f'color:#555">{html.escape(cap)}</figcaption></figure>' for cap, pic in figures)
            + "</div>")
    if boards is not None and renders.empty:
        st.caption(LEGEND[boards[0].game])


def _env_figures(renders: pd.DataFrame, k: int) -> list[tuple[str, str]] | None:
    by_turn = {int(r["turn"]): r for r in renders.to_dict("records")}
    figures = []
    for turn, when in ((k - 1, "Before the action"), (k, "After the action")):
        r = by_turn.get(turn)
        if r is None:
            continue
        cap = f"{when} (the environment's picture)"
        pic = env_picture_html(r["kind"], r["body"], cap)
        if pic is None:
            size = r.get("size")
            pic = html.escape(f"(picture not shown: {r['kind']!s:.20}, "
                              f"{'' if size is None else f'{int(size):,} bytes'})")
        figures.append((cap, pic))
    return figures or None


def _board_figures(boards, k: int, slipped: list[str]) -> list[tuple[str, str]]:
    board, states = boards
    figures = []
    for i, when in ((k, "Before the action"), (k + 1, "After the action")):
        if i >= len(states) or states[i] is None:
            continue
        state, path = states[i]
        cap = f"{when}: the environment's turn {state.turn} state"
        shown = cap + (f" · slipped: {', '.join(slipped)}" if slipped and i == k + 1 else "")
        figures.append((shown, board_img(_boards.board_svg(board, state, path, cap), cap)))
    return figures


def diff_table(state_diff: str) -> None:
    """A turn's state diff as a table of changed fields, the whole diff as recorded under it."""
    try:
        diff = json.loads(state_diff)
    except ValueError:
        st.code(state_diff, language=None, wrap_lines=True)
        return
    rows = diff_rows(diff)
    st.markdown(f"**State diff** · {len(rows)} field(s) the action changed")
    st.html(html_table(rows, DIFF_COLUMNS))
    with st.expander("As recorded (every field of each changed row)"):
        st.json(diff, expanded=False)
