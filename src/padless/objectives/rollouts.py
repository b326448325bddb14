"""Per-token log-probs of rollout completions read back from packed rows, in TRL's ``(B, T)`` layout.

TRL's GRPO computes every log-prob pass (policy, old policy, reference) on padded rows
``[left-padded prompt | right-padded completion]`` and keeps the last ``T`` positions: row ``b`` is
completion ``b``, column ``t`` its ``t``-th token, zero where the completion mask is 0. Here the same
``(B, T)`` tensors come from a :class:`padless.RolloutCollator` (or :class:`padless.PreferenceCollator`)
batch, whose features are the completions in order::

    packed row    p0 p1 p2 a0 a1 b0 b1 b2     one group: prompt p, completions a and b (shared prompt)
    (B, T) out    row 0: lp(a0) lp(a1) 0      lp(a0) and lp(b0) both read the logits at p2
                  row 1: lp(b0) lp(b1) lp(b2)

The positions that predict each trained token come from :mod:`padless.objectives.logprobs` (the read-back
``sequence_logprobs`` uses, through the batch's placements); the batch passes the same check first
(exact on this model's attention backend, or refused). Only those positions go through the LM head
(:func:`padless.objectives.loss.trained_logits`). As TRL's fused LM head does, the model's logits (after
its own scaling and soft-capping) are divided by ``temperature`` before the log-softmax, in float32 at
least.

:data:`TOKEN_STATS` are the per-token fields of TRL's fused LM head output (``FusedCausalLMOutput``),
so a TRL loss that reads any of them can run on packed rows: :func:`completion_token_stats` gives each,
:func:`rollout_token_logprobs` the log-probs (and entropies) GRPO reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from padless.attention.adapters import without_ddp

TOKEN_STATS: tuple[str, ...] = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
"""Per-token fields, named as TRL 1.16's ``FusedCausalLMOutput`` names them: the label's log-prob, the
entropy of the next-token distribution, ``log(sum_v p_v^2)``, the mean temperature-scaled logit and
whether the label is the first arg-max. Only ``log_probs`` and ``entropy`` carry gradients."""


def completion_token_stats(
    model: Any,
    batch: Mapping[str, Any],
    *,
    width: int | None = None,
    temperature: float = 1.0,
    outputs: Sequence[str] = ("log_probs",),
) -> dict[str, torch.Tensor]:
    """``(B, T)`` per-token ``outputs`` (:data:`TOKEN_STATS`) of every completion of a packed ``batch``
    (a :class:`padless.batching.preference.GroupBatch` or ``PairedBatch``), plus ``"mask"`` (bool, the
    trained tokens). ``B`` is the batch's features in order (``placements.num_features``; a preference
    pair ``i`` is features ``2i``, ``2i + 1``), ``T`` is ``width`` or the longest completion, column ``t``
    a completion's ``t``-th trained token; every field is 0 (False) where the mask is False, a feature
    the collator dropped included.

    ``model(**batch)`` runs with gradients (wrap in ``torch.no_grad()`` for a reference pass). The batch
    must be exact on ``model``'s attention backend (:func:`padless.batching.preference.check_batch_for_model`,
    the check ``sequence_logprobs`` runs) and its ``attention_mask`` must keep documents apart, else
    ``ValueError``. ``temperature``: the logits are divided by it before the log-softmax."""
    from padless.attention.accept import check_attention_mask
    from padless.batching.batch import forward_inputs
    from padless.batching.preference import check_batch_for_model
    from padless.objectives.logprobs import _packed_positions
    from padless.objectives.loss import trained_logits

    unknown = [o for o in outputs if o not in TOKEN_STATS]
    if unknown:
        raise ValueError(f"unknown outputs {unknown}; choose among {', '.join(TOKEN_STATS)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    placements = getattr(batch, "placements", None)
    if placements is None:
        raise ValueError(
            "batch has no placements; pass the batch RolloutCollator or PreferenceCollator returned "
            "(padless.batching.collate.batch_to keeps them when moving it to a device)"
        )
    check_attention_mask(batch)  # a documents mask keeps them apart; a shared prompt's tree is check_batch's
    check_batch_for_model(without_ddp(model), batch)  # exact on this backend (the tree's form included), or refused
    labels_t = batch["labels"]
    labels = labels_t.detach().cpu().numpy()
    rows, targets, preds, feats = _packed_positions(labels, placements)  # [K] each, by feature, in token order
    num_features, length = placements.num_features, labels.shape[1]
    counts = np.bincount(feats, minlength=num_features)
    longest = int(counts.max()) if counts.size else 0
    if width is None:
        width = longest
    elif width < longest:
        raise ValueError(f"width={width} is shorter than the longest completion of the batch ({longest} tokens)")
    # The column of each trained token: its rank inside its feature (feats is grouped by feature).
    cols = np.arange(feats.size) - np.concatenate([[0], np.cumsum(counts)[:-1]])[feats]

    predicting = torch.zeros(labels.shape, dtype=torch.bool)  # [R, L]: positions that predict a trained token
    predicting[torch.from_numpy(rows), torch.from_numpy(preds)] = True
    logits = trained_logits(model, forward_inputs(batch), predicting)
    device = logits.device
    if logits.dim() == 2:  # [P, V]: the predicting positions in row-major order; a shared prompt's last
        # position predicts the first token of every completion of its group, so P <= K
        flat = np.cumsum(predicting.numpy().ravel()) - 1
        picked = logits[torch.from_numpy(flat[rows * length + preds]).to(device)]
    else:  # [R, L, V]: a model whose LM head did not take the gathered hidden states
        picked = logits[torch.from_numpy(rows).to(device), torch.from_numpy(preds).to(device)]
    wide = torch.promote_types(logits.dtype, torch.float32)  # float32 at least; a float64 oracle keeps float64
    scaled = picked.to(wide) / temperature  # [K, V]
    logp = scaled.log_softmax(-1)
    target = labels_t.to(device)[torch.from_numpy(rows).to(device), torch.from_numpy(targets).to(device)]
    per_token: dict[str, torch.Tensor] = {}
    for name in outputs:
        if name == "log_probs":
            per_token[name] = logp.gather(1, target.unsqueeze(1)).squeeze(1)
        elif name == "entropy":
            per_token[name] = -(logp.exp() * logp).sum(-1)
        elif name == "log_sum_sq_probs":
            per_token[name] = torch.logsumexp(2 * logp.detach(), -1)
        elif name == "mean_logits":
            per_token[name] = scaled.detach().mean(-1)
        else:  # is_top1: argmax returns the first maximum, as TRL's kernel counts a tie with an earlier token
            per_token[name] = scaled.detach().argmax(-1) == target
    f, c = torch.from_numpy(feats).to(device), torch.from_numpy(cols).to(device)
    out = {name: v.new_zeros(num_features, width).index_put((f, c), v) for name, v in per_token.items()}
    out["mask"] = torch.zeros(num_features, width, dtype=torch.bool, device=device).index_put(
        (f, c), torch.ones_like(f, dtype=torch.bool)
    )
    return out


def rollout_token_logprobs(
    model: Any,
    batch: Mapping[str, Any],
    *,
    width: int | None = None,
    temperature: float = 1.0,
    entropies: bool = False,
) -> tuple[torch.Tensor, ...]:
    """``(logps, mask)``, or ``(logps, mask, entropies)`` with ``entropies=True``: the per-token log-probs
    of every completion of a :class:`padless.RolloutCollator` batch in TRL's ``(B, T)`` completion layout
    (``B`` completions in feature order, ``T`` = ``width`` or the longest completion; 0 where masked),
    the bool ``(B, T)`` mask of trained tokens and the per-token entropies of the next-token
    distribution. The logits are divided by ``temperature`` before the log-softmax, as TRL's GRPO does.
    The batch is checked against ``model`` first (exact or refused): :func:`completion_token_stats`."""
    stats = completion_token_stats(
        model,
        batch,
        width=width,
        temperature=temperature,
        outputs=("log_probs", "entropy") if entropies else ("log_probs",),
    )
    return (stats["log_probs"], stats["mask"], stats["entropy"]) if entropies else (stats["log_probs"], stats["mask"])
