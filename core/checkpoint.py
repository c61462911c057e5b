"""Checkpoints: the LoRA adapter (+ value head), the frozen KL-reference adapter once RL has
started (kl_reference=sft), and the optimizer state after a completed step.

One file per run, replaced atomically (write to a temp file, then rename), so a run killed at any
moment leaves either the previous checkpoint or the new one, never a torn file. ``--resume``
loads it, deletes whatever the store recorded after its step, and continues from the next step:
nothing recorded before the checkpoint is lost, nothing after it is duplicated.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

FILE = "checkpoint.pt"


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


def save(directory: Path, policy, optimizer, step: int, phase: str, config: dict) -> Path:
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
    }
    tmp = directory / (FILE + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, directory / FILE)
    return directory / FILE


def load(directory: Path) -> Checkpoint | None:
    path = directory / FILE
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    return Checkpoint(step=int(state["step"]), phase=state["phase"],
                      config=json.loads(state["config"]), adapter=state["adapter"],
                      value_head=state["value_head"], optimizer=state["optimizer"],
                      reference=state.get("reference"))


def restore(ckpt: Checkpoint, policy, optimizer) -> None:
    """Put the checkpoint's adapter, value head, reference adapter and optimizer state back."""
    from peft import set_peft_model_state_dict
    result = set_peft_model_state_dict(policy.model, ckpt.adapter)
    missing = [k for k in getattr(result, "unexpected_keys", [])]
    if missing:
        raise RuntimeError(f"checkpoint does not fit the model: unexpected keys {missing[:3]}")
    if ckpt.value_head is not None and policy.value_head is not None:
        policy.value_head.load_state_dict(ckpt.value_head)
    if ckpt.reference is not None:
        policy.freeze_reference(ckpt.reference)
    optimizer.load_state_dict(ckpt.optimizer)


