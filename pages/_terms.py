"""What the app's words mean: one definition per term (the formulas are the code's, cited by file),
a one-line intro per page saying what it shows and what healthy looks like, and the helpers
that link a term to its entry on the Glossary page (pages/glossary.py, ``/glossary#<anchor>``)
or put its definition in a widget's hover help. (Not named ``_glossary.py``: on a first request
Streamlit lists pages/ itself, and ``_glossary`` and ``glossary`` would both be /glossary.)

Every text here is the project's own, never a store's: it is safe to render as markdown.
"""
from __future__ import annotations

from urllib.parse import urlencode

import streamlit as st

PAGE = "glossary"
"""The Glossary page's URL path (app.py registers it under this name)."""

# anchor -> (the term as pages write it, its definition in markdown). The anchor is the entry's
# id on the Glossary page. Formulas are checked against the code named in each entry.
TERMS: dict[str, tuple[str, str]] = {
    "reward": ("Reward", (
        "The number the policy is trained on, one per trajectory: the weighted sum of its "
        "components, `reward = w_outcome·outcome + w_format·format + w_cost·cost + "
        "w_process·process` (core/credit/rewards.py; the weights are in the run's config). "
        "`outcome` is the environment's grade in [0, 1], `format` rewards a well-formed ending, "
        "`cost` (≤ 0) charges turns, tokens and tool calls, `process` is a search's evidence hit. "
        "An imported run's reward is whatever its source scored.")),
    "success": ("Success", (
        "The environment's own verdict: solved or not. It does not depend on the reward weights, "
        "so reward and success can disagree. On the two-armed bandit (the workshop demo) success "
        "means *pulling the arm with the higher expected value* (Dragon, 0.25 > 0.1), while the "
        "reward is the payout that pull happened to get: Dragon pays 1.0 with probability 0.25, "
        "else 0. A policy that always picks Dragon has success 1.0 and a mean reward near 0.25 "
        "(0.15 on one step of 32 pulls is an ordinary draw).")),
    "advantage": ("Advantage", (
        "How much better a trajectory did than the baseline of its group; positive advantage "
        "makes its tokens more likely, negative less (core/credit/advantages.py). "
        "GRPO: `A = (r − mean_g) / (std_g + 1e-6)` (std with n − 1); Dr.GRPO: `A = r − mean_g`; "
        "RLOO / LOOP: `A_k = R_k − (Σ_j R_j − R_k) / (K − 1)`; PPO: GAE over the trained tokens "
        "with a critic. A group whose rewards are all equal gets advantage 0 on every rollout.")),
    "group-size": ("G (group size)", (
        "How many rollouts of the same task are sampled at one step (`group_size`). The G "
        "rollouts of one task form a group; the group's mean (and std) is the baseline the "
        "advantage is measured from.")),
    "in-group-std": ("In-group reward std", (
        "The standard deviation of the rewards inside one group. 0 means every rollout got the "
        "same reward: the advantages are all 0 and the group teaches nothing. A run whose "
        "in-group std falls towards 0 is collapsing (RAGEN's Echo Trap).")),
    "pass-at-g": ("pass@G", (
        "`success/pass@G` = the share of a step's groups in which at least one of the G rollouts "
        "succeeded (core/rollout/diagnostics.py). It bounds what the step can teach: a group "
        "with no success has nothing to reinforce. Healthy: above the success rate and not 0.")),
    "k3-kl": ("k3 KL", (
        "Schulman's k3 estimator of KL(π ‖ π_ref) from tokens y sampled from π: with "
        "`d = log π_ref(y) − log π(y)`, `k3 = exp(d) − d − 1 ≥ 0` per token (unbiased, low variance; "
        "verl's low_var_kl). `policy/kl` is its mean to the reference model over trained tokens "
        "(core/learn/losses.py); `policy/approx_kl` is the same estimate between the sampling "
        "policy and the current one, `mean((r − 1) − log r)`; `mismatch/kl_k3` between sampler "
        "and trainer. Healthy: small (≪ 0.1) and not growing step after step.")),
    "clip-fraction": ("Clip fraction", (
        "`policy/clipfrac`: the share of trained tokens where PPO's clip changed the loss, with "
        "`r = exp(logprob − old logprob)`: `A < 0` and `r < 1 − ε` (`clipfrac_low`) or `A > 0` "
        "and `r > 1 + ε` (`clipfrac_high`) (core/learn/losses.py). Healthy: a few percent; a "
        "large share means the policy moves further per step than the clip allows.")),
    "grad-norm": ("Gradient norm", (
        "`grad/norm`: the L2 norm of the whole update's gradient before clipping "
        "(core/learn/update.py). Spikes mark steps where a few trajectories pulled hard; RAGEN "
        "saw them at the point of no return of a collapse.")),
    "mad": ("MAD (spike rule)", (
        "Median absolute deviation, a robust spread: `MAD = median(|x_i − median(x)|)`. A step "
        "is a gradient spike when `norm > median + 5 × 1.4826 × MAD` of the previous 10 steps "
        "(1.4826 × MAD estimates a normal σ, so this is a robust five-sigma; the MAD is floored "
        "at 5% of the median) (pages/_signals.py).")),
    "entropy": ("Entropy", (
        "`policy/entropy`: the mean sampling entropy over the model's own tokens "
        "(core/rollout/diagnostics.py). Falling entropy means the "
        "policy samples ever more alike; together with a falling in-group std it is the "
        "collapse alarm's signal.")),
    "mismatch": ("Mismatch", (
        "The sampler's and the trainer's logprob of the same token under the same weights: "
        "`d = lp_train − lp_sampler`, `r = exp(d)` (core/learn/mismatch.py). `mismatch/abs_mean` "
        "= mean |d|, `ratio_out_frac` = share of tokens with r outside [0.9, 1.1], `kl_k3` = "
        "mean (r − 1) − log r. Healthy: r near 1 (fp32 sampling); bf16 sampling or another "
        "engine moves it, and an update then starts off-policy.")),
    "value-q": ("V / Q (branches)", (
        "From branch-from-turn continuations (core/jobs/branch.py): at turn t, K continuations "
        "that sample a new action give `V(s_t)` (the mean return from the state), K that keep "
        "the recorded action and sample after it give `Q(s_t, a_t)`; `A = Q − V` says whether "
        "the recorded action was better (> 0) or worse than the policy's average there.")),
    "information-gain": ("Information gain", (
        "IGPO's per-turn signal (core/credit/info_gain.py): `p_t` = the policy's probability of "
        "the gold answer after turn t (the geometric mean of its tokens' probabilities, read "
        "teacher-forced); `gain_t = p_t − p_{t−1}`. Positive: the turn brought the answer "
        "closer. Needs the model and the gold answer, so only the trainer measures it.")),
    "mask-lint": ("Mask lint", (
        "Checks of the loss mask on one trajectory (pages/_tokens.py): an observation or prompt "
        "token that was trained (the model would learn to imitate the environment), an action "
        "token that was not (its credit dropped), an action cut by the token limit, a truncated "
        "observation. Healthy: no rows.")),
    "failure-class": ("Failure class", (
        "Why a trajectory did not succeed, by the first matching rule of an ordered list "
        "(storage/failures.py): harm first, then what stopped the agent from acting, then the "
        "most specific account of a wrong answer. Class names say *tool call* where the task's "
        "tools are not a search.")),
    "silhouette": ("Silhouette", (
        "How well each item sits in its cluster: `s = mean_i (b_i − a_i) / max(a_i, b_i)` with "
        "`a_i` the mean cosine distance to its own cluster and `b_i` to the nearest other "
        "(core/jobs/clusters.py). Usual reading (Kaufman & Rousseeuw 1990): above 0.5 a "
        "reasonable structure, 0.25 to 0.5 weak, below 0.25 no substantial structure. The "
        "Failures page names clusters only at 0.25 and above.")),
    "held-out": ("Held-out evaluation", (
        "Trajectories of the `eval` split: tasks the policy is not trained on, sampled at "
        "evaluation steps (`eval/success`). What Compare pairs. Rising held-out success is the "
        "proof of learning; a rising training reward alone may be memorising.")),
}

# page -> what it shows and what healthy looks like (one or two sentences), and its terms.
INTROS: dict[str, tuple[str, tuple[str, ...]]] = {
    "runs": ("Every run of every store with its status, settings and the last reward and success, "
             "with their curves. Healthy: success rising over the steps; reward and success can "
             "differ, because reward is a weighted sum and success the environment's verdict.",
             ("reward", "success")),
    "replay": ("One trajectory turn by turn as the model saw it: each action, what came back, and "
               "every token with its loss mask. Healthy: only the model's own tokens trained "
               "(green), observations masked (grey), and the mask lint finds nothing.",
               ("reward", "success", "advantage", "failure-class", "mask-lint",
                "information-gain", "value-q")),
    "groups": ("The G rollouts of one task at one step side by side, with the advantage each got. "
               "Healthy: rollouts that disagree (some succeed, some fail), so the rewards vary "
               "inside the group and the advantages are not 0.",
               ("group-size", "advantage", "in-group-std", "value-q")),
    "dynamics": ("The run's curves step by step: reward and success, losses, gradient norm, "
                 "entropy, mismatch, with spikes and collapse alarms linked to their "
                 "trajectories. Healthy: success rising, in-group std and entropy staying above "
                 "0, a clip fraction of a few percent, a gradient norm without lone spikes.",
                 ("pass-at-g", "in-group-std", "entropy", "k3-kl", "clip-fraction", "grad-norm",
                  "mad", "mismatch")),
    "failures": ("Why trajectories failed: a class per trajectory, counts per step, search, tags "
                 "and clusters of similar failures. Healthy: the failing classes shrink over the "
                 "steps; a cluster is a finding only when its silhouette says so.",
                 ("failure-class", "silhouette")),
    "compare": ("Two held-out evaluations task by task: tasks gained and lost and how their "
                "failure classes changed. Healthy: more gained than lost, each loss explained.",
                ("held-out", "success", "failure-class")),
    # short: it stands beside the title (the form's Launch button stays above a laptop's fold)
    "train": ("Start a training job and follow it. Healthy: held-out success rising at each "
              "evaluation (the workshop demo: 0 to 1.0).", ("held-out", "success")),
}


def link(anchor: str, text: str | None = None) -> str:
    """A markdown link to a term's Glossary entry, ``[text](glossary?store=S&run=R#anchor)``
    with the sidebar's run (none picked: ``glossary#anchor``). Streamlit opens a markdown link
    in a new tab, a new session: without the run it would show the newest run in the sidebar,
    and writing that run into the address dropped the ``#anchor``."""
    if anchor not in TERMS:
        raise KeyError(f"no glossary term {anchor!r}")
    picked = st.session_state.get("pick_run")
    query = "?" + urlencode({"store": picked[0], "run": picked[1]}) if picked else ""
    return f"[{text or TERMS[anchor][0]}]({PAGE}{query}#{anchor})"


def help_for(*anchors: str) -> str:
    """Hover help (a widget's ``help=``): each term's definition and a link to its entry."""
    return "\n\n".join(f"**{TERMS[a][0]}**: {TERMS[a][1]} {link(a, 'Glossary')}" for a in anchors)


def intro(page: str) -> None:
    """A page's opening lines: what it shows, what healthy looks like, its terms linked."""
    text, terms = INTROS[page]
    with st.container(key="page_intro"):
        st.caption(text + " Terms: " + ", ".join(link(a) for a in terms) + ".")


def title(text: str, page: str) -> None:
    """The page's title with its intro beside it, not under it: a line under the title pushed
    Train's Launch button below a laptop's fold and Replay's token view a screen further."""
    # wide enough for 'Dynamics' in one line at 1280 px (at [1, 4] four page titles wrapped
    # there, making the header 222 px tall instead of 169); no anchor link: it took width too
    left, right = st.columns([1.4, 4], vertical_alignment="bottom")
    left.title(text, anchor=False)
    with right:
        intro(page)


def reward_beside_success(config: dict) -> str:
    """Why a run's reward and its success rate differ, from its config (a sentence).

    total = Σ_c w_c · component_c (core/credit/rewards.py); success is the env's verdict. The
    weights default to w_outcome 1, w_format 0, w_cost 1 (with no prices), w_process 0."""
    config = config or {}
    if config.get("env") == "bandit":
        return ("Reward is the payout of the arm pulled; success means pulling the arm with the "
                "higher expected value. Dragon pays 1.0 with probability 0.25, else 0: a policy "
                "that always pulls it succeeds every time with a mean reward near 0.25.")
    weights = {k[2:]: config.get(k) for k in ("w_outcome", "w_format", "w_cost", "w_process")}
    if all(v is None for v in weights.values()):
        return ("Reward is the score the source recorded; success is its verdict (solved or "
                "not): the two can differ.")
    shown = " + ".join(f"{float(v):g}·{k}" for k, v in weights.items() if v)
    return (f"Reward = {shown or '0'} (this run's weights); success is the environment's "
            "verdict, so the two can differ.")
