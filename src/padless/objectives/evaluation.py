"""Evaluation loss per example, computed from packed rows.

Evaluation needs no gradients, so packing it only saves time: the examples are packed into rows,
run once, and each example's loss is read back through the batch's placements
(:func:`padless.sequence_logprobs`). Each example's figure equals running it alone, and the total
equals the padded token-normalised loss (tests/objectives/test_evaluation.py holds both equal).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class EvalLoss:
    """Evaluation losses of a list of examples."""

    per_example: np.ndarray
    """``[N]`` float64: each example's mean cross-entropy over its trained tokens (NaN when it has none)."""
    tokens: np.ndarray
    """``[N]`` int64: each example's trained tokens."""
    total: float
    """The token-normalised loss over all examples: sum of every trained token's CE / their number."""


def packed_eval_loss(
    model: Any,
    features: Sequence[Mapping[str, Any]],
    *,
    max_length: int | None = None,
    batch_size: int = 64,
    pad_token_id: int = 0,
    trained_logits_only: bool = True,
) -> EvalLoss:
    """Per-example and total evaluation loss of ``features`` (dicts with ``input_ids`` and optional
    ``labels``, as the collators take), packed ``batch_size`` examples at a time into rows of
    ``max_length`` tokens (default: the longest example) on the model's attention backend
    (:meth:`padless.PackingCollator.for_model`). No example is cut: one longer than ``max_length``
    raises. Runs under ``torch.no_grad()``; the model's mode is left as it is (call ``model.eval()``).
    """
    from padless.batching.batch import batch_to
    from padless.batching.collate import PackingCollator
    from padless.objectives.logprobs import sequence_logprobs

    if len(features) == 0:
        raise ValueError("features is empty: nothing to evaluate")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    longest = max(len(f["input_ids"]) for f in features)
    if max_length is not None and max_length < longest:
        raise ValueError(
            f"max_length={max_length} is shorter than the longest example ({longest} tokens); "
            "evaluation never cuts an example"
        )
    collate = PackingCollator.for_model(model, max_length=max_length or longest, pad_token_id=pad_token_id)
    device = next(model.parameters()).device
    sums, counts = [], []
    with torch.no_grad():
        for i in range(0, len(features), batch_size):
            batch = batch_to(collate(features[i : i + batch_size]), device)
            total, tokens = sequence_logprobs(model, batch, per_token=True, trained_logits_only=trained_logits_only)
            sums.append(-total.double().cpu().numpy())
            counts.append(np.array([t.numel() for t in tokens], dtype=np.int64))
    nll, n = np.concatenate(sums), np.concatenate(counts)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_example = np.where(n > 0, nll / np.maximum(n, 1), np.nan)
    if n.sum() == 0:
        raise ValueError("no example has a trained token: the evaluation loss is undefined")
    return EvalLoss(per_example, n, float(nll[n > 0].sum() / n.sum()))
