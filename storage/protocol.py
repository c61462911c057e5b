"""The action vocabulary recorded trajectories are read with: Search-R1's ``<search>`` /
``<answer>`` tags, the action kinds that call a tool, and the finish reasons that mean the policy
ended the episode itself. The search environment parses actions with it, rewards charge tool
calls by it, and the failure taxonomy (storage/failures.py) reads imported runs with it, which
is why it lives here, below core. Pure, standard library only.
"""
from __future__ import annotations

import re

ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
"""The first <search>...</search> or <answer>...</answer> in an action."""

# Actions that call a tool and are charged ``cost_per_tool_call`` (grid moves and answers are not).
TOOL_ACTIONS = frozenset({"search", "tool", "code", "docs", "api"})
# Finish reasons that mean the policy ended the episode itself.
PROPER_ENDINGS = frozenset({"answered", "done"})


def parse_action(text: str | None) -> tuple[str, str] | None:
    """(kind, content) of the first <search>/<answer> action in text, content stripped; None if
    there is none. Never raises on arbitrary text."""
    match = ACTION.search(text or "")
    return (match.group(1), match.group(2).strip()) if match else None
