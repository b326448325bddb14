"""Devices and dtypes: the floor every torch-side stage may import (it imports nothing of padless).

Dtype names (``float32``, ``bfloat16``) as padless writes them in reports and tolerance tables,
whether a dtype is half precision, and a device or dtype from its name (``auto`` included).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
        raise ValueError(f"device={name!r}: this machine has no CUDA GPU that torch {torch.__version__} can use; "
                         "use 'cpu' or 'auto'")  # fmt: skip
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
