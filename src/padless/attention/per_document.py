"""Run a token-mixing layer on each document of a packed row: documents of similar length grouped,
right-padded into ``[n_docs, P, ...]`` batches, the layer's original forward called per group with no
cache, state, padding mask or boundaries, and the outputs scattered back into the row::

    row   | a a a b b c c c c |          group 1 (P = 4): | c c c c |   group 2 (P = 3): | a a a |
                                                                                        | b b . |

Correct for causal layers only (token ``t`` reads tokens ``<= t``), where trailing padding cannot
change the outputs before it. :func:`run_with_boundaries` is the CUDA alternative: the row flattened to
one sequence and its boundaries handed to the kernels (following transformers' model code, in the version
:mod:`padless.attention.transformers_compat` names; unverified: no test runs it, the kernels are CUDA-only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from padless.attention.mixer_documents import _no_documents
from padless.attention.varlen import _LastValue

CACHE_ARGS = ("cache", "cache_params", "past_key_values", "past_key_value", "layer_past", "state")
"""Argument names of a layer's cache or recurrent state."""
MASK_ARGS = ("attention_mask", "mask")
"""Argument names of a layer's padding mask."""
_BOUNDARY_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx", "cu_seqlens")
_PLANS = _LastValue()  # cu_seqlens -> gather / scatter indices, once per forward


def group_documents(lengths: list[int], max_padding: float) -> list[list[int]]:
    """Indices of documents grouped for padded batches: longest first, a document joins the current
    group while the group's padding stays at most ``max_padding`` times its real tokens. Every index
    appears exactly once."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    tokens = 0
    for i in order:
        if groups:
            group = groups[-1]
            width = lengths[group[0]]
            if width * (len(group) + 1) <= (1 + max_padding) * (tokens + lengths[i]):
                group.append(i)
                tokens += lengths[i]
                continue
        groups.append([i])
        tokens = lengths[i]
    return groups


@dataclass(frozen=True)
class _Group:
    index: torch.Tensor
    """``[n, P]`` flat token index of each document's tokens, clamped inside the row for padding."""
    valid: torch.Tensor
    """``[n, P]`` True on real tokens, False on padding."""
    flat: torch.Tensor
    """``[T_group]`` flat positions of the real tokens, in ``index[valid]`` order."""


def _plan(cu: torch.Tensor, max_padding: float, device: torch.device) -> list[_Group]:
    bounds = cu.tolist()
    starts, lengths = bounds[:-1], [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    plan = []
    for group in group_documents(lengths, max_padding):
        width = lengths[group[0]]
        start = torch.tensor([starts[i] for i in group], dtype=torch.long)[:, None]  # [n, 1]
        length = torch.tensor([lengths[i] for i in group], dtype=torch.long)[:, None]
        step = torch.arange(width, dtype=torch.long)[None, :]  # [1, P]
        valid = step < length  # [n, P]
        index = start + torch.minimum(step, length - 1)
        plan.append(_Group(index.to(device), valid.to(device), index[valid].to(device)))
    return plan


def _is_token_tensor(value: Any, batch: int, length: int) -> bool:
    return isinstance(value, torch.Tensor) and value.ndim >= 2 and tuple(value.shape[:2]) == (batch, length)


def _document_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments of one per-document call, before per-token tensors are regrouped: no cache, no
    state, no padding mask, no boundaries (each call holds whole documents only)."""
    out = {}
    for name, value in arguments.items():
        if name in _BOUNDARY_KWARGS:
            continue
        if name in CACHE_ARGS or name in MASK_ARGS:
            value = None
        elif name == "use_cache":
            value = False
        out[name] = value
    return out


def _regroup(value: Any, group: _Group, batch: int, length: int) -> Any:
    """A per-token tensor ``[B, L, ...]`` (or a tuple of them) as the group's ``[n, P, ...]`` batch, zero
    on padding; anything else unchanged."""
    if isinstance(value, tuple):
        return tuple(_regroup(v, group, batch, length) for v in value)
    if not _is_token_tensor(value, batch, length):
        return value
    flat = value.reshape(batch * length, *value.shape[2:])  # [B * L, ...]
    picked = flat[group.index]  # [n, P, ...]
    keep = group.valid.reshape(*group.valid.shape, *([1] * (picked.ndim - 2)))
    return picked * keep.to(picked.dtype) if picked.is_floating_point() else picked.masked_fill(~keep, 0)


def run_per_document(
    forward: Callable, arguments: dict[str, Any], hidden_name: str, cu_seqlens: torch.Tensor, max_padding: float
) -> Any:
    """Call ``forward`` (a layer's original forward, by keyword) once per group of documents and return
    what it returns for the whole row: tensors ``[B, L, ...]`` assembled from the groups' outputs,
    anything else (a state from a call without one) as ``None``. ``arguments``: the row's call by
    name; ``arguments[hidden_name]`` ``[B, L, H]``; ``cu_seqlens`` ``[N + 1]`` over the flat tokens."""
    hidden = arguments[hidden_name]
    batch, length = hidden.shape[:2]
    plan = _PLANS.get(cu_seqlens, (max_padding, hidden.device), lambda: _plan(cu_seqlens, max_padding, hidden.device))
    base = _document_arguments(arguments)
    outputs = []
    with _no_documents():  # a layer nested inside (none known) must not see the row's documents
        for group in plan:
            outputs.append(forward(**{k: _regroup(v, group, batch, length) for k, v in base.items()}))
    flat = torch.cat([g.flat for g in plan])  # every token of the row exactly once

    def scatter(parts: list[Any]) -> Any:
        first = parts[0]
        if not (isinstance(first, torch.Tensor) and first.ndim >= 2 and first.shape[:2] == plan[0].valid.shape):
            return None
        values = torch.cat([p[g.valid] for p, g in zip(parts, plan, strict=True)])  # [T, ...]
        out = values.new_zeros(batch * length, *values.shape[1:]).index_copy(0, flat, values)
        return out.reshape(batch, length, *values.shape[1:])

    if isinstance(outputs[0], tuple):
        return tuple(scatter([o[i] for o in outputs]) for i in range(len(outputs[0])))
    return scatter(outputs)


def run_with_boundaries(
    forward: Callable, arguments: dict[str, Any], hidden_name: str, cu_seqlens: torch.Tensor, *, cu_kwargs: bool
) -> Any:
    """The row flattened to one sequence ``[1, B * L, ...]`` and its boundaries handed to the CUDA
    kernels the layer's code calls: ``seq_idx`` ``[1, B * L]`` (the document of each token:
    ``causal_conv1d``, ``mamba_ssm``) and, with ``cu_kwargs``, ``cu_seq_lens_q/k`` (``fla``)."""
    hidden = arguments[hidden_name]
    batch, length = hidden.shape[:2]
    call = {k: v for k, v in arguments.items() if k not in _BOUNDARY_KWARGS and k not in MASK_ARGS}
    call = {
        k: (v.reshape(1, batch * length, *v.shape[2:]) if _is_token_tensor(v, batch, length) else v)
        for k, v in call.items()
    }
    cu = cu_seqlens.to(device=hidden.device, dtype=torch.int32)
    if cu_kwargs:
        call["cu_seq_lens_q"] = call["cu_seq_lens_k"] = cu
    lengths = cu[1:] - cu[:-1]
    seq_idx = torch.repeat_interleave(torch.arange(lengths.numel(), device=cu.device, dtype=torch.int32), lengths)
    call["seq_idx"] = seq_idx[None]

    def unflatten(out: Any) -> Any:
        if isinstance(out, torch.Tensor) and out.ndim >= 2 and tuple(out.shape[:2]) == (1, batch * length):
            return out.reshape(batch, length, *out.shape[2:])
        return out

    out = forward(**call)
    return tuple(unflatten(o) for o in out) if isinstance(out, tuple) else unflatten(out)
