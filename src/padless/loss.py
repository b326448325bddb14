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

import functools
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
    labels_device = None
    for batch in micro_batches:
        total += trained_tokens(batch["labels"]).cpu()
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
    process called ``torch.cuda.set_device(local_rank)`` (the bench does, in ``_init_distributed``)."""
    import torch

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


@functools.cache
def _takes_logits_to_keep(model_class: type) -> bool:
    """Whether a model class's forward accepts ``logits_to_keep`` (looked up once per class, not on
    every micro-batch)."""
    import inspect

    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


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

    ``trained_logits_only``: ask the model for logits only at the positions whose next token is a
    target (transformers' ``logits_to_keep`` with an index tensor, shared by all rows of the batch).
    The LM head over a 50k vocabulary dominates small models, so skipping untrained positions
    (prompts, tool results, padding past every row's end) saves real work; the loss is unchanged.
    """
    import torch

    inputs = {k: v for k, v in batch.items() if k != "labels"}
    labels = batch["labels"]
    if int(num_items) <= 0:
        raise ValueError("num_items must be positive: the step has no trained token")
    inner = getattr(model, "module", model)  # DistributedDataParallel wraps the model
    if not trained_logits_only or not _takes_logits_to_keep(type(inner)):
        return causal_lm_loss(model(**inputs).logits, labels, num_items, world_size=world_size)
    targets = torch.nn.functional.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX)  # [B, T]
    keep = (targets != IGNORE_INDEX).any(dim=0).nonzero().squeeze(1)  # [K] positions with a target
    if keep.numel() == 0:  # nothing trained in this micro-batch: a zero that keeps the graph
        return model(**inputs, logits_to_keep=1).logits.sum() * 0.0
    logits = model(**inputs, logits_to_keep=keep.to(labels.device)).logits  # [B, K, V]
    kept = targets[:, keep].to(logits.device)  # [B, K]
    return _ce_sum(logits, kept) * world_size / _on(num_items, logits.device)
