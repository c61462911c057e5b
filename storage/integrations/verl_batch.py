"""Record verl's token-level batch into a store, from inside the user's verl trainer.

    from storage.integrations.verl_batch import VerlBatchRecorder
    recorder = VerlBatchRecorder("runs/verl.duckdb", tokenizer, run_name="my verl run")

    class RecordingTrainer(RayPPOTrainer):           # verl.trainer.ppo.ray_trainer
        def _log_rollout_data(self, batch, reward_extra_infos_dict, timing_raw, rollout_data_dir):
            recorder.record(batch, self.global_steps)  # after compute_advantage and the update
            super()._log_rollout_data(batch, reward_extra_infos_dict, timing_raw, rollout_data_dir)

``record(batch, step, split)`` takes the ``verl.DataProto`` the trainer holds once advantages
are computed (verl 0.9.1, ``RayPPOTrainer.fit``) and writes the step in bounded batches
(storage/ingest/feed.py), the run ``running`` until ``close()``. The fields it reads, as verl
lays them out (B samples, P prompt and R response positions):

* ``batch["prompts"]`` (B, P), left-padded, and ``batch["responses"]`` (B, R), right-padded;
  ``attention_mask`` (B, P+R) says which positions are tokens (``input_ids`` is their
  concatenation; without ``prompts`` the prompt is ``input_ids[:, :-R]``).
* ``response_mask`` (B, R): the loss mask. Response tokens it drops (a tool's reply in verl's
  multi-turn agent loop) are observations (storage/ingest/rollout_tokens.py); without it, every
  attended response token is trained, as verl's ``compute_response_mask`` does.
* ``rollout_log_probs`` (B, R): the sampler's logprob, stored as ``logprob``;
  ``old_log_probs`` (B, R): the trainer's recomputation under the same weights, stored as
  ``train_logprob`` (and as ``logprob`` when the sampler's were not kept), so Dynamics charts
  the training-inference mismatch verl's ``rollout_corr`` metrics watch.
* ``advantages`` (B, R): per token; the trajectory's advantage is its first trained token's.
* ``token_level_rewards`` (B, R): summed, the reward; ``token_level_scores`` summed, the
  ``outcome`` component (their difference, when verl's in-reward KL penalty is on, is the
  ``kl_penalty`` component).
* ``non_tensor_batch["uid"]``: the prompt's group (verl's GRPO groups by it) -- group id
  ``s{step}-{uid}``, trajectory id ``s{step}-{uid}-{k}`` (the k-th of its group in the batch);
  ``reward_model.ground_truth`` the golds, ``data_source`` kept in ``info``; a numeric
  ``acc`` (verl's reward_extra_info) says success, else reward >= 1 (noted).

No verl import here: the batch is read through its ``.batch``/``.non_tensor_batch``, so this
module loads without verl's stack (tests/test_import_rl_trainers.py builds a real DataProto).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Iterator

import numpy as np

from storage.ingest.door import number, token_ids
from storage.ingest.dumps import task_id_of
from storage.ingest.report import ImportReport
from storage.ingest.rollout_tokens import rollout_columns
from storage.integrations.step_recorder import StepRecorder
from storage.interchange import LineError
from storage.token_columns import joiner, token_text_array

FORMAT = "verl-batch"


def _sample(batch, i: int, views: dict):
    """Sample ``i``'s row of each tensor as a numpy array (floats as float64; None where verl
    did not fill the key). A tensor in CPU memory is read through one numpy view of the batch's
    (``views``, shared by the batch's samples: no copy, no call per sample into the tensor
    library); any other (on a GPU, bfloat16) one row at a time, so what is held beside the batch
    is one sample's numbers, not the batch's."""
    tensors = batch.batch

    def row(name: str):
        if name not in views:
            tensor = tensors[name] if name in tensors.keys() else None
            try:
                views[name] = None if tensor is None or tensor.device.type != "cpu" \
                    else tensor.detach().numpy()
            except (TypeError, RuntimeError):  # a dtype numpy has not (bfloat16)
                views[name] = None
        view = views[name]
        if view is not None:
            value = view[i]
            return value.astype(np.float64) if value.dtype.kind == "f" else value
        if name not in tensors.keys():
            return None
        value = tensors[name][i].detach().cpu()
        return (value.double() if value.is_floating_point() else value).numpy()
    return row


def _plain(value: Any) -> Any:
    """A numpy value as JSON-ready Python (non-tensor fields are numpy object arrays)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def batch_records(batch, tokenizer, step: int, split: str = "train"
                  ) -> Iterator[Callable[[], dict]]:
    """One function per sample of a verl ``DataProto``, making its generic record
    (storage/interchange.py): what one raises (a ``uid`` list shorter than the batch, an id
    outside the vocabulary) fails that sample alone (storage/integrations/step_recorder.py)."""
    seen: dict[str, int] = {}
    views: dict[str, Any] = {}
    for i in range(len(batch.batch["responses"])):
        yield partial(_record, batch, i, tokenizer, step, split, seen, views)  # ``sample {i}``


def _record(batch, i: int, tokenizer, step: int, split: str, seen: dict, views: dict) -> dict:
    extra = batch.non_tensor_batch
    uids = extra.get("uid")
    if uids is not None and i >= len(uids):
        raise LineError(f"non_tensor_batch['uid'] has {len(uids)} entries, none for this "
                        "sample")
    row = _sample(batch, i, views)
    responses, attention = row("responses"), row("attention_mask") != 0
    width = len(responses)
    prompt_ids = row("prompts")
    prompt_ids = row("input_ids")[:-width] if prompt_ids is None else prompt_ids
    mask = row("response_mask")
    mask = attention[-width:] if mask is None else mask
    old, rewards, scores = row("old_log_probs"), row("token_level_rewards"), \
        row("token_level_scores")
    sampled = row("rollout_log_probs")
    p_len = len(prompt_ids)
    p_keep, r_keep = attention[:p_len], attention[p_len:p_len + width]
    ids = token_ids(np.concatenate((prompt_ids[p_keep], responses[r_keep])), "input_ids")
    n_prompt = int(p_keep.sum())
    # one decode of prompt and response: a character split across the cut stays whole
    texts = token_text_array(tokenizer, ids)
    pick = (lambda values: None if values is None else values[r_keep])
    tokens, turns = rollout_columns(
        texts, ids, n_prompt, mask[r_keep], logprobs=pick(old if sampled is None else sampled),
        train_logprobs=pick(old), advantages=pick(row("advantages")))
    reward = number(float(sum(rewards.tolist())), "token_level_rewards") \
        if rewards is not None else 0.0
    score = number(float(sum(scores.tolist())), "token_level_scores") \
        if scores is not None else reward
    prompt = joiner(texts)(0, n_prompt)
    uid = str(uids[i]) if uids is not None else f"{i}"
    k = seen[uid] = seen.get(uid, -1) + 1
    rec = {"traj_id": f"s{step}-{uid}-{k}", "task_id": task_id_of(prompt),
           "group_id": f"s{step}-{uid}", "step": step, "split": split, "prompt": prompt,
           "turns": turns, "reward": reward, "tokens": tokens,
           "rewards": {"outcome": score, "format": 0.0, "cost": 0.0, "process": 0.0},
           "advantage": tokens.first("advantage")}
    if abs(reward - score) > 1e-9:
        rec["rewards"]["kl_penalty"] = reward - score
    rec.update(_sample_fields(extra, i, reward))
    return rec


def _sample_fields(extra: dict, i: int, reward: float) -> dict:
    """golds, success and info of sample ``i`` from verl's non-tensor fields."""
    out: dict[str, Any] = {"info": {"trainer": "verl"}}
    model = _plain(extra["reward_model"][i]) if "reward_model" in extra else None
    if isinstance(model, dict) and model.get("ground_truth") is not None:
        out["golds"] = model["ground_truth"]
    if "data_source" in extra:
        out["info"]["data_source"] = str(extra["data_source"][i])
    acc = _plain(extra["acc"][i]) if "acc" in extra else None
    if isinstance(acc, (bool, int, float)):
        out["success"] = bool(acc > 0)
    else:
        out["success"] = reward >= 1.0
        out["info"]["import_notes"] = ["success inferred as reward >= 1"]
    return out


class VerlBatchRecorder(StepRecorder):
    """Writes each step's batch into ``run_id`` of the store at ``db_path`` (module docstring)."""

    def __init__(self, db_path, tokenizer, run_id: str | None = None,
                 run_name: str = "verl", config: dict | None = None):
        super().__init__(db_path, FORMAT, run_id, run_name, {"trainer": "verl", **(config or {})})
        self.tokenizer = tokenizer

    def record(self, batch, step: int | None = None, split: str = "train") -> ImportReport:
        """Write ``batch`` (a ``verl.DataProto`` after advantages) as step ``step`` (default
        its ``meta_info["global_steps"]``); a sample that fails validation fails alone, in the
        report's errors. Returns what was written."""
        step = int(step if step is not None else batch.meta_info.get("global_steps", 0))
        return self.write(batch_records(batch, self.tokenizer, step, split), step)
