"""The device a run trains on: ``--device auto|cpu|cuda|cuda:N``.

* ``auto``   CUDA when torch sees a GPU, else the CPU (the default: a laptop keeps working).
* ``cpu``    the CPU, even where a GPU is present.
* ``cuda``   the GPU; ``cuda:N`` GPU number N. Asking for a GPU that is not there is a
             configuration error (``ConfigError``: exit code 2 from the command line), never a
             silent fall-back to the CPU.

Under torchrun each rank takes one GPU, ``cuda:LOCAL_RANK`` (``auto`` and ``cuda`` alike);
``cuda:N`` with several ranks is refused, since every rank would share GPU N and NCCL refuses a
GPU shared by two ranks.

On CUDA the forward passes run under bf16 autocast (``autocast``); the logits the logprobs,
entropies and the loss are taken from are computed in fp32 (core/model/policy.py), so recorded logprobs
and the loss stay fp32. ``StepClock`` gives the per-step GPU metrics: peak memory and GPU time.
"""
from __future__ import annotations

import contextlib
import re
import time

import torch

from core.config.budget import ConfigError

PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
"""The values ``--device`` takes (core/config/validation.py checks the spelling without torch)."""


def resolve(requested: str, local_rank: int = 0, world: int = 1) -> torch.device:
    """The torch device for ``requested``; ConfigError (naming the field) when it cannot be had."""
    text = (requested or "auto").strip().lower()
    if not PATTERN.fullmatch(text):
        raise ConfigError(f"device={requested!r}: must be auto, cpu, cuda or cuda:N")
    if text == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available()
    count = torch.cuda.device_count() if available else 0
    if text == "auto":
        if not available:
            return torch.device("cpu")
        text = "cuda"
    if not available or count == 0:
        raise ConfigError(f"device={requested!r}: no CUDA GPU is visible to torch on this machine "
                          f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); "
                          "use --device cpu or --device auto")
    if text == "cuda":
        index = local_rank if world > 1 else 0
    else:
        if world > 1:
            raise ConfigError(f"device={requested!r}: under torchrun each rank uses "
                              "cuda:LOCAL_RANK; pass --device cuda (or auto)")
        index = int(text.split(":")[1])
    if index >= count:
        raise ConfigError(f"device={requested!r}: GPU {index} does not exist; this machine has "
                          f"{count} CUDA GPU(s) (cuda:0..cuda:{count - 1})")
    return torch.device("cuda", index)


def name(device: torch.device) -> str:
    """How the resolved device is recorded in runs.config: ``cpu`` or ``cuda:N``."""
    return "cpu" if device.type == "cpu" else f"{device.type}:{device.index or 0}"


def autocast(device: torch.device):
    """bf16 autocast on CUDA (matrix products in bf16, reductions in fp32); nothing on the CPU,
    where bf16 is slower than fp32 on most processors and the CPU results must stay as before."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


ROLLOUT_DTYPES = ("auto", "fp32", "bf16")
"""The sampling pass's precision (``--rollout-dtype``): auto as ``autocast`` (bf16 on CUDA, fp32
on the CPU); fp32 or bf16 whatever the device. The update keeps ``autocast``'s."""


def rollout_autocast(device: torch.device, dtype: str = "auto"):
    """The context the sampling pass runs in for ``dtype`` (``ROLLOUT_DTYPES``). bf16 on the CPU
    is torch's CPU autocast: the matrix products in bf16, as a bf16 inference engine samples,
    while the update scores the same tokens in fp32 -- the training-inference mismatch of
    core/learn/mismatch.py at laptop scale."""
    if dtype == "auto":
        return autocast(device)
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if dtype == "fp32":
        return full_precision(device)
    raise ValueError(f"rollout dtype must be one of {ROLLOUT_DTYPES}, got {dtype!r}")


def full_precision(device: torch.device):
    """Autocast off: for the vocabulary projection whose logits become logprobs and the loss."""
    if device.type == "cuda":
        return torch.autocast("cuda", enabled=False)
    return contextlib.nullcontext()


class StepClock:
    """Per-step GPU metrics on CUDA (none on the CPU):

    * ``gpu/max_memory_allocated_mb``: ``torch.cuda.max_memory_allocated`` / 2**20 over the step
      (the peak is reset at the step's start);
    * ``gpu/step_s``: seconds the GPU stream spent between the step's start and end (CUDA
      events; the kernels' wall time on the device, waits on the CPU included).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self._start = self._end = None

    def start(self) -> None:
        if not self.cuda:
            return
        torch.cuda.reset_peak_memory_stats(self.device)
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)
        self._start.record()

    def metrics(self) -> dict[str, float]:
        if not self.cuda or self._start is None:
            return {}
        self._end.record()
        torch.cuda.synchronize(self.device)
        return {"gpu/max_memory_allocated_mb": torch.cuda.max_memory_allocated(self.device) / 2**20,
                "gpu/step_s": self._start.elapsed_time(self._end) / 1000.0}


def synchronize(device: torch.device) -> float:
    """Wait for the device's queued work (so wall-clock timings include it); returns now."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
