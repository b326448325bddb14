"""Token-normalised causal-LM loss across micro-batches and ranks.

Packing must change how fast a model trains, not what it learns. A padded batch and a packed batch of
the same sequences hold the same trained tokens, so the loss of an optimiser step is defined per token:

    loss_step = sum over every trained token of the step (all micro-batches, all ranks) of CE
                / number of those tokens

Averaging per micro-batch (or per row) instead would weight a token by how many others share its
micro-batch, which packing changes. Each micro-batch therefore contributes ``sum_ce / N_step`` where
``N_step`` is counted before the step's forwards; under DDP (which averages gradients over ranks) the
contribution is multiplied by the world size so the averaged gradient is exactly the per-token one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from padless.layout import IGNORE_INDEX

if TYPE_CHECKING:
    import torch


def trained_tokens(labels: torch.Tensor) -> torch.Tensor:
    """Number of target tokens in unshifted ``labels [B, T]``: position ``t`` is trained to predict
    ``labels[t + 1]``, so the first column is never a target."""
    return (labels[..., 1:] != IGNORE_INDEX).sum()


def step_num_items(micro_batches: Iterable[Mapping[str, Any]], *, all_ranks: bool = True) -> torch.Tensor:
    """Trained tokens of a whole optimiser step: summed over its micro-batches and, when
    ``torch.distributed`` is initialised and ``all_ranks``, all-reduced over every rank."""
    import torch
    import torch.distributed as dist

    total = torch.zeros((), dtype=torch.long)
    for batch in micro_batches:
        total += trained_tokens(batch["labels"]).cpu()
    if all_ranks and dist.is_available() and dist.is_initialized():
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        total = total.to(device)
        dist.all_reduce(total)
    return total.cpu()


def causal_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_items: int | torch.Tensor,
    *,
    world_size: int = 1,
) -> torch.Tensor:
    """``sum(CE over trained tokens of this micro-batch) / num_items * world_size``.

    logits: ``[B, T, V]``; labels: ``[B, T]`` unshifted. ``num_items`` is the step's trained-token
    count (:func:`step_num_items`); ``world_size`` undoes DDP's gradient averaging. Cross-entropy is
    computed in float32 whatever the logits' dtype. The labels are shifted, not the logits: slicing
    ``[B, T, V]`` logits would copy the largest tensor of the step.
    """
    import torch.nn.functional as F

    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} do not match")
    if int(num_items) <= 0:
        raise ValueError("num_items must be positive: the step has no trained token")
    targets = F.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX).to(logits.device)  # [B, T]
    return _ce_sum(logits, targets) * world_size / _on(num_items, logits.device)


def _ce_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    flat = logits.reshape(-1, logits.shape[-1]).float()
    return F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")


def _on(num_items: int | torch.Tensor, device: torch.device) -> int | torch.Tensor:
    return num_items.to(device) if hasattr(num_items, "to") else num_items


def _trained_logits(model: Any, inputs: Mapping[str, Any], trained: torch.Tensor) -> torch.Tensor:
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
        raise RuntimeError(f"the LM head of {type(inner).__name__} ran {len(seen)} times on gathered hidden states "
                           f"and returned logits {tuple(logits.shape)}; compute the loss with trained_logits_only=False")
    return logits


def model_loss(
    model: Any,
    batch: Mapping[str, Any],
    num_items: int | torch.Tensor,
    *,
    world_size: int = 1,
    trained_logits_only: bool = False,
) -> torch.Tensor:
    """Forward ``batch`` through a causal LM (labels withheld from the model) and return its
    token-normalised loss contribution. Works for any batch our collators (or transformers') emit.

    ``trained_logits_only``: the LM head runs only on the hidden states of tokens whose next token is
    a target, gathered across rows (:func:`_trained_logits`), so a padded batch, a bucketed one, a
    packed row and a flattened row do the same head work; the loss is unchanged. The head over a
    50k vocabulary dominates small models, so skipping untrained positions (prompts, tool results,
    padding) saves real work. A model that does not fit the pattern computes every logit.
    """
    import torch

    inputs = {k: v for k, v in batch.items() if k != "labels"}
    labels = batch["labels"]
    if int(num_items) <= 0:
        raise ValueError("num_items must be positive: the step has no trained token")
    if trained_logits_only:
        targets = torch.nn.functional.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX)  # [B, T]
        trained = targets != IGNORE_INDEX
        logits = _trained_logits(model, inputs, trained)
        if logits.dim() == 2:  # [K, V], the trained positions
            kept = targets[trained].to(logits.device)  # [K]
            return _ce_sum(logits, kept) * world_size / _on(num_items, logits.device)
        return causal_lm_loss(logits, labels, num_items, world_size=world_size)
    return causal_lm_loss(model(**inputs).logits, labels, num_items, world_size=world_size)
