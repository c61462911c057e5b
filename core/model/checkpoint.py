"""Checkpoints: the LoRA adapter (+ value head), the frozen KL-reference adapter once RL has
started (kl_reference=sft), and the optimizer state after a completed step.

One file per run, replaced atomically (write to a temp file, then rename), so a run killed at any
moment leaves either the previous checkpoint or the new one, never a torn file. ``--resume``
loads it, deletes whatever the store recorded after its step, and continues from the next step:
nothing recorded before the checkpoint is lost, nothing after it is duplicated.

Adapter snapshots (``adapter_every``): besides that one file, ``adapters/step-N.pt`` keeps the
LoRA adapter (+ value head) as it was after step N (step 0: before any training), never replaced
by a later step, so branch-from-turn rollouts (core/jobs/branch.py) can sample with the policy as it
was when a trajectory was recorded. Written atomically like the checkpoint.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

FILE = "checkpoint.pt"
ADAPTERS = "adapters"


def checkpoint_dir(cfg, run_id: str) -> Path:
    """cfg.checkpoint_dir/RUN_ID, or checkpoints/RUN_ID next to the database file."""
    if cfg.checkpoint_dir:
        return Path(cfg.checkpoint_dir) / run_id
    return Path(cfg.db).resolve().parent / "checkpoints" / run_id


@dataclass
class Checkpoint:
    step: int
    """The last step whose records and update the checkpoint includes."""
    phase: str
    """sft | rl: which optimizer the saved state belongs to."""
    config: dict
    adapter: dict
    value_head: dict | None
    optimizer: dict
    reference: dict | None = None
    """The frozen KL-reference adapter (None before RL, with kl_reference=base, and in
    checkpoints written before it was stored)."""
    heads: dict | None = None
    """The turn-credit heads' weights, {"spa": tensor | None, "prm": tensor | None}
    (core/credit/turn_credit.py): each RL step's fit starts from the last step's weights."""


def save(directory: Path, policy, optimizer, step: int, phase: str, config: dict,
         heads: dict | None = None) -> Path:
    # deferred: peft and transformers take seconds to import; only building a model needs them
    from peft import get_peft_model_state_dict
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        "step": step, "phase": phase, "config": json.dumps(config),
        # The adapter only. With lm_head among the LoRA targets, peft's default ("auto") would
        # also copy the frozen embedding weights into every checkpoint, warning each time; the
        # base model is rebuilt identically on resume, so they are not state.
        "adapter": get_peft_model_state_dict(policy.model, save_embedding_layers=False),
        "value_head": policy.value_head.state_dict() if policy.value_head is not None else None,
        "optimizer": optimizer.state_dict(),
        "reference": policy.reference_state(),
        "heads": heads,
    }
    tmp = directory / (FILE + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, directory / FILE)
    return directory / FILE


def load(directory: Path) -> Checkpoint | None:
    """The checkpoint in ``directory`` (or the file ``directory`` names); None if there is none."""
    path = Path(directory)
    path = path if path.is_file() else path / FILE
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    return Checkpoint(step=int(state["step"]), phase=state["phase"],
                      config=json.loads(state["config"]), adapter=state["adapter"],
                      value_head=state["value_head"], optimizer=state["optimizer"],
                      reference=state.get("reference"), heads=state.get("heads"))


def restore(ckpt: Checkpoint, policy, optimizer) -> str | None:
    """Put the checkpoint's adapter, value head, reference adapter and optimizer state back;
    a note when the optimizer state had to be fitted (a value head added or dropped), else None."""
    # deferred: peft and transformers take seconds to import; only building a model needs them
    from peft import set_peft_model_state_dict
    result = set_peft_model_state_dict(policy.model, ckpt.adapter)
    missing = [k for k in getattr(result, "unexpected_keys", [])]
    if missing:
        raise RuntimeError(f"checkpoint does not fit the model: unexpected keys {missing[:3]}")
    if ckpt.value_head is not None and policy.value_head is not None:
        policy.value_head.load_state_dict(ckpt.value_head)
    if ckpt.reference is not None:
        policy.freeze_reference(ckpt.reference)
    state, note = fit_optimizer_state(ckpt, policy, optimizer)
    optimizer.load_state_dict(state)
    return note


def fit_optimizer_state(ckpt: Checkpoint, policy, optimizer) -> tuple[dict, str | None]:
    """The checkpoint's optimizer state shaped for ``optimizer``, and a note if it was reshaped.

    An SFT checkpoint may go on with another algorithm, and PPO adds a value head that a run of,
    say, grpo never had (or the other way round). The optimizer has one group over
    policy.trainable_parameters(): the LoRA weights first, the value head's last. So the LoRA
    weights keep their moments and the value head's start fresh (or are dropped); anything
    else that does not line up is refused rather than loaded into the wrong weights."""
    saved = ckpt.optimizer
    groups = optimizer.param_groups
    had = [len(g["params"]) for g in saved["param_groups"]]
    has = [len(g["params"]) for g in groups]
    if had == has:
        return saved, None
    head = len(list(policy.value_head.parameters())) if policy.value_head is not None else 0
    added = ckpt.value_head is None and head > 0
    dropped = ckpt.value_head is not None and policy.value_head is None
    # a checkpoint's value head has as many tensors as the model's would (same nn.Linear)
    count = head if added else len(ckpt.value_head) if dropped else 0
    lora = has[0] - count if added else has[0]
    if not (count and len(had) == len(has) == 1 and had[0] + (count if added else -count)
            == has[0]):
        raise RuntimeError(f"checkpoint's optimizer state does not fit the model: parameter "
                           f"groups of {had} tensors, the optimizer has {has}")
    ids = saved["param_groups"][0]["params"]
    kept = ids[:lora]
    params = groups[0]["params"]
    for i, p in zip(kept, params[:lora]):
        for name, moment in saved["state"].get(i, {}).items():
            if torch.is_tensor(moment) and moment.dim() and moment.shape != p.shape:
                raise RuntimeError(f"checkpoint's optimizer state does not fit the model: its "
                                   f"{name} of shape {tuple(moment.shape)} for a weight of "
                                   f"shape {tuple(p.shape)}")
    # new ids for the value head's tensors: no state under them, so AdamW starts them fresh
    group = {**saved["param_groups"][0],
             "params": kept + list(range(max(ids, default=-1) + 1,
                                         max(ids, default=-1) + 1 + (count if added else 0)))}
    state = {i: saved["state"][i] for i in kept if i in saved["state"]}
    what = ("has no value head: the LoRA weights' moments are loaded, the value head's "
            "start fresh") if added else ("has a value head this run does not use: its "
                                          "moments are left out, the LoRA weights' loaded")
    return ({**saved, "state": state, "param_groups": [group]},
            f"checkpoint step {ckpt.step} ({ckpt.phase}) {what} ({lora} LoRA tensors, "
            f"{count} value-head tensors)")




# -- adapter snapshots ----------------------------------------------------------------------------
def snapshot_path(directory: Path, step: int) -> Path:
    return Path(directory) / ADAPTERS / f"step-{int(step)}.pt"


def save_adapter(directory: Path, policy, step: int) -> Path:
    """Keep the adapter (+ value head) as it is after ``step`` in ``adapters/step-N.pt``."""
    # deferred: peft and transformers take seconds to import; only building a model needs them
    from peft import get_peft_model_state_dict
    target = snapshot_path(directory, step)
    target.parent.mkdir(parents=True, exist_ok=True)
    state = {"step": int(step),
             "adapter": get_peft_model_state_dict(policy.model, save_embedding_layers=False),
             "value_head": policy.value_head.state_dict() if policy.value_head is not None else None}
    tmp = target.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, target)
    return target


def adapter_steps(directory: Path) -> list[int]:
    """Steps with a kept adapter snapshot, ascending (none when the directory does not exist)."""
    folder = Path(directory) / ADAPTERS
    steps = []
    for path in folder.glob("step-*.pt") if folder.is_dir() else []:
        try:
            steps.append(int(path.stem.removeprefix("step-")))
        except ValueError:
            continue
    return sorted(steps)


def nearest_adapter(directory: Path, step: int) -> int | None:
    """The latest snapshot step <= ``step``, or None when there is none."""
    before = [s for s in adapter_steps(directory) if s <= step]
    return before[-1] if before else None


def load_adapter(directory: Path, step: int) -> dict:
    """The snapshot of ``step``: {"step", "adapter", "value_head"}."""
    return torch.load(snapshot_path(directory, step), map_location="cpu", weights_only=True)


def put_adapter(snapshot: dict, policy) -> None:
    """Load a snapshot's adapter (and value head) into ``policy``; refuse one that does not fit."""
    # deferred: peft and transformers take seconds to import; only building a model needs them
    from peft import set_peft_model_state_dict
    result = set_peft_model_state_dict(policy.model, snapshot["adapter"])
    unexpected = list(getattr(result, "unexpected_keys", []))
    if unexpected:
        raise RuntimeError(f"adapter snapshot does not fit the model: unexpected keys "
                           f"{unexpected[:3]}")
    if snapshot.get("value_head") is not None and policy.value_head is not None:
        policy.value_head.load_state_dict(snapshot["value_head"])
