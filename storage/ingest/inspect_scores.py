"""Inspect AI scores as reward components (storage/ingest/inspect_log.py reads the logs): Inspect's own
conversion of a score value to a float, the components of one score, the primary scorer."""
from __future__ import annotations

import json
import math
from typing import Any

from storage.interchange import LineError

CORRECT, INCORRECT, PARTIAL, NOANSWER = "C", "I", "P", "N"  # inspect_ai.scorer's defaults
MAX_SCORE_VALUES = 1_000


# -- scores ----------------------------------------------------------------------------------------
def value_to_float(value: Any) -> tuple[float, str | None]:
    """(float, note) by inspect_ai.scorer.value_to_float (0.3.285), in its order: ``== "C"`` ->
    1, ``== "P"`` -> 0.5, ``== "I"`` or ``== "N"`` -> 0; a number or bool -> float(value); a
    string, lower-cased: yes/true -> 1, no/false -> 0, a finite number -> float; anything else ->
    0 with a warning (here, the note)."""
    if value == CORRECT:
        return 1.0, None
    if value == PARTIAL:
        return 0.5, None
    if value == INCORRECT or value == NOANSWER:
        return 0.0, None
    if isinstance(value, (int, float, bool)):
        return float(value), None
    if isinstance(value, str):
        low = value.lower()
        if low in ("yes", "true"):
            return 1.0, None
        if low in ("no", "false"):
            return 0.0, None
        try:
            number = float(low)
            if math.isfinite(number):
                return number, None
        except ValueError:
            pass
    return 0.0, f"{str(value)[:40]!r} is not a value Inspect converts: 0.0, as Inspect does"


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))


def score_components(name: str, value: Any) -> tuple[dict[str, float], list[str]]:
    """Components of one score (``score/{name}``, or one per key/element) and notes; LineError
    for a value Inspect's ``Value`` type does not allow (scalar, list of scalars, or object of
    scalars and nulls)."""
    if isinstance(value, (list, dict)) and len(value) > MAX_SCORE_VALUES:
        raise LineError(f"score {name!r} holds {len(value)} values, over the limit of "
                        f"{MAX_SCORE_VALUES} (each is a reward component)")
    if _scalar(value):
        items = {f"score/{name}": value}
    elif isinstance(value, list) and value and all(_scalar(v) for v in value):
        items = {f"score/{name}/{i}": v for i, v in enumerate(value)}
    elif isinstance(value, dict) and value and all(_scalar(v) or v is None for v in value.values()):
        items = {f"score/{name}/{k}": v for k, v in value.items()}
    else:
        kind = "null" if value is None else type(value).__name__
        raise LineError(f"score {name!r} has a value Inspect does not allow ({kind}: "
                        f"{json.dumps(value, default=str)[:60]})")
    out, notes = {}, []
    for key, v in items.items():
        number, note = value_to_float(v)
        if not math.isfinite(number):
            raise LineError(f"score {name!r} is not a finite number ({v!r})")
        out[key] = number
        if note:
            notes.append(f"{key}: {note}")
    return out, notes


def primary_scorer(spec: dict, results: dict | None) -> str | None:
    """The scorer Inspect headlines: results.headline, else the eval's first scorer."""
    headline = (results or {}).get("headline")
    for name in (headline.get("score"), headline.get("scorer")) \
            if isinstance(headline, dict) else ():
        if isinstance(name, str):
            return name
    scorers = spec.get("scorers")
    if isinstance(scorers, list) and scorers and isinstance(scorers[0], dict) \
            and isinstance(scorers[0].get("name"), str):
        return scorers[0]["name"]
    return None
