"""The Groups page's grid of a group's turns: a row per rollout, a column per turn.

HTML built here, escaped here: the cells are model actions and tool observations.
"""
from __future__ import annotations

import html

import pandas as pd

from pages._common import readable

CELL_CHARS = 400
"""Longer texts are cut (Replay shows them whole)."""


def turn_grid(turns: pd.DataFrame, ids: list[str], field: str = "action") -> pd.DataFrame:
    """``turns[field]`` with a row per rollout (in the order of ``ids``) and a column per turn
    (``turn 0``, ...); '' where a rollout had no such turn. Chat-template markers are left out
    (a view for reading; Replay's token view keeps them)."""
    grid = turns.pivot_table(index="traj_id", columns="turn", values=field, aggfunc="first")
    grid = grid.reindex(index=ids).map(lambda s: readable(s) or "").map(
        lambda s: s if len(s) <= CELL_CHARS else s[:CELL_CHARS] + " ...")
    grid.columns = [f"turn {t}" for t in grid.columns]
    return grid


def grid_html(grid: pd.DataFrame, mark: str | None = None) -> str:
    """``grid`` (index: rollout ids, columns: turns) as an HTML table that fits its container:
    fixed column widths, text wrapped. Every id, header and cell goes through ``html.escape``
    (actions and observations are model and tool output); column ``mark`` is highlighted.
    (st.table would render each cell as markdown: a model's ``![](url)`` would load.)"""
    def cell(tag: str, text, col=None, style: str = "") -> str:
        if col is not None and col == mark:
            style += "background:rgba(255,190,0,0.3);"
        return f'<{tag} style="{style}">{html.escape(str(text), quote=True)}</{tag}>'
    edge = "border:1px solid rgba(128,128,128,0.3);padding:0.25rem 0.4rem;vertical-align:top;"
    head = cell("th", "rollout", style=edge + "width:7.5rem;text-align:left") + "".join(
        cell("th", col, col, edge + "text-align:left") for col in grid.columns)
    rows = ["<tr>" + cell("th", idx, style=edge + "text-align:left;font-weight:normal")
            + "".join(cell("td", grid.at[idx, col], col, edge) for col in grid.columns)
            + "</tr>" for idx in grid.index]
    return ('<table class="turn-grid" style="table-layout:fixed;width:100%;'
            'border-collapse:collapse;font-size:0.8rem;line-height:1.35;white-space:pre-wrap;'
            'overflow-wrap:anywhere">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
