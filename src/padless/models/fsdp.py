"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for a causal LM trained on packed rows.

    from padless.models.fsdp import init_distributed, shard_model, sync_gradients

    device = init_distributed()                         # under torchrun: gloo on CPU, NCCL on cuda:LOCAL_RANK
    collator = padless.PackingCollator.for_model(model, max_length=2048)   # before sharding
    shard_model(model)                                  # each decoder layer, then the root
    for i, batch in enumerate(micro_batches):           # from padless.DistributedPackedBatchSampler
        with sync_gradients(model, i == len(micro_batches) - 1):
            padless.model_loss(model, batch, num_items, world_size=W).backward()

:func:`shard_model` applies ``fully_shard`` to each decoder block (:func:`decoder_layers`) and then
to the model itself (embeddings, final norm and LM head, tied weights kept together in the root
group): each rank holds ``1 / W`` of every parameter, all-gathers a block just before it runs and
reduce-scatters its gradient after. Packing changes none of that: attention still sees one rank's
rows with their ``cu_seq_lens`` or block mask, and the exactness rule
(:func:`padless.attention.select.check_exact`) reads the model's config and attention backend,
which sharding keeps.

The loss is the same as under DDP. FSDP2 averages the reduce-scattered gradients over the ranks (its
default divide factor is the world size), so :func:`padless.model_loss` with
``world_size=W`` and the step's trained tokens counted over every micro-batch and rank
(:func:`padless.step_num_items`) gives each rank its shard of exactly the gradient one process
gets over all ranks' rows (tests/integrations/test_fsdp.py, 2 gloo ranks, fp32). Every rank must
run the same number of forwards and backwards per step (each one all-gathers): the packed sampler
gives every rank the same number of micro-batches, an empty row where one has run out.

:func:`sync_gradients` is the accumulation switch for DDP (``no_sync``) and FSDP2
(``set_requires_gradient_sync``) alike: micro-batches but the last of a step keep their gradients
local (FSDP2: unsharded, so accumulation costs a full gradient's memory per rank; leave it on to
reduce-scatter every micro-batch instead, the same sum). :func:`full_tensors` gathers whole
parameters or gradients (a collective), for checks and for saving; :func:`compute_dtype` is the
dtype FSDP2's mixed precision computes in, which collators and the exactness rule must judge.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist  # its fsdp, tensor and device_mesh: imported where used (heavy, not in every build)


def init_distributed(device: str = "auto") -> torch.device:
    """Join the ``torchrun`` process group (if not joined yet) and return this rank's device.

    ``device``: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``. A bare
    ``cuda`` is ``cuda:LOCAL_RANK``, or the current device when the launcher made fewer GPUs visible
    (one per process; :func:`padless.devices.resolve_device`); it becomes the current device before NCCL starts (else every rank works on GPU 0), and the
    group's backend is ``nccl``; on the CPU ``gloo``. Under ``torchrun`` (``WORLD_SIZE`` set) the group
    is joined even with one process, so :func:`shard_model` runs there too; outside it nothing is
    joined. ``ValueError`` names a device this machine does not have.
    """
    from padless.devices import resolve_device

    rank_device = resolve_device(device)  # bare cuda: LOCAL_RANK, or the single GPU the launcher left visible
    if rank_device.type == "cuda":
        torch.cuda.set_device(rank_device)
    if os.environ.get("WORLD_SIZE") and not dist.is_initialized():  # launched by torchrun
        dist.init_process_group("nccl" if rank_device.type == "cuda" else "gloo")
    return rank_device


def shard_model(
    model: Any,
    *,
    mesh: Any = None,
    reshard_after_forward: bool = True,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
    cpu_offload: bool = False,
) -> Any:
    """Shard ``model`` in place with FSDP2 over the ranks of ``mesh`` (default: every rank of the
    initialised process group, on its device) and return it: ``fully_shard`` on each decoder layer,
    then on the model (the rest: embeddings, final norm, LM head).

    ``reshard_after_forward``: free each block's gathered parameters after its forward and gather them
    again for the backward (less memory, one more all-gather per block). ``param_dtype`` /
    ``reduce_dtype``: FSDP2's mixed precision (e.g. bfloat16 compute and float32 gradient reduction
    over float32 master weights); ``None`` keeps the parameters' dtype. ``cpu_offload``: keep a GPU
    model's shards and their optimiser step on the CPU (not run yet: no GPU was at hand).

    Build the optimiser after: sharding replaces every parameter by a new one holding a ``DTensor``
    shard (under the same name). Collators (:meth:`padless.PackingCollator.for_model`) may be built
    before or after: sharding keeps the config and the attention backend the exactness rule reads.
    ``ValueError`` when ``torch.distributed`` is not initialised, the model is sharded already, its
    parameters sit on several devices, or no decoder layers are found.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

    from padless.models.compile import decoder_layers

    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if mesh is None and not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "shard_model needs torch.distributed: launch with torchrun and call "
            "padless.models.fsdp.init_distributed() (or torch.distributed.init_process_group) first"
        )
    if isinstance(model, FSDPModule) or any(isinstance(m, FSDPModule) for m in model.modules()):
        raise ValueError(f"{type(model).__name__} is sharded already (fully_shard was applied to it or to a submodule)")
    try:
        layers = decoder_layers(model)
    except ValueError:
        raise ValueError(
            f"shard_model found no decoder layers in {type(model).__name__} (no nn.ModuleList of "
            "config.num_hidden_layers blocks of one class); apply torch.distributed.fsdp.fully_shard "
            "to its blocks and then to the model yourself"
        ) from None
    if mesh is None:
        mesh = _mesh_on(model)
    options: dict[str, Any] = {
        "mesh": mesh,
        "reshard_after_forward": reshard_after_forward,
        "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
    }
    if cpu_offload:
        if mesh.device_type == "cpu":
            raise ValueError(
                "cpu_offload=True keeps a GPU model's shards on the CPU; this model is on the CPU "
                "already: leave cpu_offload off"
            )
        options["offload_policy"] = CPUOffloadPolicy()
    for layer in layers:
        fully_shard(layer, **options)
    fully_shard(model, **options)  # FSDP2 keeps the root's parameters gathered after its forward by itself
    return model


def _mesh_on(model: Any) -> Any:
    """A 1-D device mesh over every rank, of the device type the model's parameters are on (FSDP2's
    own default takes the machine's accelerator: CUDA on a GPU box even for a gloo run on the CPU).
    On CUDA the parameters must sit on this rank's current device, where FSDP2 puts its shards."""
    from torch.distributed.device_mesh import init_device_mesh

    devices = {p.device for p in model.parameters()}
    if len(devices) != 1:
        raise ValueError(f"shard_model needs every parameter on one device, found {sorted(map(str, devices))}")
    device = devices.pop()
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        raise ValueError(
            f"the model is on {device} but this rank's current CUDA device is "
            f"cuda:{torch.cuda.current_device()}: call padless.models.fsdp.init_distributed() (it sets "
            "cuda:LOCAL_RANK) and move the model to the device it returns"
        )
    return init_device_mesh(device.type, (dist.get_world_size(),))


def is_sharded(model: Any) -> bool:
    """Whether ``model`` (or a wrapper's ``module``) was sharded with FSDP2's ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(getattr(model, "module", model), FSDPModule)


def compute_dtype(model: Any) -> torch.dtype | None:
    """The dtype a sharded model computes in when FSDP2's mixed precision casts its parameters
    (``param_dtype`` of :func:`shard_model`), else ``None`` (the parameters' own). What the
    exactness rule must judge (flash kernels take 16-bit inputs only), not ``model.dtype``, which
    stays the fp32 of the shards: :func:`padless.devices.sharded_param_dtype`, which
    :func:`padless.devices.compute_target` (a training step's compute dtype) reads too."""
    from padless.devices import sharded_param_dtype

    return sharded_param_dtype(model)


@contextlib.contextmanager
def sync_gradients(model: Any, sync: bool) -> Iterator[None]:
    """Within this context, a backward reduces gradients over the ranks (``sync=True``, the last
    micro-batch of a step) or accumulates them on this rank only (``sync=False``).

    DistributedDataParallel: its ``no_sync``; FSDP2: ``set_requires_gradient_sync``, restored to on
    afterwards; a model on one process: nothing."""
    from torch.distributed.fsdp import FSDPModule

    if sync:
        yield
    elif isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    elif callable(getattr(model, "no_sync", None)):
        with model.no_sync():
            yield
    else:
        yield


def full_tensors(model: Any, *, grads: bool = False) -> dict[str, torch.Tensor]:
    """``name -> whole tensor`` of every parameter (``grads=False``) or of every gradient that exists
    (``grads=True``), gathered from the shards onto every rank, on the CPU. A collective when the
    model is sharded: every rank must call it. Plain tensors (an unsharded model) are copied."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, param in getattr(model, "module", model).named_parameters():
        value = param.grad if grads else param
        if value is None:
            continue
        value = value.full_tensor() if isinstance(value, DTensor) else value
        out[name] = value.detach().cpu().clone()
    return out
