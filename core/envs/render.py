"""An episode's picture of its own state (the optional ``Episode.render()``), checked and bounded
before the rollout keeps it. Torch-free.

``render()`` may return:

    str              SVG text (``<svg ...>...</svg>``, an ``<?xml ...?>`` line before it allowed)
    bytes            a PNG image (its 8-byte signature first)
    list[dict]       a table: one dict per row, column name -> a JSON scalar
    None             nothing to show for this state

Replay shows SVG and PNG only as ``<img src="data:...">`` (a browser runs no script of an image
loaded that way) and a table as escaped text, so a user's picture can never run code in the
page; the caps here keep one picture from flooding the store. Anything else, or anything over a
cap, is not recorded: the rollout keeps a note saying why (core/rollout/episode.py).
"""
from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass

KINDS = ("svg", "png", "table")
MAX_BYTES = 200_000
"""The most one picture may take (SVG text, PNG bytes, a table's JSON): a 32 x 32 grid drawn as
SVG is about 60 KB; a whole step's pictures stay a few MB."""
MAX_ROWS, MAX_COLUMNS, MAX_CELL_CHARS = 200, 20, 500
"""A table's bounds: a state shown as more rows than this is read better as a picture."""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_SVG_START = re.compile(r"\s*(<\?xml[^>]{0,200}\?>\s*)?(<!--.{0,500}?-->\s*)*<svg[\s>]",
                        re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class Picture:
    kind: str
    """svg | png | table"""
    body: str
    """SVG text, the PNG as base64, or the table's rows as JSON."""


def checked_render(value) -> Picture | None | str:
    """``value`` (what ``render()`` returned) as a ``Picture``, None when it is None, or the reason
    it is not kept (wrong type, not SVG/PNG, a malformed table, over ``MAX_BYTES``)."""
    if value is None:
        return None
    if isinstance(value, str):
        if not _SVG_START.match(value[:2000]):
            return "render returned text that does not start with <svg>: only SVG text is kept"
        return _capped("svg", value, len(value.encode("utf-8", "replace")))
    if isinstance(value, (bytes, bytearray)):
        if not bytes(value[:8]) == PNG_SIGNATURE:
            return "render returned bytes that are not a PNG image (no PNG signature)"
        if len(value) > MAX_BYTES:
            return _over("png", len(value))
        return Picture("png", base64.b64encode(bytes(value)).decode("ascii"))
    if isinstance(value, list):
        rows = _table(value)
        if isinstance(rows, str):
            return rows
        body = json.dumps(rows, ensure_ascii=False)
        return _capped("table", body, len(body.encode("utf-8", "replace")))
    return (f"render returned {type(value).__name__}; expected SVG text, PNG bytes, a list of "
            "row dicts or None")


def _table(rows: list) -> list[dict] | str:
    """The rows with every cell a JSON scalar (text cut to ``MAX_CELL_CHARS``), or why not."""
    if len(rows) > MAX_ROWS:
        return f"render returned a table of {len(rows):,} rows; at most {MAX_ROWS} are kept"
    out = []
    for row in rows:
        if not isinstance(row, dict) or not all(isinstance(k, str) for k in row):
            return "render returned a table whose rows are not dicts with text keys"
        if len(row) > MAX_COLUMNS:
            return f"render returned a table row of {len(row)} columns; at most {MAX_COLUMNS}"
        out.append({k[:MAX_CELL_CHARS]: _scalar(v) for k, v in row.items()})
    return out


def _scalar(value):
    if value is None or isinstance(value, bool) or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    text = value if isinstance(value, str) else repr(value)
    return text[:MAX_CELL_CHARS]


def _capped(kind: str, body: str, size: int) -> Picture | str:
    return Picture(kind, body) if size <= MAX_BYTES else _over(kind, size)


def _over(kind: str, size: int) -> str:
    return (f"render returned {size:,} bytes of {kind}; the cap is {MAX_BYTES:,} "
            "(core/envs/render.py MAX_BYTES): not recorded")
