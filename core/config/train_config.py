"""One flat training configuration, ``TrainConfig``. Torch-free on purpose: the web app's launcher
builds and validates forms with it (through ``core.config``, the one core package pages import).

Its validation (``validate`` and the names each choice field accepts) is core/config/validation.py,
its presets core/config/presets.py, environment options (``env_options`` text, ``env_kwargs``)
core/config/env_options.py.

Every field has a docstring under it. ``TrainConfig.from_dict`` refuses unknown keys and wrong
types, ``validate`` refuses out-of-range values; both name the bad field, before any work starts.

Algorithm defaults are applied by the config itself, so ``TrainConfig(algo="starpo_s")`` from
Python trains what ``--algo starpo_s`` trains. A field whose default is written ``by_algo(x)``
takes the value the algorithm is defined with (core/algorithms/catalog.py, e.g. StarPO-S's clip-higher)
unless it was given explicitly; ``x`` is the value for algorithms that declare none. Explicit
values win wherever they come from: keyword arguments, ``from_dict`` (presets, YAML, the Train
page), ``replace`` (which re-applies the defaults of a changed ``algo`` to the fields not given).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

import yaml

from core.algorithms.catalog import REGISTRY
from core.config.budget import ConfigError


class _ByAlgo:
    """Marks a field's default as "the algorithm's, else this": a float or str that __post_init__
    recognises (an explicit value, even an equal one, is a plain float or str and is kept)."""


class _FloatByAlgo(float, _ByAlgo):
    pass


class _StrByAlgo(str, _ByAlgo):
    pass


def by_algo(value: float | str):
    """A field default the algorithm's own defaults (core/algorithms/catalog.py) override."""
    return _FloatByAlgo(value) if isinstance(value, float) else _StrByAlgo(value)


@dataclass
class TrainConfig:
    # -- what to train -------------------------------------------------------------------------
    env: str = "search"
    """Environment: search | apps | frozenlake | sokoban | bandit | package.module:Factory | an
    installed plugin's name (docs/environments.md)."""
    model: str = "tiny"
    """tiny (random 2-layer Llama, SmolLM2 tokenizer) | smollm2-135m | a local Hugging Face
    causal-LM directory | a local FILE.gguf (docs/models.md) | openai:URL, an OpenAI-compatible
    server as the policy: it collects and evaluates, nothing is trained (docs/integrations.md)."""
    model_name: str = ""
    """With --model openai:URL: the server's name of the model, sent with every request."""
    algo: str = "grpo"
    """Algorithm (core/algorithms/catalog.py): grpo | dr_grpo | rloo | ppo | starpo_s | gigpo | loop."""
    name: str = ""
    """Run name shown in the app (defaults to the run id)."""
    db: str = "runs/store.duckdb"
    """DuckDB file the run is recorded in; created if missing, appended to if not."""
    seed: int = 0
    """Seeds tasks, sampling, LoRA init: the same seed gives the same run."""
    resume: str = ""
    """Run id to continue in the same database from its last checkpoint."""
    init_from: str = ""
    """Start a new run from another run's checkpoint (its directory or checkpoint.pt file):
    its adapter and optimizer state are restored and the steps it completed are skipped, so the
    new run records from the step after the checkpoint's. SFT once, then try several RL settings
    from the same start: an SFT-phase checkpoint may go on with any algorithm (PPO adds a value
    head: the LoRA weights keep their optimizer moments, the value head's start fresh)."""

    # -- schedule ------------------------------------------------------------------------------
    steps: int = 10
    """RL steps (each: rollout -> rewards -> advantages -> update)."""
    sft_steps: int = 0
    """LoRA SFT warm-start steps on the env's scripted-expert demonstrations (0 = none)."""
    group_size: int = 8
    """G: rollouts per task; they share a group_id."""
    tasks_per_step: int = 4
    """Distinct tasks per RL step (batch = tasks_per_step * group_size trajectories)."""
    task_pool: int = 0
    """Train tasks drawn once per run; the steps cycle through them in a seeded order. 0 = the
    whole train split (search: every train question the task mix allows, 18,096 at two_hop_frac
    0.5); for envs that generate tasks without bound (apps, the games) as many as the run asks
    for, so none repeats. (It was a fixed 256 before.)"""
    eval_every: int = 5
    """Evaluate on held-out tasks every N RL steps (and after SFT and at the end); 0 = never."""
    eval_tasks: int = 32
    """Number of held-out tasks per evaluation."""
    eval_seed: int = -1
    """Seed of the held-out draw and of its sampling (-1: the run's seed). Runs with different
    seeds but the same eval_seed evaluate the same tasks and episode seeds, so Compare pairs them."""
    sft_eval_every: int = 0
    """Also evaluate every N SFT steps (0 = only after SFT): the held-out curve of the SFT budget,
    each point with its adapter snapshot. Needs ``eval_every`` > 0."""
    checkpoint_every: int = 1
    """Save LoRA adapter + optimizer state every N steps (needed by --resume)."""
    adapter_every: int = 10
    """Keep a snapshot of the LoRA adapter (``adapters/step-N.pt`` in the run's checkpoint dir)
    before training, every N steps, at every evaluation and at the end, so branch-from-turn
    rollouts (core/jobs/branch.py) can sample with the policy as it was; 0 = keep none."""

    # -- rollout -------------------------------------------------------------------------------
    max_turns: int = 4
    """K: most actions per trajectory."""
    final_answer_turn: bool = False
    """Search-R1: a trajectory still going after max_turns gets one more generation in which
    only an answer is executed (any other action is recorded, not executed). Answering there
    ends it with finish reason ``final_answer``, else ``max_turns``. Envs with an answer action
    only (search, apps)."""
    max_new_tokens: int = 96
    """Most tokens the model may generate in one turn; a turn cut here is recorded as such."""
    max_obs_tokens: int = 256
    """Observations longer than this are truncated (and recorded as truncated). Before they are
    tokenised they are cut to 128 bytes of UTF-8 per token allowed (core/envs/guard.py), the cut
    recorded in the turn's info as observation_cut_bytes."""
    env_step_timeout: float = 120.0
    """Seconds one env.step / outcome may take; past it the trajectory ends as env_error naming
    the deadline and the run goes on (the call is abandoned on its worker thread; too many still
    stuck stops the run, naming the env)."""
    max_context: int = 1536
    """Most tokens in a whole trajectory context; reaching it ends the trajectory."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling threshold for training rollouts."""
    eval_temperature: float = 0.0
    """Temperature for held-out evaluation (0 = greedy)."""
    topk: int = 3
    """Search env: documents returned per query (Search-R1 default 3)."""
    env_options: str = ""
    """Env options as key=value,key=value (e.g. two_hop_frac=0.75 for search, expert=uniform for
    bandit, max_actions=8 for frozenlake); values are read as int, float, true/false or text."""
    sft_env_options: str = ""
    """Options that differ for the SFT demonstrations' env (same format, layered over
    env_options), e.g. two_hop_frac=0.1 so SFT teaches the format and leaves strategy to RL."""
    eval_env_options: str = ""
    """Options that differ for the held-out evaluation's env (same format, layered over
    env_options): keeps the evaluation set fixed while the RL task mix changes, e.g. on resume."""

    # -- model and LoRA ------------------------------------------------------------------------
    lora_rank: int = 16
    """LoRA rank r."""
    lora_alpha: int = 32
    """LoRA alpha (scale = alpha / r)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA adapters' input, in the update's forward and backward only (SFT and
    RL); sampling, scoring and evaluation never drop out."""
    lora_targets: str = "all-linear"
    """Comma-separated module names wrapped by LoRA, or all-linear: every linear layer the model
    has except its output head (q_proj..down_proj on Llama/Qwen2/Mistral, c_attn/c_proj/c_fc on
    GPT-2); the resolved names are recorded in the run's config as lora_target_modules."""

    # -- optimisation --------------------------------------------------------------------------
    lr: float = 1e-4
    """AdamW learning rate for RL updates."""
    sft_lr: float = 2e-4
    """AdamW learning rate for the SFT warm start."""
    rl_moments: str = "sft"
    """How the RL optimizer starts after an SFT warm start. sft: from SFT's AdamW second moments
    (and step count; momentum zero), so the first RL steps move the adapter in proportion to the
    RL gradient; fresh: a new AdamW, whose first step moves every weight by the full lr whatever
    the gradient (one such step at lr 2e-4 halved the search policy's held-out success)."""
    sft_batch_size: int = 8
    """Demonstrations per SFT step."""
    kl_coef: float = by_algo(0.001)
    """Coefficient of the k3 KL penalty to the reference policy (kl_reference; 0 = off; starpo_s
    and loop default to 0)."""
    kl_reference: str = "sft"
    """The policy the KL penalty (and the recorded ref_logprob) compares to. sft: the policy at
    the start of RL, i.e. after the SFT warm start (a frozen copy of the adapter, as TRL and verl
    do; without SFT steps it equals the base model); base: the base model (adapters off), which
    pulls the policy back from the format SFT taught."""
    clip_eps_low: float = by_algo(0.2)
    """PPO ratio clip below 1 (ratio >= 1 - eps_low; loop 0.1)."""
    clip_eps_high: float = by_algo(0.2)
    """PPO ratio clip above 1 (starpo_s clip-higher 0.28; loop 0.1)."""
    clip_mode: str = by_algo("ppo")
    """ppo: clip ratio to [1-eps_low, 1+eps_high]; log: LOOP's [1/(1+eps), 1+eps] with eps_high
    (loop's default)."""
    dual_clip: float = 0.0
    """Dual-clip c > 1 (Ye et al. 2020; verl uses 3): for A < 0 the token loss is capped at -A * c,
    so a ratio far above 1 on a bad action cannot blow up the update. 0 = off."""
    loss_agg: str = by_algo("token-mean")
    """How token losses are averaged: token-mean | seq-mean-token-mean (loop: each rollout's
    tokens, then the rollouts) | seq-mean-token-sum-norm."""
    ppo_epochs: int = 1
    """Passes over one rollout batch (using the stored sampling logprobs)."""
    minibatches: int = 1
    """Optimizer steps per epoch (the batch is split into this many minibatches)."""
    max_grad_norm: float = 1.0
    """Gradient clipping threshold (the norm before clipping is recorded)."""
    min_abs_advantage: float = by_algo(0.0)
    """Drop trajectories with |A| below this from the update (loop's default 0.01)."""
    starpo_keep: float = 0.25
    """StarPO-S: fraction of task groups kept, by in-group reward std."""
    gigpo_weight: float = 1.0
    """GiGPO: w in A = A_episode + w * A_step."""
    gigpo_gamma: float = 0.95
    """GiGPO: discount of step returns."""
    gigpo_norm: str = "std"
    """GiGPO: how the episode and the step advantages are normalised within their groups, as
    verl-agent's algorithm.gigpo.mode (core_gigpo.py) does for both: "std" divides the centred
    value by the group's std (its mean_std_norm), "none" only centres it (its mean_norm, the
    default of verl-agent's config)."""
    gigpo_episode_stats: str = "steps"
    """GiGPO: what the episode term's group mean and std are taken over. "steps" (the default,
    as verl-agent's released compute_mean_std_cross_steps=True, which its reported results
    used): each trajectory counts once per turn, so long trajectories weigh more; "trajectories":
    once each (the paper's Eq. 3). core/algorithms/estimators.py gigpo_episode_advantages."""
    gamma: float = 1.0
    """PPO/GAE discount over model tokens."""
    lam: float = 1.0
    """PPO/GAE lambda."""
    vf_coef: float = 0.5
    """PPO: value-loss coefficient."""
    value_clip: float = 0.0
    """PPO: clip each token's new value to within this of its value before the update and take
    the larger of the clipped and unclipped squared errors (verl's critic.cliprange_value, 0.5
    there; core/learn/losses.py value_loss); 0 = off."""
    kl_abort: float = 20.0
    """Abort an update whose approximate KL to the sampling policy exceeds this (LOOP)."""
    max_bad_steps: int = 3
    """Stop the run after this many consecutive updates skipped for NaN/inf."""
    rollout_dtype: str = "auto"
    """The sampling pass's precision: "auto" (bf16 autocast on CUDA, fp32 on the CPU), "fp32" or
    "bf16" whatever the device. The update keeps auto's. bf16 sampling against an fp32 update is
    the training-inference mismatch of bf16 inference engines, reproducible on a CPU."""
    rollout_correction: str = "none"
    """Correct the sampler-trainer mismatch (core/learn/mismatch.py, verl's rollout correction),
    with r = pi_train / pi_sampler per token (or exp of the summed log-ratios of a trajectory,
    rollout_correction_level "sequence"): "tis" weights each token's loss by min(r, cap); "mis"
    by r where r lies in [1 / cap, cap] and leaves the other tokens (or trajectories) out of the
    loss; "rs" leaves the same ones out and trains the rest with weight 1 (rejection only). Each
    takes the PPO ratio against the trainer's own logprob and costs one scoring pass per
    trajectory. "none": the ratio is against the sampler's logprob, as before."""
    rollout_is_cap: float = 2.0
    """C of the rollout correction: the TIS truncation and the MIS/RS band [1/C, C]."""
    rollout_correction_level: str = "token"
    """Where the correction's ratio is taken: each "token", or each "sequence" by exp(sum of its
    log-ratios), broadcast over the trajectory's tokens (verl's rollout_is/rollout_rs levels)."""

    # -- rewards -------------------------------------------------------------------------------
    outcome_metric: str = "em"
    """Search outcome: em (exact match) | f1 (token F1)."""
    w_outcome: float = 1.0
    """Weight of the outcome component in the trajectory reward."""
    w_format: float = 0.0
    """Weight of the format component."""
    w_cost: float = 1.0
    """Weight of the cost component (the component itself is <= 0)."""
    w_process: float = 0.0
    """Weight of the process component."""
    w_info_gain: float = 0.0
    """Weight of the information-gain turn rewards (IGPO, core/credit/info_gain.py); > 0 turns IGPO's
    credit on: each turn's gain in the policy's probability of the gold answer and the
    trajectory's outcome are z-scored apart within the task group, the outcome is the last
    turn's reward, and turn k's action tokens get the discounted sum of the turn rewards from k
    on (core/algorithms/estimators.py igpo_turn_advantages; it replaces the algorithm's own credit of the
    trajectories it applies to). Envs with gold answers (search); 0 = off."""
    info_gain_gamma: float = 1.0
    """Turn discount of IGPO's turn returns, the outcome included: A_k = r_k + gamma A_{k+1}
    (gamma 1.0 in all of IGPO's released scripts); 0 = each turn its own reward only."""
    info_gain_type: str = "prob"
    """How a turn's information gain is differenced: "prob", the answer probability (IGPO's
    paper), or "log_prob", its log (IGPO's released training script)."""
    w_spa: float = 0.0
    """Weight of SPA-RL's stepwise progress credit (core/credit/progress.py): a head on the policy's
    hidden state at each action's end, fitted every RL step so a trajectory's per-turn
    contributions sum to its outcome; the contributions, times w_spa, are turn rewards whose
    return-to-go is added to each turn's action tokens' advantage (ppo: through GAE; else less
    the task group's mean return-to-go at that turn). 0 = off."""
    w_prm: float = 0.0
    """Weight of the process reward model (AgentPRM, core/credit/prm.py): a head on the same hidden
    states fitted every RL step to Monte-Carlo Q labels (the group's rollouts that took the same
    parsed action from the same state after the same history, their outcomes discounted by
    prm_gamma); its score of each turn, centred within the task group, is added to that turn's
    action tokens' advantage. 0 = off."""
    prm_gamma: float = 0.95
    """AgentPRM's discount in its Monte-Carlo labels: Q = (mean of gamma^t (2 R - 1) + 1) / 2 over
    the pooled rollouts, t the turn index (0.95 in AgentPRM's released config); 1 = the plain
    mean outcome."""
    spa_l2: float = 0.0
    """How far each RL step's closed-form fit of the progress head (and the PRM head) may move
    from the weights it had: ridge strength l2 relative to the features' mean square
    (core/credit/progress.py ridge_step). 0: the exact least-squares fit closest to the last
    weights, so a trajectory's SPA contributions sum to its outcome on the batch fitted; > 0:
    keep more of the past, fit this step less, and the sums fall short of the outcomes (the
    default was 1.0: the audit measured sums of 0.69 / 0.24 / 0.45 for outcomes 1 / 0 / 1)."""
    record_info_gain: bool = True
    """Measure and record each turn's answer probability and information gain (turn_signals) on
    envs with gold answers even when w_info_gain is 0: one teacher-forced forward pass per turn
    of every training trajectory."""
    cost_per_turn: float = 0.0
    """Cost charged per turn."""
    cost_per_token: float = 0.0
    """Cost charged per generated token."""
    cost_per_tool_call: float = 0.0
    """Cost charged per tool call / search."""

    # -- plumbing ------------------------------------------------------------------------------
    threads: int = 0
    """torch threads (0 = torch's default)."""
    device: str = "auto"
    """auto (CUDA when torch sees a GPU, else CPU) | cpu | cuda | cuda:N; the resolved device is
    recorded in the run's config as device_resolved (core/model/device.py)."""
    checkpoint_dir: str = ""
    """Where adapters are saved (default: next to the database, under checkpoints/RUN_ID)."""

    # -- an endpoint policy (--model openai:URL; core/endpoint/client.py, core/run/collection.py) ----------
    endpoint_concurrency: int = 8
    """Requests in flight at once (each episode waits for its own)."""
    endpoint_timeout: float = 120.0
    """Seconds one request may take in all, connect to last byte, however slowly the server
    sends (a deadline, not a per-read timeout); past it the request counts as timed out and is
    retried."""
    endpoint_retries: int = 3
    """Retries of a request that timed out, lost its connection, got a 5xx, a 429 or a reply that
    is not a chat completion; after them the trajectory ends as endpoint_error."""
    endpoint_backoff: float = 1.0
    """Seconds before the first retry, doubling after each (at most 30 s); a 429's Retry-After
    is honoured instead (at most 60 s)."""
    endpoint_logprobs: bool = True
    """Ask the server for each action token's logprob (recorded as tokens.logprob)."""
    endpoint_top_logprobs: int = 0
    """Also ask for each token's top-k alternatives (0-20), kept in turns.info."""

    # ------------------------------------------------------------------------------------------
    def __post_init__(self) -> None:
        # Fields still at their by_algo default take the algorithm's value; an unknown algo is
        # left for validate() to name.
        algo = REGISTRY.algorithms.get(self.algo)
        own = algo.defaults if algo is not None else {}
        self._from_algo = frozenset(f.name for f in fields(self)
                                    if isinstance(getattr(self, f.name), _ByAlgo))
        for name in self._from_algo:
            base = getattr(self, name)
            value = own.get(name, base)
            setattr(self, name, float(value) if isinstance(base, float) else str(value))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainConfig":
        known = {f.name: f for f in fields(cls)}
        values = {}
        for key, value in data.items():
            name = key.replace("-", "_")
            if name not in known:
                raise ConfigError(f"unknown config key {key!r}")
            values[name] = _coerce(name, known[name], value)
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "TrainConfig":
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping of keys to values")
        return cls.from_dict(data)

    def replace(self, **changes: Any) -> "TrainConfig":
        """A copy with ``changes``; fields that came from the algorithm's defaults are filled
        again from the (possibly new) algorithm's, explicit ones are kept."""
        again = {n: getattr(TrainConfig, n) for n in self._from_algo if n not in changes}
        return dataclasses.replace(self, **again, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


def _coerce(name: str, f: dataclasses.Field, value: Any) -> Any:
    typ = {"int": int, "float": float, "str": str, "bool": bool}[f.type if isinstance(f.type, str) else f.type.__name__]
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ConfigError(f"{name} must be {typ.__name__}, got {type(value).__name__} {value!r}")
    return value

