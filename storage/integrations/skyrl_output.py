"""Record SkyRL's generator output into a store, from inside the user's SkyRL trainer.

    from storage.integrations.skyrl_output import SkyRLRecorder
    recorder = SkyRLRecorder("runs/skyrl.duckdb", tokenizer, run_name="my skyrl run")
    ...
    generator_output = await generator.generate(generator_input)   # skyrl_train 0.3.1
    recorder.record(generator_output, step=global_step, split="train")

``record`` reads the ``GeneratorOutput`` dict as ``skyrl_train.generators.base`` (0.3.1)
declares it, B rollouts at a time:

* ``prompt_token_ids`` (B lists) and ``response_ids`` (B lists): the ids; text decoded with the
  tokenizer (storage/token_text.py).
* ``loss_masks`` (B lists, one entry per response token): 1 trained (the model's tokens), 0 an
  observation spliced into a multi-turn response (storage/ingest/rollout_tokens.py).
* ``rollout_logprobs`` (optional, per response token): the sampler's logprob, on trained tokens.
* ``rewards``: one float per rollout, or per response token (SkyRL's token-level rewards),
  then summed.
* ``trajectory_ids`` (optional ``TrajectoryID(instance_id, repetition_id)``, or the dict of
  its fields): the group is ``s{step}-{instance_id}`` (SkyRL's GRPO groups the repetitions of
  one instance), the trajectory ``s{step}-{instance_id}_{repetition_id}`` (its
  ``to_string()``); without them each rollout is its own group.
* ``stop_reasons`` (optional): the finish reason (``length`` noted as cut).

Advantages are not in the generator output (SkyRL computes them afterwards, in its
``TrainingInputBatch``), so the trajectories carry none; Groups shows the rewards.
skyrl-train 0.3.1 requires Python 3.12 (this project runs 3.11) and pins ray 2.51.1 and
flash-attn, so the test builds the dict in the shape the package declares, not with it.
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

FORMAT = "skyrl"


def _traj_id(tid: Any) -> tuple[str, int] | None:
    """(instance_id, repetition_id) of a ``TrajectoryID`` or its dict, else None."""
    if tid is None:
        return None
    if isinstance(tid, dict):
        return str(tid["instance_id"]), int(tid["repetition_id"])
    return str(tid.instance_id), int(tid.repetition_id)


def generator_records(output: dict, tokenizer, step: int, split: str = "train"
                      ) -> Iterator[Callable[[], dict]]:
    """One function per rollout of a SkyRL ``GeneratorOutput``, making its generic record
    (storage/interchange.py): what one raises (a ``None`` reward, a short ``loss_masks``) fails
    that rollout alone (storage/integrations/step_recorder.py)."""
    for i in range(max(len(output["prompt_token_ids"]), len(output["response_ids"]))):
        yield partial(_record, output, i, tokenizer, step, split)  # named ``sample {i}``


def _at(output: dict, name: str, i: int, required: bool = True) -> Any:
    """``output[name][i]``; LineError naming the field when it is missing or too short."""
    values = output.get(name)
    if values is None and not required:
        return None
    if values is None or i >= len(values):
        raise LineError(f"'{name}' has no entry for rollout {i}")
    return values[i]


def _record(output: dict, i: int, tokenizer, step: int, split: str) -> dict:
    p_ids = token_ids(_at(output, "prompt_token_ids", i), "prompt_token_ids")
    r_ids = token_ids(_at(output, "response_ids", i), "response_ids")
    ids = np.concatenate((p_ids, r_ids))
    texts = token_text_array(tokenizer, ids)
    logprobs = _at(output, "rollout_logprobs", i, required=False) \
        if output.get("rollout_logprobs") else None
    tokens, turns = rollout_columns(texts, ids, len(p_ids), _at(output, "loss_masks", i),
                                    logprobs=logprobs)
    reward = _at(output, "rewards", i)
    reward = number(sum(number(r, "rewards") for r in reward), "rewards") \
        if isinstance(reward, (list, tuple)) else number(reward, "rewards")
    prompt = joiner(texts)(0, len(p_ids))
    ident = _traj_id(_at(output, "trajectory_ids", i)) if output.get("trajectory_ids") else None
    instance, rep = ident if ident else (f"{i}", 0)
    rec = {"traj_id": f"s{step}-{instance}_{rep}", "group_id": f"s{step}-{instance}",
           "task_id": task_id_of(prompt), "step": step, "split": split, "prompt": prompt,
           "turns": turns, "tokens": tokens, "reward": reward, "success": reward >= 1.0,
           "info": {"trainer": "skyrl", "import_notes": ["success inferred as reward >= 1"]}}
    stop = _at(output, "stop_reasons", i) if output.get("stop_reasons") else None
    if stop is not None:
        rec["finish_reason"] = str(stop)
        if stop == "length":
            turns[-1]["action_truncated"] = True
    return rec


class SkyRLRecorder(StepRecorder):
    """Writes each step's generator output into ``run_id`` of the store at ``db_path``."""

    def __init__(self, db_path, tokenizer, run_id: str | None = None,
                 run_name: str = "skyrl", config: dict | None = None):
        super().__init__(db_path, FORMAT, run_id, run_name, {"trainer": "skyrl",
                                                             **(config or {})})
        self.tokenizer = tokenizer

    def record(self, output: dict, step: int, split: str = "train") -> ImportReport:
        """Write one step's ``GeneratorOutput``; returns what was written."""
        return self.write(generator_records(output, self.tokenizer, int(step), split), step)
