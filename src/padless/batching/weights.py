"""Per-token loss weights from the data, carried by the collators as ``loss_weights``.

A feature may hold, under a key named by ``FeatureSpec(loss_weights=...)``, one non-negative
finite weight per token of ``input_ids``; the weight at position ``t`` weighs the loss of the target
at ``t`` (labels are unshifted, so it weighs how well position ``t - 1`` predicts ``labels[t]``). An
appended separator weighs as the token before it (the rule of :func:`padless.layout.append_separator`).

The batch carries them as ``loss_weights`` (float32, the shape of ``labels``, 0 on padding), a key
that :func:`padless.model_loss` reads and never passes to ``forward()`` (:data:`padless.batching.batch.NOT_FORWARD`);
transformers' models accept unknown keywords silently, so a plain ``model(**batch)`` must drop it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def feature_weights(feature: Mapping[str, Any], key: str, separator_id: int | None, where: str) -> np.ndarray:
    """The validated float32 weights of one feature, extended for an appended separator."""
    if key not in feature:
        raise ValueError(
            f"{where} has no {key!r}: FeatureSpec(loss_weights={key!r}) needs per-token weights in every feature"
        )
    raw = feature[key]
    w = np.asarray(raw.detach().cpu().numpy() if hasattr(raw, "detach") else raw, dtype=np.float64)
    ids = feature["input_ids"]
    n = len(ids)
    if w.shape != (n,):
        raise ValueError(f"{where}: {key!r} has shape {w.shape}, expected one weight per token ({n},)")
    if not np.all(np.isfinite(w)) or (w.size and w.min() < 0):
        raise ValueError(f"{where}: {key!r} must be finite and non-negative")
    if separator_id is not None and not (n and int(ids[-1]) == separator_id):  # as append_separator
        w = np.append(w, w[-1] if n else 0.0)
    return w.astype(np.float32)


def padded_weights(weights: Sequence[np.ndarray], width: int) -> np.ndarray:
    """``[B, width]`` weights of a padded batch (row ``b`` = feature ``b``), 0 on padding."""
    out = np.zeros((len(weights), width), dtype=np.float32)
    for b, w in enumerate(weights):
        out[b, : w.size] = w
    return out


def placed_weights(weights: Sequence[np.ndarray], placements: Any, shape: tuple[int, int]) -> np.ndarray:
    """``[R, L]`` weights of a packed batch, each piece's slice where :class:`Placements` put it."""
    out = np.zeros(shape, dtype=np.float32)
    for i, s, r, o, n in zip(
        placements.feature, placements.start, placements.row, placements.offset, placements.length
    ):
        piece = weights[i][s : s + n]
        if piece.size != n:
            raise ValueError(f"feature {i}: {weights[i].size} loss weights, too few for its tokens [{s}, {s + n})")
        out[r, o : o + n] = piece
    return out
