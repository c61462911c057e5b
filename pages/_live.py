"""Replay of an OpenTelemetry trajectory whose agent still runs (storage/otlp/): the receiver
rewrites it as its spans arrive while its step (the key of the cached reads) stays the same, so
such a trajectory and its turns are read fresh, and the page says it is live."""
from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from pages import _common as c
from storage import queries


def otel_of(info) -> dict:
    """``info.otel`` of a trajectory row ({} when it was not received over OTLP)."""
    try:
        otel = json.loads(c.text_of(info) or "{}").get("otel")
    except (ValueError, AttributeError):
        return {}
    return otel if isinstance(otel, dict) else {}


def fresh(pick: c.Pick, traj_id: str, row: dict) -> tuple[dict, bool]:
    """(the row, whether it was read now): a row the cache holds as open is read again."""
    if not otel_of(row.get("info")).get("open"):
        return row, False
    now = c.read_or_stop(queries.trajectory, pick.store, pick.run_id, traj_id)
    return (now or row), True


def turns(pick: c.Pick, traj_id: str, read_now: bool) -> pd.DataFrame:
    if read_now:
        return c.read_or_stop(queries.turns, pick.store, pick.run_id, [traj_id])
    return c.load_turns(pick.store, pick.run_id, (traj_id,))


def hint(row: dict) -> None:
    """A line above the turns while the trajectory's agent still runs."""
    otel = otel_of(row.get("info"))
    if otel.get("open"):
        spans = c.int_of(otel.get("spans"), 0)
        st.info(f"Live: this agent is still running. Its trajectory is rewritten as its spans "
                f"arrive ({spans} so far); reload the page for the turns since.")
