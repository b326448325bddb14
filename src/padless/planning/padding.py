"""The one definition of padding that ``padless stats`` and ``padless bench`` share.

A batch computes every position of its tensors: ``computed`` tokens, ``real`` of which are the data's
own tokens; the rest is padding. :func:`padding_fraction` is ``1 - real / computed``, whatever the
way of batching (padding collators, bucketing, packed rows). :func:`padded_tokens` is what a list of
units (sequences, pieces of them, or packed rows) costs when fed ``batch_size`` at a time, each batch
padded to its longest unit, as both the padding collators and :class:`padless.PackingCollator` (whose
batch is as wide as its longest row, not ``max_length``) build them. :func:`placed_lengths` is what
one overlong policy leaves of each sequence, so every way of batching places the same tokens.
"""

from __future__ import annotations

import numpy as np


def padding_fraction(real_tokens: int, computed_tokens: int) -> float | None:
    """``1 - real_tokens / computed_tokens``: the share of computed tokens that are padding; None when
    nothing was computed (no batch, no share)."""
    if not 0 <= real_tokens <= computed_tokens:
        raise ValueError(f"real_tokens must be in [0, computed_tokens={computed_tokens}], got {real_tokens}")
    return 1.0 - real_tokens / computed_tokens if computed_tokens else None


def padded_tokens(lengths: np.ndarray, batch_size: int, pad_to_multiple_of: int | None = None) -> int:
    """Tokens computed when consecutive batches of ``batch_size`` units of ``lengths`` (int ``[n]``)
    are each padded to their longest unit (rounded up to ``pad_to_multiple_of``); the last batch may
    be smaller."""
    n = lengths.size
    if n == 0:
        return 0
    starts = np.arange(0, n, batch_size)
    longest = np.maximum.reduceat(lengths, starts)
    if pad_to_multiple_of:
        longest = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    sizes = np.diff(np.append(starts, n))
    return int((longest * sizes).sum())


def placed_lengths(lengths: np.ndarray, max_length: int, overlong: str) -> np.ndarray:
    """int64 ``[m]``: the units one overlong policy leaves of ``lengths`` (int ``[n]``), in order.
    ``truncate``: ``min(length, max_length)``; ``split``: a sequence over the limit becomes pieces of
    ``max_length`` and its remainder, next to each other; ``drop``: the sequences over it are left out;
    ``error``: refuses any sequence over it. The tokens :func:`padless.planning.plan.plan_packs` places
    under the same policy are exactly these."""
    arr = np.asarray(lengths, dtype=np.int64)
    over = arr > max_length
    if not over.any():
        return arr
    if overlong == "truncate":
        return np.minimum(arr, max_length)
    if overlong == "drop":
        return arr[~over]
    if overlong == "split":
        pieces = -(-arr // max_length)  # 1 for a sequence within the limit
        out = np.full(int(pieces.sum()), max_length, dtype=np.int64)
        last = np.cumsum(pieces) - 1  # each sequence's last piece holds its remainder
        out[last] = arr - (pieces - 1) * max_length
        return out
    if overlong == "error":
        raise ValueError(f"{int(over.sum()):,} sequences are over max_length={max_length} and overlong is 'error'")
    raise ValueError(f"unknown overlong policy {overlong!r}; choose from error, truncate, split, drop")
