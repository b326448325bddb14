"""Training across ranks (``torchrun``): joining the process group, wrapping the model, and keeping the
ranks' collectives in step. Everything the benchmark's training loop does differently with more than
one process is here: DDP, or FSDP2 (:func:`padless.models.fsdp.shard_model`) as the other branch of :func:`wrap_model`.

A step's micro-batch count depends on its examples' lengths under bucketing and token-budget batching,
so it differs between ranks. DDP all-reduces gradients in every ``backward()`` it is allowed to sync
(and may broadcast buffers in every forward), so ranks with different counts would issue different
collectives (gloo: "Received data size doesn't match expected size"). Hence, per step:

- the ranks agree on the number of micro-batches (:func:`agree_count`, the largest of any rank) and a
  rank with fewer runs filler micro-batches whose loss is multiplied by zero: they run forward and
  backward like any other (the same collectives), and add nothing to the gradient or the loss (they
  count in the step's fed tokens and executed FLOPs: uneven ranks cost that much);
- every micro-batch but the last runs under :meth:`DataParallel.sync` ``(False)`` (DDP's ``no_sync``):
  gradients accumulate locally and are all-reduced once per step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any  # torch is imported where used: `padless bench --help` imports this module


def init_distributed(device_name: str, distributed: str = "ddp") -> tuple[int, int]:
    """``(rank, world_size)``; under ``torchrun`` this joins the process group (gloo on CPU, NCCL on
    CUDA), after binding the process to its own GPU (:func:`padless.devices.resolve_device`: ``LOCAL_RANK``
    where that many GPUs are visible, else the GPU the launcher left visible). ``distributed="fsdp"``
    joins with one process too (FSDP2 shards over a group), and outside ``torchrun`` is refused."""
    import os

    import torch
    import torch.distributed as dist

    from padless.batching.samplers import world_info
    from padless.devices import resolve_device

    rank, world_size = world_info()
    if distributed == "fsdp" and not dist.is_initialized() and "WORLD_SIZE" not in os.environ:
        raise ValueError(
            "distributed='fsdp' runs under torchrun (its ranks shard the model): "
            "`torchrun --nproc-per-node N -m padless bench ...`, N >= 1"
        )
    if (world_size > 1 or distributed == "fsdp") and not dist.is_initialized():
        on_gpu = torch.cuda.is_available() and device_name != "cpu"
        if on_gpu:  # each rank on its own GPU before NCCL starts (else every rank works on GPU 0)
            torch.cuda.set_device(resolve_device("cuda" if device_name == "auto" else device_name).index)
        dist.init_process_group("nccl" if on_gpu else "gloo")
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return rank, world_size


@dataclass(frozen=True)
class DataParallel:
    """A model as the training loop runs it: ``module`` is what forward is called on."""

    module: Any
    """The wrapped model (DDP) or the model itself (one process)."""
    world_size: int
    """Processes training together (1: no wrapping, nothing to synchronise)."""
    kind: str = "none"
    """``none`` (one process), ``ddp`` (``DistributedDataParallel``) or ``fsdp`` (FSDP2, sharded in place)."""

    def sync(self, on: bool) -> contextlib.AbstractContextManager[Any]:
        """A context for one micro-batch's forward and backward: gradients are all-reduced (FSDP2:
        reduce-scattered) in its backward only when ``on`` (the step's last micro-batch); else they
        accumulate locally."""
        from padless.models.fsdp import sync_gradients

        if on or self.kind == "none":
            return contextlib.nullcontext()
        return sync_gradients(self.module, False)  # DDP's no_sync, FSDP2's set_requires_gradient_sync


def wrap_model(model: Any, device: Any, world_size: int, kind: str = "ddp") -> DataParallel:
    """``model`` ready for data-parallel training over ``world_size`` ranks: ``ddp`` (unwrapped for one
    rank) or ``fsdp`` (:func:`padless.models.fsdp.shard_model` in place, one rank included). Build the optimiser
    after: FSDP2 replaces the parameters by their shards."""
    if kind == "fsdp":
        from padless.models.fsdp import shard_model

        return DataParallel(shard_model(model), world_size, "fsdp")
    if world_size == 1:
        return DataParallel(model, 1)
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DataParallel(DistributedDataParallel(model, device_ids=ids), world_size, "ddp")


def agree_count(count: int, device: Any, world_size: int) -> int:
    """The largest ``count`` of any rank (an all-reduce; ``count`` itself for one process)."""
    if world_size == 1:
        return count
    import torch
    import torch.distributed as dist

    from padless.objectives.loss import reduce_device

    t = torch.tensor([count], dtype=torch.long, device=reduce_device(torch.device(device), dist.get_backend()))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def fillers(micro: Sequence[Any], count: int) -> list[Any]:
    """``count - len(micro)`` filler micro-batches (the smallest of ``micro``, run with zero weight),
    so that this rank runs ``count`` micro-batches like the others."""
    if count <= len(micro):
        return []
    if not micro:
        raise ValueError("a rank has no micro-batch in this step: give every rank at least one example per step")
    smallest = min(micro, key=lambda b: int(b["input_ids"].numel()))
    return [smallest] * (count - len(micro))


def all_reduce_step(counts: list[float], device: Any) -> list[float]:
    """[time, loss, real, padded, sequences, ...] of this rank -> max time, summed rest over ranks."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(counts[:1], dtype=torch.float64, device=device)
    rest = torch.tensor(counts[1:], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    dist.all_reduce(rest)
    return [t.item(), *rest.tolist()]
