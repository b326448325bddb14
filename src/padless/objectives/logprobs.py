"""Per-sequence log-probabilities read back from packed rows (DPO, GRPO, reward scoring).

For every feature given to the collator, in the order given, :func:`sequence_logprobs` sums the
log-probability the model assigns to each of its *trained* tokens (label != ``IGNORE_INDEX``). A
token's label is its own id (labels are unshifted); it is predicted by the logits one position
earlier in the same row, except a piece's first token, predicted by the logits at the piece's
``prev_offset`` (:class:`padless.batching.batch.Placements`), or by nothing for a document start::

    row            p1 p2 c1 c2 | r1 r2          shared prompt p, completions c and r
    prev_offset          -1 .. c: p2  r: p2     c1 and r1 are both predicted from p2
    predicted by      -  p1 p2 c1    p2 r1

Only the rows of positions that predict a trained token go through the log-softmax, so the
``[K, V]`` float32 work follows the trained tokens, not the batch.

A feature split by ``overlong="split"`` (or a pre-packed row of several documents) is refused: its
later pieces start documents of their own, so their tokens do not see the tokens before them and
their log-probs are not those of the sequence. A piece that starts inside its feature (``start > 0``)
must say which position predicts its first token (``prev_offset``), as a shared-prompt completion does.
A feature cut by ``overlong="truncate"`` counts the tokens that were kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from padless.batching.batch import forward_inputs
from padless.layout import IGNORE_INDEX


def _packed_positions(labels: np.ndarray, placements: Any) -> tuple[np.ndarray, ...]:
    """``(row, target position, predicting position, feature)`` of every trained token, grouped by
    feature (in feature order) and, inside a feature, in token order."""
    prev = placements.prev_offsets()
    order = np.lexsort((placements.start, placements.feature))  # by feature, then by start in it
    rows, targets, preds, feats = [], [], [], []
    for j in order:
        r, o, n, p = (int(placements.row[j]), int(placements.offset[j]), int(placements.length[j]), int(prev[j]))
        t = np.arange(o, o + n)
        before = t - 1
        if p >= 0:
            if not 0 <= p < labels.shape[1]:
                raise ValueError(f"placements: piece {j} has prev_offset {p}, outside its row of {labels.shape[1]}")
            before[0] = p
        elif int(placements.start[j]) > 0:
            raise ValueError(
                f"feature {int(placements.feature[j])} was split into pieces (overlong='split', or a pre-packed "
                f"row of several documents): its piece at row {r}, offset {o} does not see the tokens before it, so "
                "its log-probs are not the sequence's; use overlong='truncate' or 'error' or a longer max_length"
            )
        elif labels[r, o] != IGNORE_INDEX:
            raise ValueError(
                f"feature {int(placements.feature[j])}: the first token of its piece at row {r}, offset {o} is "
                "trained (label != -100) but nothing predicts it (prev_offset -1); the batch was not built by a "
                "padless collator"
            )
        keep = labels[r, t] != IGNORE_INDEX
        rows.append(np.full(int(keep.sum()), r))
        targets.append(t[keep])
        preds.append(before[keep])
        feats.append(np.full(int(keep.sum()), int(placements.feature[j])))
    return tuple(
        np.concatenate(a).astype(np.int64) if a else np.zeros(0, np.int64) for a in (rows, targets, preds, feats)
    )


def _padded_positions(labels: np.ndarray) -> tuple[np.ndarray, ...]:
    """The same for a padded batch (row ``b`` is feature ``b``; the causal shift, column 0 untrained)."""
    r, t = np.nonzero(labels[:, 1:] != IGNORE_INDEX)
    return r, t + 1, t, r


def _check_unpacked(batch: Mapping[str, Any]) -> None:
    mask = batch.get("attention_mask")
    if "position_ids" in batch or "cu_seq_lens_q" in batch or (mask is not None and mask.dim() != 2):
        raise ValueError(
            "batch looks packed (position_ids, cu_seq_lens_q or a 4D attention_mask) but has no placements; "
            "pass the PackedBatch the collator returned (padless.batching.collate.batch_to keeps them when "
            "moving it to a device)"
        )


def sequence_logprobs(
    model: Any,
    batch: Mapping[str, Any],
    *,
    per_token: bool = False,
    logits: torch.Tensor | None = None,
    trained_logits_only: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, list[Any]]:
    """Sum of the log-probs of each feature's trained tokens, ``[num_features]`` float32 (float64 for
    float64 logits).

    ``batch``: a :class:`padless.batching.batch.PackedBatch` (features read back through its
    placements) or a padded batch (:class:`padless.PaddingCollator`, row ``b`` = feature ``b``).
    ``model(**batch)`` is run without labels unless ``logits`` (``[R, L, V]``) are given; gradients
    flow (wrap in ``torch.no_grad()`` for a reference model). A feature the planner dropped gets
    NaN. ``per_token=True`` also returns, per feature, the 1-D tensor of its tokens' log-probs, in
    order. A batch whose ``pairs`` attribute is True (preference pairs: feature ``2k`` chosen,
    ``2k + 1`` rejected) gives ``[num_pairs, 2]`` and per-token lists nested as ``[[chosen, rejected], ...]``.
    ``trained_logits_only``: run the LM head only on the hidden states of the positions that predict a
    trained token (as :func:`padless.model_loss` does); it then skips prompts and padding.
    """
    from padless.attention.accept import check_attention_mask

    check_attention_mask(batch)  # a 2D mask on packed rows: refused whoever ran the forward
    labels_t = batch["labels"]
    labels = labels_t.detach().cpu().numpy()
    placements = getattr(batch, "placements", None)
    if placements is None:
        _check_unpacked(batch)
        rows, targets, preds, feats = _padded_positions(labels)
        num_features = labels.shape[0]
    else:
        if logits is None:  # a batch built for another backend or without the model: refused, never wrong
            from padless.batching.preference import check_batch_for_model

            check_batch_for_model(model, batch)
        rows, targets, preds, feats = _packed_positions(labels, placements)
        num_features = placements.num_features
    logit_rows, gathered = rows, False  # where each trained token's predicting logits are
    if logits is None and trained_logits_only:
        from padless.objectives.loss import trained_logits

        predicting = torch.zeros(labels_t.shape, dtype=torch.bool)  # [R, L]: positions that predict a target
        predicting[torch.from_numpy(rows), torch.from_numpy(preds)] = True
        logits = trained_logits(model, forward_inputs(batch), predicting)
        if logits.dim() == 2:  # [K, V] in row-major order of the predicting positions
            flat = np.cumsum(predicting.numpy().ravel()) - 1
            logit_rows, preds = np.zeros_like(rows), flat[rows * labels.shape[1] + preds]
            logits, gathered = logits.unsqueeze(0), True  # [1, K, V]: read as row 0
    elif logits is None:
        logits = model(**forward_inputs(batch)).logits
    if not gathered and (logits.shape[0] != labels_t.shape[0] or logits.shape[1] != labels_t.shape[1]):
        raise ValueError(f"logits {tuple(logits.shape)} do not match labels {tuple(labels_t.shape)}")
    device = logits.device
    r, t, p, f, lr = (torch.from_numpy(a).to(device) for a in (rows, targets, preds, feats, logit_rows))
    wide = torch.promote_types(logits.dtype, torch.float32)  # float32 at least; a float64 oracle keeps float64
    chosen = logits[lr, p].to(wide)  # [K, V]: only the positions that predict a trained token
    token_lp = chosen.log_softmax(-1).gather(1, labels_t.to(device)[r, t].unsqueeze(1)).squeeze(1)  # [K]
    sums = torch.zeros(num_features, dtype=wide, device=device).index_add(0, f, token_lp)
    if placements is not None:
        placed = torch.zeros(num_features, dtype=torch.bool, device=device)
        placed[torch.from_numpy(np.unique(placements.feature)).to(device)] = True
        sums = torch.where(placed, sums, torch.full_like(sums, float("nan")))
    pairs = getattr(batch, "pairs", False) is True
    if pairs and num_features % 2:
        raise ValueError(f"a batch of pairs needs an even number of features, got {num_features}")
    out = sums.view(-1, 2) if pairs else sums
    if not per_token:
        return out
    counts = np.bincount(feats, minlength=num_features).tolist()
    tokens = list(torch.split(token_lp, counts))  # feats is grouped by feature, in order
    return out, ([tokens[i : i + 2] for i in range(0, num_features, 2)] if pairs else tokens)
