"""Data parallelism with PyTorch's own runtime: ``torchrun --nproc_per_node N -m core.train ...``.

torchrun starts N copies of the CLI and sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``; ``Ranks.from_env()`` joins them into one process group.
One RL step on N ranks:

    every rank draws the same ``tasks_per_step`` tasks; rank k rolls out the k-th contiguous block
    of ``tasks_per_step / N`` of them, all G rollouts of each (a group is never split)
    -> the ranks exchange their scored trajectories and each computes the advantages over the
       whole batch, identically (group statistics, StarPO-S's top groups, PPO's whitening)
    -> each rank backpropagates its own trajectories, each loss weighted by the *global* batch's
       totals (its tokens / all ranks' tokens for token-mean), then one all_reduce sums the
       gradients: every rank holds the gradient one process would compute over the whole batch
    -> clip and step: identical gradients, identical optimizer steps (one optimizer state,
       replicated on every rank); rank 0 writes the checkpoint
    -> rank 0 gathers every rank's records and writes the step in one transaction. It is the only
       process that opens the store, so no rank ever waits on a database lock.

Why an explicit all_reduce and not DistributedDataParallel: the update accumulates one microbatch
per trajectory and records each trajectory's own gradient increment, and ranks may hold different
numbers of trainable trajectories (filtered ones). DDP would reduce on every backward (or need
``no_sync`` bookkeeping and equal backward counts); one reduction after the accumulation is the
same arithmetic, once per optimizer step.

Backends: the process group is gloo (configuration, trajectories and metrics are Python objects
and CPU numbers). Each rank trains on ``cuda:LOCAL_RANK`` when ``--device`` gives it a GPU
(core/model/device.py): one rank per GPU. When every rank has one, ``use_device`` opens a second group
on NCCL for the gradient and parameter tensors, which then never leave the GPUs; when any rank is
on the CPU they go through gloo as CPU tensors (copied off and back on the GPU ranks).
Held-out evaluation and SFT demonstrations are split across ranks the same way.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable, Sequence

import torch
import torch.distributed as dist

from core.config import ConfigError

TIMEOUT = timedelta(minutes=30)
"""How long a rank waits for the others at a collective (a slow step on one rank is normal)."""


def check(cfg, world: int) -> None:
    """ConfigError unless the batch splits into whole groups per rank."""
    if world <= 1:
        return
    if cfg.tasks_per_step % world:
        raise ConfigError(f"tasks_per_step={cfg.tasks_per_step} must be divisible by the number of "
                          f"ranks ({world}): each rank rolls out whole groups, tasks_per_step / "
                          "ranks tasks of group_size rollouts each")
    if cfg.sft_steps and cfg.sft_batch_size % world:
        raise ConfigError(f"sft_batch_size={cfg.sft_batch_size} must be divisible by the number "
                          f"of ranks ({world}) when sft_steps > 0")


@dataclass
class Ranks:
    """This process's place among the ranks. ``Ranks()`` is one process: every method is the
    identity, so the trainer reads the same for 1 or N processes (like NullRecorder)."""
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    tensor_group: Any = None
    """The NCCL group for gradients and parameters when every rank is on a GPU (``use_device``);
    None: the default gloo group, through CPU copies."""
    backend: str = "gloo"
    """Which backend the gradient and parameter tensors travel on: nccl or gloo."""

    @classmethod
    def from_env(cls) -> "Ranks":
        """Join torchrun's process group (gloo) when ``WORLD_SIZE`` > 1; else one process.
        ``use_device`` adds the NCCL group once the ranks' devices are known."""
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return cls()
        if not dist.is_initialized():
            dist.init_process_group("gloo", timeout=TIMEOUT)
        return cls(rank=dist.get_rank(), world=dist.get_world_size(),
                   local_rank=int(os.environ.get("LOCAL_RANK", "0")))

    def use_device(self, device: torch.device) -> None:
        """Train on ``device`` (this rank's): when every rank's is a GPU, gradients and parameters
        are reduced with NCCL on the GPUs; otherwise with gloo on CPU copies. Every rank calls it."""
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if self.world == 1:  # nothing to reduce
            return
        kinds, _ = self.everyone([device.type])
        if all(k == "cuda" for k in kinds) and dist.is_nccl_available():
            self.tensor_group = dist.new_group(backend="nccl", timeout=TIMEOUT)
            self.backend = "nccl"
        else:
            self.tensor_group, self.backend = None, "gloo"

    def _reduce_flat(self, flat: torch.Tensor, op: str) -> torch.Tensor:
        """All-reduce (``sum``) or broadcast from rank 0 (``broadcast``) one flat tensor, on the
        NCCL group where there is one, else on gloo through a CPU copy; returns the result on
        ``flat``'s device."""
        if self.tensor_group is not None:
            if op == "sum":
                dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.tensor_group)
            else:
                dist.broadcast(flat, src=0, group=self.tensor_group)
            return flat
        host = flat.cpu()
        if op == "sum":
            dist.all_reduce(host, op=dist.ReduceOp.SUM)
        else:
            dist.broadcast(host, src=0)
        return host.to(flat.device)

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes the store and the checkpoint."""
        return self.rank == 0

    def close(self) -> None:
        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()

    # -- splitting the batch --------------------------------------------------------------------
    def block(self, n: int) -> range:
        """This rank's contiguous share of ``n`` items (sizes differ by at most one)."""
        base, extra = divmod(n, self.world)
        start = self.rank * base + min(self.rank, extra)
        return range(start, start + base + (self.rank < extra))

    def everyone(self, mine: Sequence) -> tuple[list, int]:
        """All ranks' items in rank order, this rank's own objects in place (not copies), and
        where this rank's items start in that list."""
        if self.world == 1:
            return list(mine), 0
        parts: list[Any] = [None] * self.world
        dist.all_gather_object(parts, list(mine))
        parts[self.rank] = list(mine)
        return [x for part in parts for x in part], sum(len(p) for p in parts[:self.rank])

    def gather(self, obj: Any) -> list | None:
        """Every rank's ``obj`` on rank 0 (in rank order); None on the other ranks."""
        if self.world == 1:
            return [obj]
        out = [None] * self.world if self.main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj if self.main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # -- numbers and gradients --------------------------------------------------------------------
    def sum(self, values: Iterable[float]) -> list[float]:
        """Element-wise sum over ranks (float64, so token counts stay exact)."""
        t = torch.tensor(list(values), dtype=torch.float64)
        if self.world > 1 and t.numel():
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def max(self, values: Iterable[float]) -> list[float]:
        t = torch.tensor(list(values), dtype=torch.float64)
        if self.world > 1 and t.numel():
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def sum_grads(self, params: Sequence[torch.Tensor]) -> None:
        """Replace each parameter's gradient by its sum over ranks (one flat all_reduce).

        The losses were already weighted by global totals, so the sum is the batch gradient.
        A rank that backpropagated nothing contributes zeros."""
        if self.world == 1:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = self._reduce_flat(torch.cat([p.grad.reshape(-1) for p in params]), "sum")
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n

    def sync_parameters(self, params: Sequence[torch.Tensor]) -> None:
        """Rank 0's parameter values on every rank (DDP does the same at construction)."""
        if self.world == 1:
            return
        with torch.no_grad():
            flat = self._reduce_flat(torch.cat([p.detach().reshape(-1) for p in params]),
                                     "broadcast")
            offset = 0
            for p in params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()


ONE = Ranks()
"""A single process."""


# -- trajectory ids on a rank ---------------------------------------------------------------------
def number_rollouts(trajs: Sequence, prefix: str, first_group: int, group_size: int) -> None:
    """Give a rank's rollouts the ids one process would: ``{prefix}-g{group}-r{rollout}`` with the
    group's index in the whole batch (core.rollout.engine numbers groups from 0 on every rank)."""
    for i, t in enumerate(trajs):
        g, r = first_group + i // group_size, i % group_size
        t.group_id, t.traj_id = f"{prefix}-g{g}", f"{prefix}-g{g}-r{r}"


def number_demos(trajs: Sequence, prefix: str, first: int) -> None:
    """The same for SFT demonstrations (core.rollout.sft): ``{prefix}-d{index in the whole batch}``."""
    for i, t in enumerate(trajs):
        t.traj_id = t.group_id = f"{prefix}-d{first + i}"


def gather_step(ranks: Ranks, trajs: Sequence, results) -> tuple[list, Any, list[int]] | None:
    """On rank 0: every rank's step trajectories (in rank order), their stage results merged
    (core/run/stage_results.py ``StageResults.merge``) and each trajectory's rank; None on the others."""
    parts = ranks.gather((list(trajs), results))
    if parts is None:
        return None
    merged = parts[0][1]
    for _, other in parts[1:]:
        merged = merged.merge(other)
    return ([t for part, _ in parts for t in part], merged,
            [k for k, (part, _) in enumerate(parts) for _ in part])
