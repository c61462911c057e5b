"""The Runs page's list: runs grouped by store and experiment, each group a table that fits the
window (names and classes wrapped, never cut, no sideways scroll), and which run the sidebar
picks when nothing named one.

HTML built here, escaped here: run names, envs and models come from stores (imported files
choose them). A sparkline is an inline SVG drawn from numbers only.
"""
from __future__ import annotations

import base64
import html
import math
import re
from urllib.parse import urlencode

import pandas as pd

from pages._common import int_of, missing, text_of
from storage.queries import run_config

CROSS_EVALUATIONS = "cross-evaluations"


def is_cross_evaluation(run_id, config: dict) -> bool:
    """A checkpoint evaluated on another run's tasks (core/jobs/evaluation.py): one evaluation,
    no training curve of its own."""
    return "cross_eval" in (config or {}) or str(run_id).startswith("xeval-")


def experiment_of(name, run_id, config: dict) -> str:
    """The experiment a run belongs to in its store: cross-evaluations together, else the run
    name's first word (up to a space, ':', '-' or '·'), which is how the sample runs and the
    Train page's defaults name a series ("credit grpo seed 0", "credit spa seed 0", ...)."""
    if is_cross_evaluation(run_id, config):
        return CROSS_EVALUATIONS
    words = re.split(r"[\s:·-]+", (text_of(name) or str(run_id)).strip())
    return next((w for w in words if w), str(run_id))


def worth_opening(table: pd.DataFrame) -> int | None:
    """The row the sidebar picks when no link named a run: the newest run (``table`` is newest
    first) that recorded a step, did not fail and is not a cross-evaluation (a single evaluation
    with no reward curve: a poor first view). None when ``table`` is empty."""
    if table.empty:
        return None
    for i, row in table.iterrows():
        config = run_config(row.get("config"))
        if missing(row.get("last_step")) or row.get("shown_status") in ("failed", "unreadable"):
            continue
        if is_cross_evaluation(row.get("run_id"), config):
            continue
        return i
    return table.index[0]


def groups(frame: pd.DataFrame) -> list[tuple[str, list[tuple[str, pd.DataFrame]]]]:
    """[(store, [(experiment, rows)])]: stores in the order of their newest run, experiments in
    the order of theirs, cross-evaluations last; rows keep ``frame``'s order (newest first)."""
    out = []
    for store, part in frame.groupby("store", sort=False):
        experiments = list(part.groupby("experiment", sort=False))
        experiments.sort(key=lambda e: e[0] == CROSS_EVALUATIONS)
        out.append((store, experiments))
    return out


def spark_svg(values, width: int = 80, height: int = 22) -> str:
    """A sparkline of finite ``values``: an SVG polyline, as an image ('' for fewer than two)."""
    ys = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if len(ys) < 2:
        return ""
    lo, hi = min(ys), max(ys)
    span = (hi - lo) or 1.0
    points = " ".join(f"{i * (width - 2) / (len(ys) - 1) + 1:.1f},"
                      f"{height - 1 - (y - lo) / span * (height - 2):.1f}"
                      for i, y in enumerate(ys))
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}"><polyline fill="none" stroke="#e0424b" '
           f'stroke-width="1.5" points="{points}"/></svg>')
    # as an image: st.html's sanitiser drops inline <svg>; a data URI of numbers only is inert
    return (f'<img alt="" width="{width}" height="{height}" style="max-width:100%;height:auto" '
            f'src="data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()}">')


def _number(value) -> str:
    if value is None or missing(value):
        return "–"
    value = float(value)
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


COLUMNS = (("run", "27%"), ("status", "7%"), ("env", "11%"), ("algo", "9%"), ("model", "10%"),
           ("reward/mean", "10.5%"), ("success/rate", "10.5%"), ("last step", "5%"),
           ("created (UTC)", "10%"))
"""Header and width: the window's width shared out, text wrapped inside each cell."""


def table_html(rows: pd.DataFrame, picked: tuple[str, str] | None = None) -> str:
    """One group's runs as an HTML table that fits its container. Each run's name links to it on
    Dynamics; its short id under the name; last value and sparkline of reward and success."""
    esc = lambda text: html.escape(str(text), quote=True)  # noqa: E731
    edge = "border:1px solid rgba(128,128,128,0.25);padding:0.3rem 0.45rem;vertical-align:top;"
    head = "".join(f'<th style="{edge}width:{w};text-align:left;font-weight:600">{esc(h)}</th>'
                   for h, w in COLUMNS)
    body = []
    for r in rows.to_dict("records"):
        link = "dynamics?" + urlencode({"store": r["store"], "run": r["run_id"]})
        here = picked == (r["store"], r["run_id"])
        name = (f'<a href="{esc(link)}" target="_self">{esc(r["run"])}</a>'
                f'<br><span style="opacity:0.6;font-size:0.72rem">{esc(r["run_id"])}'
                + (" · shown in the sidebar" if here else "") + "</span>")
        created = "" if missing(r.get("created")) else \
            pd.Timestamp(r["created"]).strftime("%Y-%m-%d %H:%M")  # date, then time below
        cells = [name, esc(r["status"]), esc(text_of(r.get("env")) or "–"),
                 esc(text_of(r.get("algo")) or "–"), esc(text_of(r.get("model")) or "–")]
        for metric in ("reward/mean", "success/rate"):
            cells.append(f'{_number(r.get(f"last {metric}"))}<br>{spark_svg(r.get(metric) or [])}')
        step = int_of(r.get("last step"), -1)
        cells += [esc(step) if step >= 0 else "–", esc(created).replace(" ", "<br>")]
        style = "background:rgba(255,190,0,0.15);" if here else ""
        body.append(f'<tr style="{style}">' + "".join(f'<td style="{edge}">{c}</td>'
                                                      for c in cells) + "</tr>")
    return ('<table class="run-list" style="table-layout:fixed;width:100%;border-collapse:collapse;'
            'font-size:0.82rem;line-height:1.35;overflow-wrap:break-word">'
            f'<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')
