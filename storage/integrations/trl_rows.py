"""Rows of a TRL ``GRPOTrainer`` step (storage.integrations.trl): what the callback captured
turned into the tables of storage/recorder.py. Torch-free; the rules are in trl.py's docstring."""
from __future__ import annotations

import codecs
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from storage.failures import classify
from storage.token_text import BYTE_DECODER, is_byte_level, token_texts
from storage.ingest.dumps import chat_turns, standard_component, task_id_of
from storage.trajectory import STANDARD_COMPONENTS, checked

STANDARD = STANDARD_COMPONENTS
TOKEN_COLUMNS = checked("tokens", "traj_id", "pos", "token_id", "text", "role", "trained", "turn",
                        "advantage", "logprob", "entropy", "ref_logprob")
"""The token columns TRL's batches fill (the trajectory model's, storage/trajectory.py)."""


@dataclass
class Batch:
    """One generation batch as TRL produced it (plain lists, copied off the device)."""
    prompts: list
    completions: list
    rewards: dict[str, list[float]]
    advantages: list
    local_start: int                      # global row of this process's first row
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    loss_mask: list[list[int]]
    tool_mask: list[list[int]] | None
    truncated: list[bool]
    sampling_logps: list[list[float]] | None
    ref_logps: list[list[float]] | None
    index_base: int
    policy: dict[int, tuple[list[float], list[float]]] = field(default_factory=dict)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(f"{m.get('role')}: {_content(m.get('content'))}\n" for m in value
                       if isinstance(m, dict))
    return "" if value is None else str(value)


def _content(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return "" if content is None else str(content)

def reward_components(values: dict[str, float], weights: dict[str, float]) -> tuple[dict, list]:
    """Components of one completion from its reward functions' raw ``values``.

    Each function keeps its raw value under its own name. The contract components:
    ``c = sum(w_f * v_f for f named c)`` for c in format/cost/process/outcome (first function
    per name), and when no function is named outcome,
    ``outcome = sum(w_f * v_f for the functions no name maps)``; so the four add up to
    TRL's reward ``sum_f w_f * v_f`` (NaN values, TRL's "not applicable", skipped; +-inf kept,
    as TRL's ``nansum`` keeps them)."""
    out, notes, unmapped = {}, [], 0.0
    for name, value in values.items():
        if value is None or math.isnan(value):
            continue
        std = standard_component(name)
        if name not in STANDARD:
            out[name] = value
        if std is not None and std not in out:
            out[std] = weights.get(name, 1.0) * value
        else:
            unmapped += weights.get(name, 1.0) * value
    if "outcome" not in out:
        out["outcome"] = unmapped
        notes.append("outcome = weighted sum of the reward functions not named as a component")
    for name in STANDARD:
        out.setdefault(name, 0.0)
    return out, notes


def model_name(model) -> str:
    """The model a run trains, as users name it: the base model's path or hub name under a PEFT
    wrapper (``PeftModelForCausalLM`` says nothing), else its class."""
    peft = getattr(model, "peft_config", None)
    if isinstance(peft, dict):
        for cfg in peft.values():
            if getattr(cfg, "base_model_name_or_path", None):
                return str(cfg.base_model_name_or_path)
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    return (getattr(getattr(base, "config", None), "_name_or_path", None)
            or type(base).__name__)


def run_config(trainer, args, model) -> dict:
    """The run's stored configuration: TRL's settings that shape what is recorded."""
    names = list(getattr(trainer, "reward_func_names", []))
    weights = getattr(trainer, "reward_weights", None)
    try:
        # deferred: TRL is optional (requirements-trl.txt)
        import trl
        version = trl.__version__
    except ImportError:
        version = None
    keep = ("num_generations", "beta", "learning_rate", "temperature", "top_p", "top_k",
            "max_completion_length", "loss_type", "scale_rewards", "epsilon", "epsilon_high",
            "num_iterations", "per_device_train_batch_size", "gradient_accumulation_steps",
            "steps_per_generation", "max_steps", "seed", "use_vllm",
            "mask_truncated_completions")
    return {"env": "trl", "model": model_name(model), "algo": "grpo",
            "trainer": "trl.GRPOTrainer", "trl_version": version,
            "reward_funcs": names,
            "reward_weights": weights.tolist() if weights is not None else None,
            **{k: getattr(args, k, None) for k in keep}}


class StepRows:
    """Builds a step's rows; keeps what is worth decoding once per run (prompt texts, token
    bytes) between steps."""

    def __init__(self):
        self._prompt_texts: dict[tuple, list[str]] = {}  # a group's prompt, decoded once
        self._raw: dict[int, bytes] = {}                  # token id -> its bytes (byte-level)

    def tables(self, batches: list[Batch], step: int, trainer) -> dict:
        tables = {"trajectories": [], "rewards": [], "turns": [],
                  "tokens": {c: [] for c in TOKEN_COLUMNS}}
        tok = getattr(trainer, "_tokenizer", None) or getattr(trainer, "processing_class", None)
        names = list(getattr(trainer, "reward_func_names", []))
        w = getattr(trainer, "reward_weights", None)
        weights = dict(zip(names, w.tolist() if w is not None else [1.0] * len(names)))
        G = int(getattr(trainer, "num_generations", 0) or 1)
        group_base = 0
        for batch in batches:
            for i in range(len(batch.prompts)):
                self._trajectory(tables, batch, i, f"s{step}-g{group_base + i // G}",
                                 f"s{step}-g{group_base + i // G}-r{i % G}", tok, weights)
            group_base += -(-len(batch.prompts) // G)
        flag_nonfinite(tables["trajectories"])
        return tables

    def _trajectory(self, tables, batch: Batch, i: int, group_id: str, tid: str, tok,
                    weights) -> None:
        prompt, completion = _text(batch.prompts[i]), batch.completions[i]
        values = {k: v[i] for k, v in batch.rewards.items() if i < len(v)}
        # TRL's reward: the weighted nansum, so +-inf stays (inf - inf is NaN, stored NULL)
        reward = sum(weights.get(k, 1.0) * v for k, v in values.items()
                     if v is not None and not math.isnan(v))
        components, notes = reward_components(values, weights)
        if isinstance(completion, list):
            turns = chat_turns(completion)
        else:
            turns = [{"action": _text(completion), "observation": ""}]
        advantage = batch.advantages[i] if i < len(batch.advantages) else None
        local = i - batch.local_start
        truncated = None
        if 0 <= local < len(batch.completion_ids):
            truncated = batch.truncated[local]
            n_trained = self._tokens(tables["tokens"], batch, local, tid, advantage, tok)
        else:  # another process's completion: its texts only, re-tokenized
            notes.append("tokens re-tokenized from text (another process generated them)")
            n_trained = self._retokenized(tables["tokens"], tid, prompt, _text(completion),
                                          advantage, tok)
        success = components["outcome"] >= 1.0
        tables["trajectories"].append({
            "traj_id": tid, "group_id": group_id, "task_id": task_id_of(prompt),
            "reward": float(reward), "advantage": advantage, "success": success,
            "num_turns": len(turns), "finish_reason": None if truncated is None else
            ("length" if truncated else "stop"), "split": "train", "prompt": prompt,
            "answer": None if truncated else turns[-1]["action"],
            "response_tokens": n_trained,
            "failure_class": _classify(turns, success, truncated),
            "info": {"import_notes": notes + ["success = outcome >= 1"]}})
        tables["rewards"] += [{"traj_id": tid, "component": c, "value": float(v)}
                              for c, v in components.items()]
        tables["turns"] += [{"traj_id": tid, "turn": k, "action": t["action"],
                             "observation": t["observation"],
                             "action_type": "tool" if t["observation"] else "answer"}
                            for k, t in enumerate(turns)]

    def _tokens(self, cols: dict[str, list], batch: Batch, j: int, tid: str, advantage,
                tok) -> int:
        """Append trajectory ``j``'s token rows to the columns ``cols``; its trained count.

        Column lists are extended a trajectory at a time (no dict per token): a step of
        64 x 400 tokens is 25k rows, and per-row Python objects were most of its cost."""
        p_ids, c_ids = batch.prompt_ids[j], batch.completion_ids[j]
        P, C = len(p_ids), len(c_ids)
        if tok is None:
            texts = [""] * (P + C)
        else:  # a prompt ends at a token boundary (chat template): its texts are its own
            key = tuple(p_ids)
            if key not in self._prompt_texts:
                if len(self._prompt_texts) > 1024:
                    self._prompt_texts.clear()
                self._prompt_texts[key] = self._texts(tok, p_ids)
            texts = self._prompt_texts[key] + self._texts(tok, c_ids)
        policy = batch.policy.get(batch.index_base + j)
        logps = batch.sampling_logps[j] if batch.sampling_logps is not None else \
            (policy[0] if policy else None)
        ents = policy[1] if policy else None
        refs = batch.ref_logps[j] if batch.ref_logps is not None else None
        trained = [bool(m) for m in batch.loss_mask[j]]
        if batch.tool_mask is None:
            obs, roles, turns = [False] * C, ["action"] * C, [0] * C
        else:
            obs = [not m for m in batch.tool_mask[j]]
            roles, turns, turn = [], [], 0
            for k, o in enumerate(obs):
                if k and obs[k - 1] and not o:
                    turn += 1  # the model acts again after a tool result
                roles.append("observation" if o else "action")
                turns.append(turn)
        none_p = [None] * P
        cols["traj_id"] += [tid] * (P + C)
        cols["pos"] += range(P + C)
        cols["token_id"] += p_ids
        cols["token_id"] += c_ids
        cols["text"] += texts
        cols["role"] += ["prompt"] * P
        cols["role"] += roles
        cols["trained"] += [False] * P
        cols["trained"] += trained
        cols["turn"] += [-1] * P
        cols["turn"] += turns
        cols["advantage"] += none_p
        cols["advantage"] += [advantage if t else None for t in trained]
        for name, values in (("logprob", logps), ("entropy", ents), ("ref_logprob", refs)):
            cols[name] += none_p
            cols[name] += _per_token(values, C, obs)
        return sum(trained)

    def _texts(self, tok, ids: list[int]) -> list[str]:
        """``storage.token_text.token_texts(tok, ids)``, with each token's bytes looked up once per
        run instead of rebuilt character by character for every token (most of a step's
        recording time before: 16k completion tokens a step)."""
        if not is_byte_level(tok):
            return token_texts(tok, ids)
        raw = self._raw
        missing = list({i for i in ids if i not in raw})
        for i, piece in zip(missing, tok.convert_ids_to_tokens(missing)):
            raw[i] = b"".join(bytes([BYTE_DECODER[c]]) if c in BYTE_DECODER else c.encode() for c in piece)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        texts = [decoder.decode(raw[i]) for i in ids]
        if texts:
            texts[-1] += decoder.decode(b"", final=True)
        return texts

    @staticmethod
    def _retokenized(cols: dict[str, list], tid: str, prompt: str, completion: str, advantage,
                     tok) -> int:
        pos = 0
        for role, text in (("prompt", prompt), ("action", completion)):
            ids = tok(text, add_special_tokens=False)["input_ids"] if tok is not None else []
            n, action = len(ids), role == "action"
            cols["traj_id"] += [tid] * n
            cols["pos"] += range(pos, pos + n)
            cols["token_id"] += ids
            cols["text"] += token_texts(tok, ids) if ids else []
            cols["role"] += [role] * n
            cols["trained"] += [action] * n
            cols["turn"] += [0 if action else -1] * n
            cols["advantage"] += [advantage if action else None] * n
            for name in ("logprob", "entropy", "ref_logprob"):
                cols[name] += [None] * n
            pos += n
        return n


def _per_token(values: list | None, n: int, obs: list[bool]) -> list:
    """The first ``n`` of a padded row, None where absent, not finite or an observation."""
    if values is None:
        return [None] * n
    out = [v if v is not None and math.isfinite(v) else None for v in values[:n]]
    out += [None] * (n - len(out))
    return [None if o else v for v, o in zip(out, obs)] if any(obs) else out


def _classify(turns: list[dict], success: bool, truncated: bool | None) -> str | None:
    try:  # the same rules as every other recorded trajectory
        return classify(turns, success=success, finish_reason="max_tokens" if truncated else
                        "answered", answer=None if truncated else turns[-1]["action"], info={})
    except Exception:
        return None


NONFINITE_NOTE = ("a reward in this group is not finite: TRL's group mean/std are then not "
                  "finite, and the advantage it trained on (stored) is torch.nan_to_num of the "
                  "result: 0.0 for NaN (TRL's scale_rewards 'batch': the whole batch)")


def flag_nonfinite(trajs: list[dict]) -> None:
    """Note ``NONFINITE_NOTE`` on every trajectory of a group holding a non-finite reward (the
    step's count is ``reward/nonfinite_count``, derived_metrics).

    Why: with one +-inf reward in a group, TRL's ``mean`` is +-inf and its std NaN, so every
    advantage of the group is ``(r - mean) / (std + 1e-4)`` = NaN, which its ``nan_to_num`` turns
    into 0.0: the group teaches nothing, and nothing in TRL's logs says so."""
    bad = {t["group_id"] for t in trajs if not math.isfinite(t["reward"])}
    if bad:
        for t in trajs:
            if t["group_id"] in bad:
                t["info"]["import_notes"].append(NONFINITE_NOTE)


def derived_metrics(trajs: list[dict]) -> dict[str, float]:
    """The step's reward and length statistics from its recorded trajectories.

    Rewards that are not finite are counted (``reward/nonfinite_count``, 0 on a sound step) and
    left out of the reward statistics: ``reward/mean`` and ``reward/std`` are over the finite
    rewards, the group statistics over the groups whose rewards are all finite (an inf would make
    them inf or NaN, which no chart can draw)."""
    if not trajs:
        return {}
    rewards = [t["reward"] for t in trajs if math.isfinite(t["reward"])]
    groups: dict[str, list[float]] = {}
    for t in trajs:
        groups.setdefault(t["group_id"], []).append(t["reward"])
    stds = [statistics.stdev(g) for g in groups.values()
            if len(g) > 1 and all(map(math.isfinite, g))]
    out = {"reward/nonfinite_count": float(len(trajs) - len(rewards)),
           "success/rate": statistics.fmean(float(t["success"]) for t in trajs),
           "response/length_mean": statistics.fmean(t["response_tokens"] for t in trajs),
           "env/turns_mean": statistics.fmean(t["num_turns"] for t in trajs)}
    if rewards:
        out["reward/mean"] = statistics.fmean(rewards)
        out["reward/std"] = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    if stds:
        out["reward/group_std_mean"] = statistics.fmean(stds)
        out["reward/frac_zero_std"] = statistics.fmean(float(s == 0) for s in stds)
    return out
