"""The action vocabulary recorded trajectories are read with: Search-R1's ``<search>`` /
``<answer>`` tags, the action kinds that call a tool, and the finish reasons that mean the policy
ended the episode itself. The search environment parses actions with it, rewards charge tool
calls by it, and the failure taxonomy (storage/failures.py) reads imported runs with it, which
is why it lives here, below core. Also how a tool call of an imported chat or evaluation log is
written into its action, ``name(arg=value, ...)`` (storage/ingest/messages.py), which Replay
(pages/_calls.py) takes apart again. Pure, standard library only.
"""
from __future__ import annotations

import json
import re
from typing import Any

# Actions that call a tool and are charged ``cost_per_tool_call`` (grid moves and answers are
# not), and the finish reasons that mean the policy ended the episode itself: the trajectory
# model's action protocol (storage/trajectory.py ``ACTION_TYPES``).
from storage.trajectory import PROPER_ENDINGS, TOOL_ACTIONS  # noqa: F401

ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
"""The first <search>...</search> or <answer>...</answer> in an action."""


def parse_action(text: str | None) -> tuple[str, str] | None:
    """(kind, content) of the first <search>/<answer> action in text, content stripped; None if
    there is none. Never raises on arbitrary text."""
    match = ACTION.search(text or "")
    return (match.group(1), match.group(2).strip()) if match else None


def _value(v: Any) -> str:
    if isinstance(v, str) and "\n" in v:
        return f'"""\n{v}\n"""'  # code and commands stay readable: no \n escapes
    return json.dumps(v, ensure_ascii=False)


def render_call(name: str, arguments: Any) -> str:
    """``name(x=2, y=3)``; arguments that are not an object are shown whole."""
    if isinstance(arguments, dict):
        return f"{name}({', '.join(f'{k}={_value(v)}' for k, v in arguments.items())})"
    return f"{name}({'' if arguments is None else _value(arguments)})"
