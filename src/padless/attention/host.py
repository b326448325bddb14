"""Host copies of a packed batch's boundary tensors: a forward reads them with at most one device sync.

padless decides on the host how to run a packed batch (bucket plans, ``max_seqlen``, the checks that
``position_ids`` and ``cu_seq_lens_q/k`` agree), so it needs the boundaries as numbers. On a GPU every
``.cpu()``, ``.item()``, ``nonzero`` or ``torch.equal`` of a device tensor waits until the GPU has
run everything queued before it, and the CPU stops running ahead. So:

- :func:`remember_host_copy`: a device tensor whose values are known on the host (the collator made
  them on the CPU; :func:`padless.batch_to` records them when it moves a batch) is read from there, with
  no sync at all;
- :func:`host_values`: the others are fetched together, in ONE device-to-host transfer;
- :func:`to_device`: small host arrays go the other way through pinned memory, without blocking.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

_COPIES: dict[int, tuple[weakref.ref, int, np.ndarray]] = {}
"""id(device tensor) -> (the tensor, its version when recorded, its values on the host)."""


def remember_host_copy(tensor: torch.Tensor, host: Any) -> None:
    """Record that ``tensor`` holds the values of ``host`` (a CPU tensor or array of the same shape), so
    :func:`host_values` reads them without touching the device. Forgotten when ``tensor`` is freed or
    changed in place."""
    values = np.array(host.detach().numpy() if hasattr(host, "detach") else host)  # a copy: host may change later
    if tuple(values.shape) != tuple(tensor.shape):
        raise ValueError(f"host copy of shape {values.shape} does not match the tensor's {tuple(tensor.shape)}")
    key = id(tensor)
    _COPIES[key] = (weakref.ref(tensor, lambda _, key=key: _COPIES.pop(key, None)), tensor._version, values)


BOUNDARY_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "position_ids", "tree_cu_seqlens", "tree_parents")
"""Batch keys whose values padless reads on the host in a forward."""


def remember_moved(before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """For a batch moved to a device (``before``: as collated, on the CPU; ``after``: moved), remember
    the host values of its :data:`BOUNDARY_KEYS` tensors, so a forward reads them without a sync."""
    for key in BOUNDARY_KEYS:
        src, dst = before.get(key), after.get(key)
        if (
            hasattr(src, "device")
            and hasattr(dst, "device")
            and src.device.type == "cpu"
            and not src.is_floating_point()
        ):
            remember_host_copy(dst, src)


def _remembered(tensor: torch.Tensor) -> np.ndarray | None:
    entry = _COPIES.get(id(tensor))
    if entry is None or entry[0]() is not tensor or entry[1] != tensor._version:
        return None
    return entry[2]


def host_values(tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """int64 host copies of integer ``tensors`` (same shapes): remembered copies for free, all the
    others in one transfer (one device sync however many there are)."""
    out: list[np.ndarray | None] = [_remembered(t) for t in tensors]
    missing = [i for i, v in enumerate(out) if v is None]
    if missing:
        flat = torch.cat([tensors[i].detach().reshape(-1).to(torch.int64) for i in missing])
        fetched = flat.cpu().numpy()  # a single device sync for all missing tensors
        sizes = np.cumsum([tensors[i].numel() for i in missing])[:-1]
        for i, part in zip(missing, np.split(fetched, sizes)):
            out[i] = part.reshape(tuple(tensors[i].shape))
    return [np.asarray(v, dtype=np.int64) for v in out]  # type: ignore[arg-type]


def to_device(values: np.ndarray, device: Any) -> torch.Tensor:
    """``values`` as a tensor on ``device``; to a GPU through pinned memory without blocking the host."""
    tensor = torch.from_numpy(np.ascontiguousarray(values))
    if torch.device(device).type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
