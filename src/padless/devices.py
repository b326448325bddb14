"""Devices and dtypes: the floor every torch-side stage may import (it imports nothing of padless).

Dtype names (``float32``, ``bfloat16``) as padless writes them in reports and tolerance tables,
whether a dtype is half precision, and a device or dtype from its name (``auto`` included).

A model's device and its compute dtype are read here too, for every caller: :func:`device_of` (the
device of a model's parameters), :func:`compute_target` (where a training step's attention runs and in which dtype:
an explicit device / dtype, else the model's; autocast for that device, and FSDP2's mixed-precision
``param_dtype``, count) and :func:`compute_dtype` (the dtype a forward computed in). The exactness
rule's model facts (:mod:`padless.attention.facts`), the collators, the isolation checks and the
trainers ask these, so a model's device and compute dtype are decided in one place.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where used: the CLI checks a --device name before torch loads
    import torch

HALF_PRECISION: tuple[str, ...] = ("float16", "bfloat16")
"""16-bit floating dtypes (by torch name): the ones flash kernels take and autocast computes in."""


def dtype_name(dtype: torch.dtype | str) -> str:
    """A dtype's torch name without the ``torch.`` prefix (``torch.bfloat16`` -> ``bfloat16``)."""
    return str(dtype).removeprefix("torch.")


def is_half_precision(dtype: torch.dtype | str) -> bool:
    """Whether ``dtype`` (a torch dtype or its name) is one of :data:`HALF_PRECISION`."""
    return dtype_name(dtype) in HALF_PRECISION


def resolve_device(name: str = "auto") -> torch.device:
    """A torch device from its name: ``auto`` is CUDA when available, else the CPU. A bare accelerator
    type (``cuda``) gets this process's ``LOCAL_RANK`` as index (one accelerator per process under
    ``torchrun``) when this process sees that many devices; a launcher that binds one visible device
    per process (``CUDA_VISIBLE_DEVICES`` per rank: SLURM, Kubernetes) leaves fewer, and then the
    current device is used (0 unless the process chose another)."""
    import os

    import torch

    if not isinstance(name, str) or not name:
        raise ValueError(f"device must be a device name such as 'auto', 'cpu' or 'cuda:0', got {name!r}")
    try:
        device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)
    except RuntimeError as exc:
        raise ValueError(f"device={name!r} is not a device name (auto, cpu, cuda, cuda:1, ...): {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={name!r}: this machine has no CUDA GPU that torch {torch.__version__} can use; use 'cpu' or 'auto'"
        )
    if device.type != "cpu" and device.index is None:
        device = torch.device(device.type, _default_index(device.type, int(os.environ.get("LOCAL_RANK", 0))))
    if device.type == "cuda" and device.index >= torch.cuda.device_count():
        raise ValueError(f"device={name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def _default_index(device_type: str, local_rank: int) -> int:
    """``local_rank`` where this process sees more than ``local_rank`` devices of ``device_type``, else
    the current device (``torch.<type>.current_device()``, 0 where the module has none)."""
    import torch

    module = getattr(torch, device_type, None)
    count = module.device_count() if hasattr(module, "device_count") else 0
    if local_rank < count:
        return local_rank
    return int(module.current_device()) if hasattr(module, "current_device") and count else 0


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """A torch dtype from its name: ``auto`` is bfloat16 on a CUDA device that supports it, else float32."""
    import torch

    if name == "auto":
        cuda_bf16 = device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if cuda_bf16 else torch.float32
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype {name!r} is not a torch floating dtype (auto, float32, bfloat16, float16)")
    return dtype


def device_of(model: Any) -> Any:
    """The device of ``model``'s parameters (``model.device`` where it has one), ``cpu`` for a model without any."""
    device = getattr(model, "device", None)
    if device is None:
        device = next((p.device for p in model.parameters()), "cpu") if hasattr(model, "parameters") else "cpu"
    return device


def sharded_param_dtype(model: Any) -> torch.dtype | None:
    """The dtype a sharded model computes in when FSDP2's mixed precision casts its parameters
    (``param_dtype`` of :func:`padless.models.fsdp.shard_model`), else ``None`` (the parameters' own).
    Read from FSDP2's state of the root module (torch 2.13); ``torch.distributed.fsdp`` is never
    imported here: where it is absent, nothing is sharded."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    sharded = getattr(fsdp, "FSDPModule", None)
    inner = getattr(model, "module", model)
    if sharded is None or not isinstance(inner, sharded):
        return None
    policy = getattr(inner._get_fsdp_state(), "_mp_policy", None)
    return getattr(policy, "param_dtype", None)


def compute_target(model_or_config: Any, device: Any = None, dtype: Any = None) -> tuple[torch.device, torch.dtype]:
    """Where the attention of a training step will run: ``(device, compute dtype)``.

    ``device`` defaults to the device of the model's parameters (the CPU for a config), ``dtype`` to
    the model's compute dtype (an FSDP2 model's ``param_dtype``, else ``model.dtype``; float32 for a
    config). Give both when the weights are not yet where training runs: a collator built before
    ``model.to("cuda")``, under DeepSpeed, or for fp32 master weights trained under bf16 autocast
    (``Trainer(bf16=True)``). Autocast enabled for the device's type when this is called counts too:
    its dtype is the compute dtype."""
    import torch

    device = torch.device(device_of(model_or_config) if device is None else device)
    if torch.is_autocast_enabled(device.type):
        return device, torch.get_autocast_dtype(device.type)
    if dtype is None and hasattr(model_or_config, "forward"):
        dtype = sharded_param_dtype(model_or_config) or getattr(model_or_config, "dtype", None)
    if dtype is None:
        dtype = torch.float32
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch dtype (torch.bfloat16, ...), got {dtype!r}")
    return device, dtype


def compute_dtype(model: Any, logits: torch.Tensor | None = None) -> torch.dtype:
    """The dtype the model computes in: the autocast dtype when autocast is on for the model's
    device, else the dtype of ``logits`` when given (fp32 master weights under autocast give bf16
    logits), else the model's own (:func:`compute_target`)."""
    import torch

    device_type = next(model.parameters()).device.type
    if logits is not None and not torch.is_autocast_enabled(device_type):
        return logits.dtype
    return compute_target(model)[1]
