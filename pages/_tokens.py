"""The token view (one trajectory's whole context as the model saw it) and the mask lint.

The view is HTML built here and nowhere else: every token's text and every hover title goes
through ``html.escape`` -- the text comes from a model or an imported file and may hold markup
(``<script>``, ``<img onerror=...>``) that must show as text.
"""
from __future__ import annotations

import html
import math

import pandas as pd

MODES = {
    "loss mask": None,
    "sampling logprob": "logprob",
    "entropy": "entropy",
    "advantage": "advantage",
    "mismatch": "mismatch",
}
"""Colouring choices of the token view -> the tokens column each one reads (``mismatch``:
train_logprob - logprob, added by ``with_mismatch``)."""
MISMATCH_FULL = 0.1
"""|d| (nats) at which the mismatch colour is full: a ratio about 0.9 or 1.1, the band's edge."""


def with_mismatch(tokens: pd.DataFrame) -> pd.DataFrame:
    """``tokens`` with a ``mismatch`` column, d = train_logprob - logprob (the trainer's logprob
    against the sampler's; NaN where either is missing, e.g. stores recorded before it)."""
    train = pd.to_numeric(tokens.get("train_logprob"), errors="coerce") \
        if "train_logprob" in tokens else float("nan")
    return tokens.assign(mismatch=train - pd.to_numeric(tokens["logprob"], errors="coerce"))

_ROLE_BG = {"prompt": "rgba(80,120,220,0.12)", "observation": "rgba(130,130,130,0.18)"}
_TRAINED_BG = "rgba(46,160,67,0.38)"
_WRONG_BG = "rgba(220,40,40,0.55)"
_REJECTED_BG = "rgba(230,160,20,0.45)"
"""An action token rollout correction took out of the loss (``--rollout-correction mis|rs``):
untrained on purpose, not a mask error."""


def _rejected(tokens: pd.DataFrame) -> pd.Series:
    """Whether each token is marked rejected (False where the store has no mark)."""
    if "rejected" not in tokens:
        return pd.Series(False, index=tokens.index)
    return tokens["rejected"].astype(object).where(tokens["rejected"].notna(), False).astype(bool)


def _num(value) -> float | None:
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def _title(row: dict) -> str:
    parts = [f"pos {row['pos']}", str(row.get("role")), f"turn {row.get('turn')}",
             "trained" if row.get("trained") else
             "rejected by rollout correction" if row.get("rejected") is True else "not trained",
             f"token_id {row.get('token_id')}"]
    lp = _num(row.get("logprob"))
    if lp is not None:
        parts.append(f"logprob {lp:.4f} (p={math.exp(lp):.3f})")
    for name in ("entropy", "advantage", "new_logprob", "ref_logprob", "value", "train_logprob"):
        v = _num(row.get(name))
        if v is not None:
            parts.append(f"{name} {v:.4f}")
    d = _num(row.get("mismatch"))
    if d is not None:
        parts.append(f"mismatch d {d:+.3g} (ratio {math.exp(min(d, 50.0)):.4f})")
    return " | ".join(parts)


def _background(row: dict, mode: str, scale: float, updated: bool = True) -> str:
    """CSS background of one token under ``mode`` (scale: the largest |value| of the trajectory;
    ``updated``: the trajectory took part in an update, so its action tokens should be trained)."""
    role, trained = row.get("role"), bool(row.get("trained"))
    if mode == "loss mask":
        if row.get("rejected") is True and role == "action" and not trained:
            return _REJECTED_BG
        if trained != (role == "action" and updated):
            return _WRONG_BG  # an observation/prompt token trained, or a model token masked
        return _TRAINED_BG if trained else _ROLE_BG.get(role, "transparent")
    value = _num(row.get(MODES[mode]))
    if value is None:
        return _ROLE_BG.get(role, "transparent")
    if mode == "sampling logprob":  # red where the sampled token was unlikely
        return f"rgba(220,40,40,{0.85 * (1 - math.exp(min(value, 0.0))):.3f})"
    strength = min(abs(value) / scale, 1.0) if scale > 0 else 0.0
    if mode == "entropy":
        return f"rgba(255,150,0,{0.8 * strength:.3f})"
    if mode == "mismatch":  # an absolute scale: a ratio at the band's edge is full purple
        return f"rgba(140,60,200,{0.85 * min(abs(value) / MISMATCH_FULL, 1.0):.3f})"
    colour = "46,160,67" if value >= 0 else "220,40,40"  # advantage: green helps, red hurts
    return f"rgba({colour},{0.75 * strength:.3f})"


def token_html(tokens: pd.DataFrame, mode: str, updated: bool = True) -> str:
    """The context as escaped, coloured spans with the exact values in each span's title.
    ``updated=False`` for a trajectory no update used (a held-out evaluation, one filtered out):
    its action tokens are untrained by design, not a mask error."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    column = MODES[mode]
    scale = 0.0
    if column and column in tokens:
        values = pd.to_numeric(tokens[column], errors="coerce").abs()
        scale = float(values.max()) if values.notna().any() else 0.0
    spans = []
    for row in tokens.to_dict("records"):
        text = html.escape(str(row.get("text") or ""), quote=True)
        title = html.escape(_title(row), quote=True)
        bg = _background(row, mode, scale, updated)
        edge = "border-bottom:2px solid rgba(46,160,67,0.9);" if row.get("trained") else ""
        spans.append(f'<span title="{title}" style="background:{bg};{edge}'
                     f'box-shadow:inset -1px 0 0 rgba(0,0,0,0.12)">{text}</span>')
    return ('<div class="token-view" style="font-family:monospace;font-size:0.82rem;'
            'white-space:pre-wrap;word-break:break-word;line-height:1.7;padding:0.5rem;'
            'border:1px solid rgba(128,128,128,0.3);border-radius:0.4rem;max-height:32rem;'
            'overflow-y:auto">' + "".join(spans) + "</div>")


LEGEND = {
    "loss mask": "green underline/background: trained (the model's own tokens); blue: prompt; "
                 "grey: observation; amber: action rejected by rollout correction (mis/rs); "
                 "red: mask error (observation trained or action masked)",
    "sampling logprob": "redder = less likely under the sampling policy; uncoloured: no logprob",
    "entropy": "more orange = higher entropy of the sampling distribution at that token",
    "advantage": "green = positive advantage, red = negative; strength relative to the largest",
    "mismatch": "more purple = the trainer's logprob further from the sampler's, full at |d| = "
                f"{MISMATCH_FULL:g} nats (a ratio near 0.9 or 1.1); hover for d and the ratio",
}


def mask_lint(tokens: pd.DataFrame, turns: pd.DataFrame, updated: bool = True) -> pd.DataFrame:
    """Problems with the loss mask or the lengths, one row per (issue, turn).

    * an observation or prompt token that was trained (the model would learn to imitate the
      environment);
    * a model action token that was masked (its credit silently dropped) -- only in a trajectory
      an update used (``updated``): evaluations and filtered-out rollouts train nothing;
    * a turn whose action was cut by the token limit or whose observation was truncated.
    """
    rows = []
    if not tokens.empty:
        trained = tokens["trained"].fillna(False).astype(bool)
        not_model = tokens["role"].isin(["observation", "prompt"])
        checks = [("observation/prompt token trained", not_model & trained)]
        if updated:
            checks.append(("action token not trained",  # rollout correction's are on purpose
                           (tokens["role"] == "action") & ~trained & ~_rejected(tokens)))
        else:
            checks.append(("token trained in a trajectory no update used", trained & ~not_model))
        for issue, mask in checks:
            for turn, part in tokens[mask].groupby("turn", dropna=False):
                pos = part["pos"].tolist()
                shown = ", ".join(map(str, pos[:12])) + (" ..." if len(pos) > 12 else "")
                rows.append({"issue": issue, "turn": turn, "tokens": len(pos), "positions": shown})
    for t in turns.to_dict("records") if not turns.empty else []:
        if t.get("action_truncated"):
            rows.append({"issue": "action cut by the token limit", "turn": t["turn"],
                         "tokens": None, "positions": ""})
        if t.get("obs_truncated"):
            rows.append({"issue": "observation truncated", "turn": t["turn"], "tokens": None,
                         "positions": ""})
    return pd.DataFrame(rows, columns=["issue", "turn", "tokens", "positions"])
