"""Alarms over a run's metric curves: gradient-norm spikes and the onset of collapse.

Pure functions over pandas Series indexed by step; the Dynamics page draws what they return.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

SPIKE_WINDOW = 10
"""Steps of history each step is compared with (the ones before it, not itself)."""
SPIKE_K = 5.0
"""A step is a spike when norm > median + K * 1.4826 * MAD of the window. 1.4826 * MAD estimates
the standard deviation of normal noise without being dragged up by earlier spikes, so K = 5 is a
'five sigma' excursion: rare by chance, while a real blow-up (often 10x the median) clears it."""
SPIKE_MIN_HISTORY = 3
"""Fewer earlier steps than this: no judgement (the first steps of a run are noisy)."""
MAD_FLOOR = 0.05
"""The MAD is floored at 5% of the median: a perfectly flat history does not flag tiny wiggles."""


def spike_threshold(norms: pd.Series, window: int = SPIKE_WINDOW,
                    k: float = SPIKE_K) -> pd.DataFrame:
    """Per step: the rolling median of the previous ``window`` values, the threshold, spike flag.

        median_t = median(x_{t-w} .. x_{t-1})     MAD_t = median(|x_i - median_t|)
        spike_t  = x_t > median_t + k * 1.4826 * max(MAD_t, 0.05 * median_t)
    """
    x = norms.dropna().astype(float).sort_index()
    med, thr = [], []
    values = x.to_numpy()
    for i in range(len(values)):
        past = values[max(0, i - window):i]
        if len(past) < SPIKE_MIN_HISTORY:
            med.append(np.nan)
            thr.append(np.nan)
            continue
        m = float(np.median(past))
        mad = max(float(np.median(np.abs(past - m))), MAD_FLOOR * abs(m))
        med.append(m)
        thr.append(m + k * 1.4826 * mad)
    out = pd.DataFrame({"value": values, "median": med, "threshold": thr}, index=x.index)
    out["spike"] = out["value"] > out["threshold"]
    return out


COLLAPSE_DROP = 0.5
"""In-group std and entropy both below this fraction of their best value so far -> collapse."""
REPEAT_LEVEL = 0.5
"""collapse/repeat_frac above this (half the rollouts repeat an action sequence) -> Echo Trap."""


def _onsets(flag: pd.Series) -> list:
    """Steps where ``flag`` turns on (False -> True)."""
    flag = flag.fillna(False).astype(bool)
    starts = flag & ~flag.shift(1, fill_value=False)
    return [int(s) for s in flag.index[starts]]


def collapse_alarms(wide: pd.DataFrame) -> list[dict]:
    """Where collapse signals start, as [{step, kind, message}] (RAGEN's Echo Trap: in-group
    reward std and entropy fall first; repeated action sequences rise).

    * ``std+entropy``: reward/group_std_mean and policy/entropy are both below COLLAPSE_DROP of
      their running maximum at the same step;
    * ``repeats``: collapse/repeat_frac rises above REPEAT_LEVEL.
    """
    alarms = []
    if {"reward/group_std_mean", "policy/entropy"} <= set(wide.columns):
        std, ent = wide["reward/group_std_mean"], wide["policy/entropy"]
        low = (std < COLLAPSE_DROP * std.cummax()) & (ent < COLLAPSE_DROP * ent.cummax())
        for s in _onsets(low):
            alarms.append({"step": s, "kind": "std+entropy",
                           "message": "in-group reward std and entropy both fell below "
                                      f"{COLLAPSE_DROP:.0%} of their best"})
    if "collapse/repeat_frac" in wide.columns:
        for s in _onsets(wide["collapse/repeat_frac"] > REPEAT_LEVEL):
            alarms.append({"step": s, "kind": "repeats",
                           "message": f"over {REPEAT_LEVEL:.0%} of rollouts repeat an "
                                      "action sequence"})
    return sorted(alarms, key=lambda a: a["step"])
