"""Alarms over a run's metric curves: gradient-norm spikes and the onset of collapse; and what
a run's KL curve was measured against.

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
SPIKE_FLOOR = 0.05
"""No threshold below this absolute norm. Where the recent norms are nearly 0 (groups with zero
reward variance give no gradient), five MADs of nearly nothing flag noise: on spike_frozenlake
the median before step 29 is 0.0014, the threshold 0.0039, and steps 29-30 (norms 0.0071 and
0.0051, after the real spike of 1.39 and 1.53 at steps 27-28) were flagged. 0.05 is under the
ordinary steps of the sample runs that learn (median grad/norm 0.07-0.66 on the bandit runs,
0.13 on SmolLM2 search) and far under a blow-up."""


def spike_threshold(norms: pd.Series, window: int = SPIKE_WINDOW, k: float = SPIKE_K,
                    floor: float = SPIKE_FLOOR) -> pd.DataFrame:
    """Per step: the rolling median of the previous ``window`` values, the threshold, spike flag.

        median_t = median(x_{t-w} .. x_{t-1})     MAD_t = median(|x_i - median_t|)
        spike_t  = x_t > max(median_t + k * 1.4826 * max(MAD_t, 0.05 * median_t), floor)
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
        thr.append(max(m + k * 1.4826 * mad, floor))
    out = pd.DataFrame({"value": values, "median": med, "threshold": thr}, index=x.index)
    out["spike"] = out["value"] > out["threshold"]
    return out


COLLAPSE_DROP = 0.5
"""In-group std and entropy both below this fraction of their best value so far -> collapse."""
REPEAT_LEVEL = 0.5
"""Over this share of rollouts repeating a *failed* action sequence -> Echo Trap."""


def single_turn(config: dict) -> bool:
    """A run whose episodes are one action each (``max_turns`` 1, e.g. the bandit)."""
    try:
        return int(config.get("max_turns")) == 1
    except (TypeError, ValueError):
        return False


def failed_repeats(wide: pd.DataFrame) -> pd.Series | None:
    """Per step, the share of rollouts that repeat another's action sequence and failed.

    ``collapse/repeat_fail_frac`` where the trainer recorded it; for runs recorded before it,
    the lower bound ``max(repeat_frac - success/rate, 0)`` (a repeat that succeeded is one of the
    successes, so at most success/rate of the repeats succeeded). None without repeat metrics."""
    if "collapse/repeat_fail_frac" in wide.columns:
        return wide["collapse/repeat_fail_frac"]
    if "collapse/repeat_frac" not in wide.columns:
        return None
    if "success/rate" not in wide.columns:
        return wide["collapse/repeat_frac"]
    return wide["collapse/repeat_frac"].sub(wide["success/rate"], fill_value=0).clip(lower=0)


def _onsets(flag: pd.Series) -> list:
    """Steps where ``flag`` turns on (False -> True)."""
    flag = flag.fillna(False).astype(bool)
    starts = flag & ~flag.shift(1, fill_value=False)
    return [int(s) for s in flag.index[starts]]


DRIFT_WINDOW = 5
"""Steps in the baseline (the first ones with a mismatch) and in the rolling median compared."""
DRIFT_RATIO = 2.0
DRIFT_FLOOR = 0.005
"""Mismatch drift: the rolling median of mismatch/abs_mean over DRIFT_WINDOW steps reaches both
DRIFT_RATIO x its baseline (the median of the run's first DRIFT_WINDOW steps) and the baseline +
DRIFT_FLOOR nats. The ratio catches slime/vime issue 64's drift (0.011 -> 0.036 over 30 steps);
the floor keeps a healthy fp32 run (|d| ~ 1e-6, where doubling is rounding) from alarming, and
the medians keep one odd step from starting an alarm."""


def mismatch_alarms(wide: pd.DataFrame, window: int = DRIFT_WINDOW) -> list[dict]:
    """Onsets of mismatch drift (see DRIFT_RATIO), as [{step, kind, message}]; none before
    2 x ``window`` steps carry the metric."""
    if "mismatch/abs_mean" not in wide.columns:
        return []
    series = wide["mismatch/abs_mean"].dropna()
    if len(series) < 2 * window:
        return []
    base = float(series.iloc[:window].median())
    rolling = series.rolling(window).median()
    drift = (rolling >= DRIFT_RATIO * base) & (rolling >= base + DRIFT_FLOOR)
    return [{"step": s, "kind": "mismatch",
             "message": f"the sampler-trainer mismatch (median |lp_train - lp_sampler| over "
                        f"{window} steps) reached {DRIFT_RATIO:g}x its first steps' {base:.4f}"}
            for s in _onsets(drift)]


def collapse_alarms(wide: pd.DataFrame, single_turn: bool = False) -> list[dict]:
    """Where collapse signals start, as [{step, kind, message}] by step (RAGEN's Echo Trap:
    in-group reward std and entropy fall first; repeated action sequences rise).

    * ``std+entropy``: reward/group_std_mean and policy/entropy are both below COLLAPSE_DROP of
      their running maximum at the same step;
    * ``repeats``: the share of rollouts repeating a failed action sequence (failed_repeats)
      rises above REPEAT_LEVEL. Never on a ``single_turn`` run: G rollouts choosing among a few
      answers repeat by construction, and repeating the right one is the solution.
    """
    alarms = []
    if {"reward/group_std_mean", "policy/entropy"} <= set(wide.columns):
        std, ent = wide["reward/group_std_mean"], wide["policy/entropy"]
        low = (std < COLLAPSE_DROP * std.cummax()) & (ent < COLLAPSE_DROP * ent.cummax())
        for s in _onsets(low):
            alarms.append({"step": s, "kind": "std+entropy",
                           "message": "in-group reward std and entropy both fell below "
                                      f"{COLLAPSE_DROP:.0%} of their best"})
    repeats = None if single_turn else failed_repeats(wide)
    if repeats is not None:
        for s in _onsets(repeats > REPEAT_LEVEL):
            alarms.append({"step": s, "kind": "repeats",
                           "message": f"over {REPEAT_LEVEL:.0%} of rollouts repeat an "
                                      "action sequence that failed"})
    return sorted(alarms, key=lambda a: a["step"])


KL_MEASURE = ("policy/kl (k3 estimate over the trained tokens) is measured against "
              "{reference}{penalty}; policy/approx_kl against the policy that sampled the step's "
              "rollouts.")


def kl_reference_note(config: dict, imported: bool = False) -> str:
    """What a run's policy/kl was measured against, read from its config.

    ``kl_reference`` is ``sft`` (the policy at the start of RL: the LoRA adapter frozen after the
    SFT warm start; the default since the key exists) or ``base`` (adapters off). Runs recorded
    before the key existed always used the base model. An imported run's KL is its trainer's."""
    if imported:
        return ("policy/kl and policy/approx_kl as the trainer that recorded it measured them "
                "(its reference model is not recorded here).")
    choice = config.get("kl_reference")
    if choice is None:
        reference = ("the base model (LoRA adapters off): this run was recorded before the "
                     "reference became configurable")
    elif choice == "base":
        reference = "the base model (LoRA adapters off), as configured (`kl_reference` = base)"
    elif choice == "sft":
        sft = config.get("sft_steps")
        if sft == 0:
            reference = ("the policy at the start of RL (`kl_reference` = sft): this run had no "
                         "SFT steps, so that is the base model")
        else:
            after = f"the {sft} SFT steps" if isinstance(sft, int) else "the SFT warm start"
            reference = ("the policy at the start of RL: a frozen copy of the LoRA adapter taken "
                         f"after {after} (`kl_reference` = sft)")
    else:
        reference = "a reference this app does not know (an unrecognised `kl_reference`)"
    coef = config.get("kl_coef")
    penalty = ""
    if isinstance(coef, (int, float)):
        penalty = (f"; penalised with `kl_coef` = {coef:g}" if coef > 0
                   else "; `kl_coef` = 0: measured, not penalised")
    return KL_MEASURE.format(reference=reference, penalty=penalty)
