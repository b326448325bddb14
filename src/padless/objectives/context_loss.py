"""The loss and gradients of a context-parallel step: one loss over the whole row, summed over ranks.

Each rank of a cp group computes ``sum(CE over its shard's trained targets) / N`` where ``N`` counts
the trained targets of the WHOLE rows (all ranks; :attr:`padless.batching.context_shards.RowShard.num_items`,
summed over data-parallel ranks too when there are any). The ranks' losses add up to the single-process
loss; the gradient of each rank's loss reaches the other ranks' keys and values through the
all-gather's reduce-scatter, so summing parameter gradients over the cp group gives exactly the
single-process gradient. Normalising per rank (by the shard's own count) would weigh a shard with few
trained tokens more: a different objective.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist

from padless.attention.context_parallel import check_context_parallel, context_parallel, keep_context_in_checkpoints
from padless.batching.context_shards import RowShard
from padless.objectives.loss import _ce_sum


def context_parallel_loss(logits: torch.Tensor, targets: torch.Tensor, num_items: int | torch.Tensor) -> torch.Tensor:
    """``sum(CE(logits, targets)) / num_items``: logits ``[R, L/cp, V]``, targets ``[R, L/cp]`` ALREADY
    shifted (:func:`padless.batching.context_shards.split_row`), ``num_items`` the whole rows' count."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} do not match")
    if float(num_items) <= 0:
        raise ValueError("num_items must be positive: the step has no trained token")
    return _ce_sum(logits, targets.to(logits.device)) / num_items


def sync_context_gradients(model: torch.nn.Module, group: Any = None) -> None:
    """Sum every parameter gradient over the cp ``group`` (in place): each rank holds the gradient of
    its share of the loss."""
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, group=group)


_CHECKED: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()
"""Model -> the cp sizes :func:`check_context_parallel` accepted it for (its layers are read once per cp)."""


def context_parallel_forward(model: Any, shard: RowShard, *, group: Any = None, **kwargs: Any) -> torch.Tensor:
    """The model's logits ``[R, L/cp, V]`` for this rank's ``shard``, every attention layer attending
    over the whole rows (the model's attention implementation must be ``"padless_cp"``:
    :func:`padless.attention.context_parallel.register_context_parallel_attention`). A model with
    layers it cannot make exact is refused (:func:`padless.attention.context_parallel.check_context_parallel`)."""
    backend = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if backend is not None and backend != "padless_cp":
        raise ValueError(
            f"model: attention implementation {backend!r} cannot gather keys over ranks (it must be 'padless_cp'); "
            "call model.set_attn_implementation(register_context_parallel_attention())"
        )
    cp = dist.get_world_size(group) if dist.is_initialized() else 1
    if cp not in _CHECKED.get(model, ()):
        check_context_parallel(model, cp)  # a model it cannot make exact at this cp is refused by name
        _CHECKED.setdefault(model, set()).add(cp)
    device = next(model.parameters()).device
    keep_context_in_checkpoints(model)  # activation checkpointing recomputes inside this context
    with context_parallel(shard.document_ids.to(device), group=group, layout=shard.layout):
        out = model(
            input_ids=shard.input_ids.to(device), position_ids=shard.position_ids.to(device), use_cache=False, **kwargs
        )
    return out.logits


def context_parallel_step(model: Any, shard: RowShard, *, group: Any = None, num_items: Any = None) -> torch.Tensor:
    """Forward, loss and backward of one shard, then the gradients summed over the cp ``group``.
    Returns this rank's share of the loss (the shares sum to the whole rows' loss). ``num_items``:
    the step's trained-token count when it spans more than these rows (micro-batches, dp ranks)."""
    logits = context_parallel_forward(model, shard, group=group)
    loss = context_parallel_loss(logits, shard.targets, shard.num_items if num_items is None else num_items)
    loss.backward()
    sync_context_gradients(model, group)
    return loss.detach()
