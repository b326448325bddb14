"""Token-normalised causal-LM loss across micro-batches and ranks.

Packing must change how fast a model trains, not what it learns. A padded batch and a packed batch of
the same sequences hold the same trained tokens, so the loss of an optimiser step is defined per token:

    loss_step = sum over every trained token of the step (all micro-batches, all ranks) of CE
                / number of those tokens

Averaging per micro-batch (or per row) instead would weight a token by how many others share its
micro-batch, which packing changes. Each micro-batch therefore contributes ``sum_ce / N_step`` where
``N_step`` is counted before the step's forwards; under DDP (which averages gradients over ranks) the
contribution is multiplied by the world size so the averaged gradient is exactly the per-token one.

``weighting`` makes the weight of a token an explicit choice (:data:`LossWeighting`); every mode is a
weighted sum over the step's trained tokens divided by the step's total weight, reduced across
micro-batches and ranks exactly like the token count:

- ``token``: every trained token weighs 1 (the default; the normaliser is the token count);
- ``sequence``: a token weighs ``1 / (trained tokens of its document)``, so each document counts as
  its own mean and the step is the mean over its documents (the normaliser is the document count).
  A document is what the model sees as one: a row of a padded batch, a piece of a packed one (a
  feature split by ``overlong="split"`` is several documents, as it is trained);
- ``weights``: per-token weights from the data (``FeatureSpec(loss_weights=KEY)``), carried in the
  batch as ``loss_weights``; the normaliser is their sum over the step's trained tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F

from padless.batching.batch import forward_inputs
from padless.layout import IGNORE_INDEX

if TYPE_CHECKING:
    import numpy as np

LossWeighting = Literal["token", "sequence", "weights"]
"""How the tokens of a step are weighed against each other (see the module docstring)."""
LOSS_WEIGHTINGS: tuple[str, ...] = ("token", "sequence", "weights")


def trained_tokens(labels: torch.Tensor) -> torch.Tensor:
    """Number of target tokens in unshifted ``labels [B, T]``: position ``t`` is trained to predict
    ``labels[t + 1]``, so the first column is never a target."""
    return (labels[..., 1:] != IGNORE_INDEX).sum()


def step_num_items(
    micro_batches: Iterable[Mapping[str, Any]], *, all_ranks: bool = True, weighting: LossWeighting = "token"
) -> torch.Tensor:
    """Trained tokens of a whole optimiser step: summed over its micro-batches and, when
    ``torch.distributed`` is initialised and ``all_ranks``, all-reduced over every rank. With
    ``weighting="sequence"`` the step's documents with a trained token; with ``"weights"`` the sum of
    the trained tokens' weights (float64)."""
    total = torch.zeros((), dtype=torch.float64 if weighting == "weights" else torch.long)
    labels_device = None
    for batch in micro_batches:
        total += _items(batch, weighting)
        if labels_device is None:
            labels_device = batch["labels"].device
    if all_ranks and dist.is_available() and dist.is_initialized():
        total = total.to(reduce_device(labels_device, dist.get_backend()))
        dist.all_reduce(total)
    return total.cpu()


def reduce_device(labels_device: torch.device | None, backend: str) -> torch.device:
    """Where to all-reduce the token count: on the labels' own device (each rank's GPU under torchrun)
    for backends that reduce device tensors, on the CPU for gloo. NCCL needs a CUDA tensor: labels
    still on the CPU fall back to the current CUDA device, which is the rank's own only if the
    process called ``torch.cuda.set_device(local_rank)`` (the bench does: ``padless.bench.parallel.init_distributed``)."""
    if backend == "gloo":
        return torch.device("cpu")
    if labels_device is not None and labels_device.type != "cpu":
        return labels_device
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def causal_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_items: int | torch.Tensor,
    *,
    world_size: int = 1,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """``sum(CE over trained tokens of this micro-batch) / num_items * world_size``.

    logits: ``[B, T, V]``; labels: ``[B, T]`` unshifted. ``num_items`` is the step's trained-token
    count (:func:`step_num_items`); ``world_size`` undoes DDP's gradient averaging. Cross-entropy is
    computed in float32 whatever the logits' dtype (float64 logits stay float64). The labels are shifted, not the logits: slicing
    ``[B, T, V]`` logits would copy the largest tensor of the step. ``weights`` (``[B, T]``, aligned
    with ``labels``: the weight of the target at each position, :func:`target_weights`) weigh each
    token's CE.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} do not match")
    if float(num_items) <= 0:
        raise ValueError("num_items must be positive: the step has no trained token")
    targets = F.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX).to(logits.device)  # [B, T]
    return _ce_sum(logits, targets, _shift(weights)) * world_size / _on(num_items, logits.device)


def _ce_sum(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    flat = logits.reshape(-1, logits.shape[-1])
    flat = flat.to(torch.promote_types(flat.dtype, torch.float32))  # half -> float32; a float64 oracle keeps float64
    if weights is None:
        return F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")
    ce = F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none")
    return (ce * weights.reshape(-1).to(ce.device, ce.dtype)).sum()


def _shift(weights: torch.Tensor | None) -> torch.Tensor | None:
    """Weights aligned with labels -> aligned with the logits that predict them (as the targets)."""
    return None if weights is None else F.pad(weights[..., 1:], (0, 1), value=0.0)


def document_ids(batch: Mapping[str, Any]) -> np.ndarray:
    """``[B, T]`` int64: which document each position belongs to, unique over the batch. A packed
    batch's pieces (its placements, or where ``position_ids`` restart at 0 when the placements were
    lost), else a padded batch's rows."""
    import numpy as np

    shape = tuple(batch["labels"].shape)
    placements = getattr(batch, "placements", None)
    if placements is not None:
        ids = np.full(shape, -1, dtype=np.int64)
        for j, (r, o, n) in enumerate(zip(placements.row, placements.offset, placements.length)):
            ids[r, o : o + n] = j
        return ids
    if "position_ids" in batch:
        positions = batch["position_ids"]
        positions = positions[0] if positions.dim() == 3 else positions  # multimodal: the text positions first
        starts = positions.detach().cpu().numpy().reshape(shape) == 0
        starts[:, 0] = True
        return np.cumsum(starts.reshape(-1)).reshape(shape) - 1
    return np.repeat(np.arange(shape[0], dtype=np.int64)[:, None], shape[1], axis=1)


def _trained_targets(labels: torch.Tensor) -> np.ndarray:
    """``[B, T]`` bool: positions whose label is a target (column 0 never is, see :func:`trained_tokens`)."""
    trained = (labels != IGNORE_INDEX).detach().cpu().numpy()
    trained[:, 0] = False
    return trained


def target_weights(batch: Mapping[str, Any], weighting: LossWeighting) -> torch.Tensor | None:
    """``[B, T]`` float32 weight of the target at each position (aligned with ``labels``), or
    ``None`` for ``token``. Refuses a batch whose weights do not fit the choice."""
    import numpy as np

    if weighting not in LOSS_WEIGHTINGS:
        raise ValueError(f"unknown weighting {weighting!r}; choose one of {', '.join(LOSS_WEIGHTINGS)}")
    _refuse_shared_prompt(batch)
    carried = "loss_weights" in batch
    if weighting == "weights":
        if not carried:
            raise ValueError(
                "weighting='weights' needs 'loss_weights' in the batch: build the collator with "
                "FeatureSpec(loss_weights=KEY)"
            )
        return batch["loss_weights"]
    if carried:
        raise ValueError(f"the batch carries 'loss_weights' but weighting={weighting!r}; pass weighting='weights'")
    if weighting == "token":
        return None
    trained = _trained_targets(batch["labels"])
    docs = document_ids(batch)
    counts = np.bincount(docs[trained], minlength=int(docs.max()) + 1)
    w = np.where(trained, 1.0 / np.maximum(counts[docs], 1), 0.0).astype(np.float32)
    return torch.from_numpy(w).to(batch["labels"].device)


def _refuse_shared_prompt(batch: Mapping[str, Any]) -> None:
    """The causal-LM loss predicts each token from the position before it; a piece whose first token
    is predicted from elsewhere (a shared-prompt completion, ``Placements.prev_offset``) needs
    :func:`padless.sequence_logprobs` instead."""
    placements = getattr(batch, "placements", None)
    if placements is None or placements.prev_offset is None:
        return
    prev = placements.prev_offset
    if ((prev >= 0) & (prev != placements.offset - 1)).any():
        raise ValueError(
            "the batch shares prompts (a completion's first token is predicted from its prompt's last "
            "token, not the position before it); the causal-LM loss cannot read it: use "
            "padless.sequence_logprobs"
        )


def _items(batch: Mapping[str, Any], weighting: LossWeighting) -> torch.Tensor:
    """One micro-batch's share of the step's normaliser (see :func:`step_num_items`)."""
    import numpy as np

    weights = target_weights(batch, weighting)
    if weighting == "token":
        return trained_tokens(batch["labels"]).cpu()
    trained = _trained_targets(batch["labels"])
    if weighting == "sequence":
        return torch.tensor(np.unique(document_ids(batch)[trained]).size, dtype=torch.long)
    return torch.tensor(float(weights.detach().cpu().double().numpy()[trained].sum()), dtype=torch.float64)


def _on(num_items: int | torch.Tensor, device: torch.device) -> int | torch.Tensor:
    return num_items.to(device) if hasattr(num_items, "to") else num_items


def trained_logits(model: Any, inputs: Mapping[str, Any], trained: torch.Tensor) -> torch.Tensor:
    """The forward's logits: ``[K, V]`` for the ``K`` trained positions only (``trained [B, T]``
    bool), or every logit ``[B, T, V]`` when the model does not fit the pattern (no output-embedding
    module, or a forward that does not pass the full hidden states through it).

    A pre-hook on the LM head (``get_output_embeddings()``) hands it the hidden states of the trained
    positions, gathered, instead of ``[B, T, d]``; the model's own forward does the rest (its final
    norm before the head, any logit scaling or soft-capping after it), and a wrapper such as
    DistributedDataParallel still sees its forward called.
    """
    inner = getattr(model, "module", model)  # DistributedDataParallel wraps the model
    get_head = getattr(inner, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    if head is None:
        return model(**inputs).logits
    picked = trained.to(next(inner.parameters()).device)
    seen: list[tuple[int, ...]] = []

    def gather(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        hidden = args[0]
        if tuple(hidden.shape[:-1]) != tuple(picked.shape):  # not the full hidden states: leave it alone
            return None
        seen.append(tuple(hidden.shape))
        return (hidden[picked], *args[1:])  # [K, d]

    handle = head.register_forward_pre_hook(gather)
    try:
        logits = model(**inputs).logits
    finally:
        handle.remove()
    if seen and (len(seen) != 1 or logits.dim() != 2 or logits.shape[0] != int(picked.sum())):
        raise RuntimeError(
            f"the LM head of {type(inner).__name__} ran {len(seen)} times on gathered hidden states "
            f"and returned logits {tuple(logits.shape)}; compute the loss with trained_logits_only=False"
        )
    return logits


def model_loss(
    model: Any,
    batch: Mapping[str, Any],
    num_items: int | torch.Tensor,
    *,
    world_size: int = 1,
    trained_logits_only: bool = False,
    weighting: LossWeighting = "token",
) -> torch.Tensor:
    """Forward ``batch`` through a causal LM (labels withheld from the model) and return its
    token-normalised loss contribution. Works for any batch our collators (or transformers') emit.

    ``trained_logits_only``: the LM head runs only on the hidden states of tokens whose next token is
    a target, gathered across rows (:func:`trained_logits`), so a padded batch, a bucketed one, a
    packed row and a flattened row do the same head work; the loss is unchanged. The head over a
    50k vocabulary dominates small models, so skipping untrained positions (prompts, tool results,
    padding) saves real work. A model that does not fit the pattern computes every logit.

    ``weighting``: how tokens are weighed (:data:`LossWeighting`); ``num_items`` must come from
    :func:`step_num_items` with the same ``weighting``.

    A packed batch whose ``attention_mask`` cannot keep its documents apart (a 2D mask on packed rows,
    a 4D one that is not block-causal, a mask of the wrong shape) is refused
    (:func:`padless.attention.accept.check_attention_mask`, model-free and cheap); whether the batch's
    form fits this model's backend is :func:`padless.check_batch`'s question.
    """
    from padless.attention.accept import check_attention_mask

    check_attention_mask(batch)
    inputs = forward_inputs(batch)  # without labels and loss_weights
    labels = batch["labels"]
    weights = target_weights(batch, weighting)
    if float(num_items) <= 0:
        raise ValueError("num_items must be positive: the step has no trained token")
    if trained_logits_only:
        targets = torch.nn.functional.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX)  # [B, T]
        trained = targets != IGNORE_INDEX
        logits = trained_logits(model, inputs, trained)
        if logits.dim() == 2:  # [K, V], the trained positions
            kept = targets[trained].to(logits.device)  # [K]
            kept_weights = None if weights is None else _shift(weights)[trained.to(weights.device)]
            return _ce_sum(logits, kept, kept_weights) * world_size / _on(num_items, logits.device)
        return causal_lm_loss(logits, labels, num_items, world_size=world_size, weights=weights)
    return causal_lm_loss(model(**inputs).logits, labels, num_items, world_size=world_size, weights=weights)
