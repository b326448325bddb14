"""Block-causal attention masks for packed rows: a dense boolean reference and the 4D additive mask.

For documents of lengths ``[3, 2]`` in a row of 6 (one token of padding, its own document), the
block-causal mask (``1`` = may attend, query rows, key columns) is::

        k: 0 1 2 3 4 5
    q 0    1 . . . . .
    q 1    1 1 . . . .
    q 2    1 1 1 . . .
    q 3    . . . 1 . .
    q 4    . . . 1 1 .
    q 5    . . . . . 1     padding sees only itself: never a fully masked row (no NaN in softmax)

With a sliding window of ``w`` tokens (Mistral, Gemma's local layers), a query also sees only the
``w`` most recent keys of its document, itself included (transformers' convention); ``w = 2``::

        k: 0 1 2 3 4 5
    q 0    1 . . . . .
    q 1    1 1 . . . .
    q 2    . 1 1 . . .     token 0 left the window
    q 3    . . . 1 . .
    q 4    . . . 1 1 .
    q 5    . . . . . 1

The boolean mask is the slow, obviously-correct reference; the additive float mask (0 where allowed,
the dtype's most negative value elsewhere) is what SDPA and eager attention in transformers honour
exactly (a 4D *bool* mask is silently ignored by eager attention, ../shared/ENVIRONMENT.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from padless.layout import document_ids_from_lengths


def block_causal_mask(lengths: Sequence[int] | np.ndarray, window: int | None = None) -> np.ndarray:
    """Dense boolean ``[T, T]`` mask, ``T = sum(lengths)``: token i may attend to token j iff both are
    in the same document and ``j <= i`` (and ``i - j < window`` when a window is given). The
    reference every fast path is tested against."""
    doc = document_ids_from_lengths(lengths)
    same_doc = doc[:, None] == doc[None, :]
    causal = np.tril(np.ones((doc.size, doc.size), dtype=bool))
    if window is not None:
        causal &= ~np.tril(causal, -window)  # drop keys window or more tokens back
    return same_doc & causal


def _check_window(window: int | None) -> None:
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive int or None, got {window!r}")


def additive_block_causal_mask(
    row_lengths: Sequence[Sequence[int]],
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    window: int | None = None,
    blocks: np.ndarray | None = None,
) -> torch.Tensor:
    """``[B, 1, L, L]`` float mask for a batch of rows; row ``b`` holds documents ``row_lengths[b]``
    and every row sums to the same ``L``. 0 where attention is allowed, ``finfo(dtype).min`` elsewhere
    (the dtype must match the model's, since SDPA adds it to the scores). ``window``: the model's
    sliding window, kept inside each document (see the diagram above). ``blocks``: ``[B, L]`` ids of
    bidirectional blocks (-1: none; :func:`padless.batching.vision.block_ids`): tokens of one block
    also see the later tokens of that block (Gemma 3's images), as transformers composes it: within the
    document, (causal or the same block) and inside the window."""
    _check_window(window)
    dtype = dtype or torch.float32
    if not row_lengths:
        raise ValueError("additive_block_causal_mask needs at least one row")
    totals = {int(np.sum(r)) for r in row_lengths}
    if len(totals) != 1:
        raise ValueError(f"every row must hold the same number of tokens, got totals {sorted(totals)}")
    (length,) = totals
    doc = torch.stack([torch.from_numpy(document_ids_from_lengths(r)) for r in row_lengths]).to(device)
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    recent = ~causal.tril(-window) if window is not None else None  # keys less than window tokens back
    if recent is not None:
        causal &= recent
    allowed = (doc[:, :, None] == doc[:, None, :]) & causal  # [B, L, L]
    if blocks is not None:
        block = torch.as_tensor(np.asarray(blocks), dtype=torch.long, device=device)
        same = (block[:, :, None] == block[:, None, :]) & (block[:, :, None] >= 0)
        if recent is not None:
            same &= recent  # k > q - window: every later key of the block, and earlier ones in the window
        allowed |= same & (doc[:, :, None] == doc[:, None, :])
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]  # [B, 1, L, L]: broadcast over heads
