"""Sequence lengths -> the index tensors a packed row is described by.

A packed row of ``L`` tokens holding documents of lengths ``[3, 2, 4]`` (L = 9) is described by::

    position_ids   0 1 2 0 1 0 1 2 3     restart at 0 for every document
    document_ids   0 0 0 1 1 2 2 2 2     which document each token belongs to
    cu_seqlens     0 3 5 9               cumulative offsets (flash-attn's varlen convention)

Padding at the end of a row is its own document (position ids restart at 0 there too), so a row
stays a valid packed row and padding never joins the last real document. Functions take numpy or
python ints and return numpy int64 arrays; the collators turn them into tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

IGNORE_INDEX = -100
"""The label value that cross-entropy ignores (``torch.nn.CrossEntropyLoss``'s default)."""


def _as_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(lengths, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be one-dimensional, got shape {arr.shape}")
    if arr.size and arr.min() < 1:
        i = int(np.argmin(arr))
        raise ValueError(f"document {i} has length {int(arr[i])}; every document needs at least 1 token")
    return arr


def cu_seqlens_from_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """``[n + 1]`` cumulative offsets, starting at 0."""
    arr = _as_lengths(lengths)
    out = np.zeros(arr.size + 1, dtype=np.int64)
    np.cumsum(arr, out=out[1:])
    return out


def position_ids_from_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """``[sum(lengths)]`` positions restarting at 0 at every document start."""
    arr = _as_lengths(lengths)
    total = int(arr.sum())
    starts = np.repeat(cu_seqlens_from_lengths(arr)[:-1], arr)
    return np.arange(total, dtype=np.int64) - starts


def document_ids_from_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """``[sum(lengths)]`` the index of the document each token belongs to."""
    arr = _as_lengths(lengths)
    return np.repeat(np.arange(arr.size, dtype=np.int64), arr)


def lengths_from_position_ids(position_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Inverse of :func:`position_ids_from_lengths` for one row: a new document starts at every 0.

    Raises if the ids are not a concatenation of ``0, 1, ..., l-1`` runs, since a row whose
    positions do not restart cleanly cannot be split into documents unambiguously.
    """
    pos = np.asarray(position_ids, dtype=np.int64)
    if pos.ndim != 1:
        raise ValueError(f"position_ids must be one row (1-D), got shape {pos.shape}")
    if pos.size == 0:
        return np.zeros(0, dtype=np.int64)
    if pos[0] != 0:
        raise ValueError(f"position_ids must start at 0, got {int(pos[0])}")
    starts = np.flatnonzero(pos == 0)
    lengths = np.diff(np.append(starts, pos.size))
    if not np.array_equal(pos, position_ids_from_lengths(lengths)):
        bad = int(np.flatnonzero(pos != position_ids_from_lengths(lengths))[0])
        raise ValueError(f"position_ids do not count up by 1 inside a document (at index {bad})")
    return lengths
