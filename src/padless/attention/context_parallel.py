"""Context parallelism over packed documents: one packed row split over ``cp`` ranks, exact.

A packed row of ``L`` tokens is split into ``cp`` equal shards (:data:`LAYOUTS`: contiguous, rank ``r``
holding ``[r * L / cp, (r + 1) * L / cp)``; zigzag, rank ``r`` holding chunks ``r`` and ``2 cp - 1 - r``
of ``2 cp``; striped, several such rounds) and each rank runs the model on its own tokens alone. Every attention
layer keeps its local queries and all-gathers the keys and values of the whole row (the grouped
key/value heads only, before any repeat), with an autograd all-gather whose backward reduce-scatters
the gradients back to the rank that owns each key (Llama 3's choice over a ring: any mask is easy).
The document mask is built from GLOBAL indices: query ``i`` (global) sees key ``j`` exactly when both
lie in the same document, ``j <= i``, and ``i - j < window`` under a sliding window. Document ids are
computed on the whole row before the split (:func:`padless.batching.context_shards.split_row`), so no
convention about where a shard's causal diagonal lies can shift the mask.

How it reaches a transformers model: :func:`register_context_parallel_attention` registers
:func:`context_parallel_attention` (and a mask function that builds nothing) with transformers'
``AttentionInterface`` under ``"padless_cp"``. Inside a :func:`context_parallel` context the model's
forward on the local shard (with the shard's global ``position_ids``) runs every attention layer over
the whole row; outside one, the function is padless' own ``"padless"`` backend, unchanged.

Kernels: on the CPU (gloo), sdpa with the boolean global mask ``[R, 1, L / cp, L]``; on CUDA, flash-attn
varlen with per-rank boundaries (each local document piece's queries against its document's keys from
the document start, aligned bottom-right), else the same masked sdpa.

Token-mixing layers that are not attention (gated DeltaNet, Mamba2, short convolutions) run
head-parallel inside a cp forward (:mod:`padless.attention.context_mixers`). What it cannot make exact
is refused by name (:func:`context_parallel_refusal`): mixers with no scan to run head-parallel, heads
that do not divide by cp, soft-capping, sinks, ALiBi, chunked or bidirectional
attention. Sliding windows are honoured in the global mask.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from padless.attention.backend import padless_attention, padless_mask
from padless.attention.backend_table import MIXER_LAYER_TYPES
from padless.attention.context_mixers import _ACTIVE, active_context, split_counts  # noqa: F401 (re-exported)
from padless.attention.mixers import _MARK, _base_class, _scannable, mixer_layers
from padless.attention.rules import attention_rules
from padless.planning.context_balance import LAYOUTS, chunk_ranks  # noqa: F401  (LAYOUTS: re-exported)

CP_BACKEND_NAME = "padless_cp"
"""The name :func:`context_parallel_attention` is registered under."""


def row_multiple(cp: int, layout: str) -> int:
    """A row's length must divide by this to be split: its number of equal chunks under ``layout``
    (:func:`padless.planning.context_balance.chunk_ranks`)."""
    return int(chunk_ranks(cp, layout).size)


def shard_index(length: int, cp: int, rank: int, layout: str = "contiguous") -> torch.Tensor:
    """``[length / cp]`` int64 global indices of rank ``rank``'s tokens of a row of ``length`` tokens
    (a multiple of :func:`row_multiple`): its chunks (:data:`LAYOUTS`), in row order."""
    ranks = chunk_ranks(cp, layout)
    if length % ranks.size:
        raise ValueError(f"a row of {length} tokens does not split into {ranks.size} equal {layout} chunks")
    chunks = torch.arange(length).reshape(ranks.size, -1)
    return chunks[torch.from_numpy(ranks == rank)].reshape(-1)


@dataclass(frozen=True)
class ContextParallelState:
    """What every attention layer of a context-parallel forward reads: the whole row's documents and
    where this rank's queries, and the gathered keys, lie in it."""

    document_ids: torch.Tensor
    """``[R, L]`` int64 document ids of the whole rows (padding at a row end is its own document)."""
    index: torch.Tensor
    """``[L / cp]`` int64 global indices of this rank's tokens, in local order (:func:`shard_index`)."""
    order: torch.Tensor
    """``[L]`` int64 global index of each position of a sequence gathered over the group in rank order."""
    layout: str
    """``"contiguous"`` or ``"zigzag"``."""
    group: Any
    """The cp process group (``None``: the default group)."""

    @property
    def length(self) -> int:
        """``L``: the whole row's length."""
        return int(self.document_ids.shape[-1])

    @property
    def local(self) -> int:
        """``L / cp``: this rank's tokens per row."""
        return int(self.index.numel())

    def in_row_order(self, gathered: torch.Tensor, dim: int) -> torch.Tensor:
        """``gathered`` (a sequence gathered in rank order along ``dim``) in the row's global order."""
        if self.layout == "contiguous":
            return gathered
        return gathered.index_select(dim, torch.argsort(self.order).to(gathered.device))


def cp_rank_size(group: Any = None) -> tuple[int, int]:
    """``(rank in the cp group, cp)``."""
    return dist.get_rank(group), dist.get_world_size(group)


@contextmanager
def context_parallel(
    document_ids: torch.Tensor, *, group: Any = None, layout: str = "contiguous"
) -> Iterator[ContextParallelState]:
    """Run the forwards inside as this rank's shard of the rows whose ``document_ids`` (``[R, L]`` or
    ``[L]``, the WHOLE rows, computed before the split) are given; ``group``: the cp process group;
    ``layout``: how the row was split (:data:`LAYOUTS`). ``L`` must divide by :func:`row_multiple`
    (pad the row end: :func:`padless.batching.context_shards.split_row`)."""
    rank, cp = cp_rank_size(group)
    ids = document_ids if document_ids.ndim == 2 else document_ids.unsqueeze(0)
    if ids.ndim != 2 or ids.dtype.is_floating_point:
        raise ValueError(f"document_ids must be [R, L] integers, got {ids.dtype} {tuple(document_ids.shape)}")
    length = int(ids.shape[1])
    if length % row_multiple(cp, layout):
        raise ValueError(
            f"document_ids cover {length} tokens, not a multiple of {row_multiple(cp, layout)} "
            f"(the cp group's size {cp}, {layout} layout)"
        )
    order = torch.cat([shard_index(length, cp, r, layout) for r in range(cp)]).to(ids.device)
    index = order.reshape(cp, -1)[rank]
    state = ContextParallelState(ids.long(), index, order, layout, group)
    token = _ACTIVE.set(state)
    try:
        yield state
    finally:
        _ACTIVE.reset(token)


class _GatherSequence(torch.autograd.Function):
    """All-gather along ``dim`` over the group in rank order; backward: reduce-scatter (sum the
    gradient of the whole sequence over the ranks, keep this rank's slice)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
        rank, world = cp_rank_size(group)
        ctx.dim, ctx.group, ctx.rank, ctx.world, ctx.local = dim, group, rank, world, x.shape[dim]
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.contiguous()
        if dist.get_backend(ctx.group) == "gloo":  # gloo has no reduce-scatter: all-reduce, keep the slice
            dist.all_reduce(grad, group=ctx.group)
            return grad.narrow(ctx.dim, ctx.rank * ctx.local, ctx.local).contiguous(), None, None
        full = grad.movedim(ctx.dim, 0).contiguous()  # [L, ...]
        out = full.new_empty((ctx.local, *full.shape[1:]))
        dist.reduce_scatter_tensor(out, full, group=ctx.group)
        return out.movedim(0, ctx.dim).contiguous(), None, None


def gather_sequence(x: torch.Tensor, dim: int, group: Any = None) -> torch.Tensor:
    """``x`` (this rank's shard along ``dim``) -> the whole sequence, differentiable: the gradient of
    the result is reduce-scattered back to the shards."""
    return _GatherSequence.apply(x, dim, group)


def document_mask(
    document_ids: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor, window: int | None = None
) -> torch.Tensor:
    """``[R, Lq, Lk]`` bool: the query at global index ``queries[a]`` sees the key at global index
    ``keys[b]`` when both are in the same document of the whole row (``document_ids`` ``[R, L]``),
    ``keys[b] <= queries[a]`` and (with a window) ``queries[a] - keys[b] < window``."""
    q, k = queries.to(document_ids.device), keys.to(document_ids.device)
    gap = q[:, None] - k[None, :]  # [Lq, Lk]
    allowed = gap >= 0
    if window is not None:
        allowed &= gap < window
    same = document_ids[:, q, None] == document_ids[:, None, k]  # [R, Lq, Lk]
    return same & allowed


def context_parallel_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: ``query`` ``[R, Hq, L/cp, D]``, ``key``/``value``
    ``[R, Hk, L/cp, D]`` (this rank's shard) -> (``[R, L/cp, Hq, D]``, no weights). Inside a
    :func:`context_parallel` context: the keys and values of the whole row are gathered and each
    local query attends under the global document mask. Outside one: padless' own attention."""
    state = _ACTIVE.get()
    if state is None:
        return padless_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    batch, heads, local, dim = query.shape
    if local != state.local or batch != state.document_ids.shape[0]:
        raise ValueError(
            f"context-parallel attention got {batch} x {local} queries but the context holds rows of "
            f"{tuple(state.document_ids.shape)} split into shards of {state.local}; "
            "run the model on this rank's shard from padless.batching.context_shards.split_row"
        )
    if attention_mask is not None:
        raise ValueError("context-parallel attention builds its own global document mask; send no attention_mask")
    for name in ("softcap", "s_aux", "position_bias"):
        if kwargs.get(name) is not None:
            raise ValueError(f"context-parallel attention cannot apply {name}; the model is refused for cp")
    kv = gather_sequence(torch.stack([key, value]), 3, state.group)  # [2, R, Hk, L, D]: one collective
    window = kwargs.get("sliding_window")
    ids = state.document_ids.to(query.device)
    if query.is_cuda and _flash_varlen_available():
        kv = state.in_row_order(kv, 3)
        out = _flash_varlen(query, kv[0], kv[1], ids, state, scaling, dropout, window)
        return out, None
    mask = document_mask(ids, state.index, state.order, window)[:, None]  # [R, 1, L/cp, L]: keys in gathered order
    out = torch.nn.functional.scaled_dot_product_attention(
        query, kv[0], kv[1], attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=key.shape[1] != heads
    )  # [R, Hq, L/cp, D]
    return out.transpose(1, 2).contiguous(), None


def _flash_varlen_available() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def _flash_varlen(query, key, value, ids, state: ContextParallelState, scaling, dropout, window):  # pragma: no cover
    """flash-attn varlen with per-rank boundaries (CUDA; written for a GPU run). ``key``/``value`` hold
    the whole row in global order. The local queries are cut into pieces of consecutive global indices
    in one document; a piece holding queries ``[a, b)`` of a document starting at ``s`` reads keys
    ``[s, b)``, and flash's bottom-right causal alignment puts query ``a + i`` on key ``a + i``."""
    from flash_attn import flash_attn_varlen_func

    batch, heads, local, dim = query.shape
    length = state.length
    glob = state.index.cpu()  # [L/cp] global index of each local token
    host = ids.cpu()
    q_idx, k_idx, cu_q, cu_k = [], [], [0], [0]
    for r in range(batch):
        row = host[r]
        doc = row[glob]
        first = torch.full((int(row.max()) + 1,), length, dtype=torch.long).scatter_reduce(
            0, row, torch.arange(length), "amin"
        )  # each document's global start
        breaks = torch.ones(local, dtype=torch.bool)
        breaks[1:] = (glob[1:] != glob[:-1] + 1) | (doc[1:] != doc[:-1])
        bounds = [*torch.nonzero(breaks).flatten().tolist(), local]
        for a, b in zip(bounds[:-1], bounds[1:]):
            start, last = int(first[doc[a]]), int(glob[b - 1])
            q_idx.append(torch.arange(r * local + a, r * local + b))
            k_idx.append(torch.arange(r * length + start, r * length + last + 1))
            cu_q.append(cu_q[-1] + b - a)
            cu_k.append(cu_k[-1] + last + 1 - start)
    qi, ki = torch.cat(q_idx).to(query.device), torch.cat(k_idx).to(query.device)
    q = query.transpose(1, 2).reshape(batch * local, heads, dim)[qi]
    k = key.transpose(1, 2).reshape(batch * length, key.shape[1], dim)[ki]
    v = value.transpose(1, 2).reshape(batch * length, value.shape[1], dim)[ki]
    cq = torch.tensor(cu_q, dtype=torch.int32, device=query.device)
    ck = torch.tensor(cu_k, dtype=torch.int32, device=query.device)
    extra = {} if window is None else {"window_size": (window - 1, 0)}
    out = flash_attn_varlen_func(
        q,
        k,
        v,
        cq,
        ck,
        int((cq[1:] - cq[:-1]).max()),
        int((ck[1:] - ck[:-1]).max()),
        dropout_p=dropout,
        softmax_scale=scaling,
        causal=True,
        **extra,
    )
    full = out.new_empty(batch * local, heads, dim)
    full[qi] = out
    return full.reshape(batch, local, heads, dim)


def context_parallel_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """transformers' mask interface for ``"padless_cp"``: no mask inside a :func:`context_parallel`
    context (the attention builds the global one), padless' mask function outside it."""
    if _ACTIVE.get() is not None:
        return None
    return padless_mask(*args, **kwargs)


def register_context_parallel_attention(name: str = CP_BACKEND_NAME) -> str:
    """Register :func:`context_parallel_attention` and :func:`context_parallel_mask` with transformers
    under ``name`` (idempotent); then ``model.set_attn_implementation(name)``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, context_parallel_attention)
    AttentionMaskInterface.register(name, context_parallel_mask)
    return name


def context_parallel_refusal(model: Any, cp: int | None = None) -> str | None:
    """Why ``model`` cannot run context-parallel exactly over ``cp`` ranks (``None``: it can; ``cp=None``:
    head and channel counts are not checked). Token-mixing layers that are not attention run
    head-parallel (:mod:`padless.attention.context_mixers`) where their kind has document-aware scans,
    the layer is patched and its heads and convolution channels divide by ``cp``; any other such layer
    carries a state along the row that a shard would need from the shard before it. Soft-capping,
    sinks, ALiBi, chunked and bidirectional attention are not in the global mask."""
    layers = mixer_layers(model)
    for info in layers:
        module = model.get_submodule(info.name)
        name = f"{info.name} ({_base_class(module).__name__})"
        if not _scannable(info.kind, module):
            return (
                f"{type(model).__name__} has token-mixing layers that are not attention ({info.kind}: {name}) with "
                "no document-aware scan padless can run head-parallel; their state runs along the whole row, so "
                "a shard would need the previous shard's state (not passed between ranks)"
            )
        if getattr(module, _MARK, None) is None:
            return (
                f"{type(model).__name__} has token-mixing layer {name} ({info.kind}) unpatched; call "
                "padless.attention.mixers.enable_per_document_mixers(model) first (inside a context-parallel "
                "forward it then runs head-parallel)"
            )
        for what, count in split_counts(module, info.kind).items() if cp else ():
            if count % cp:
                return (
                    f"{type(model).__name__} has {count} {what} in {name} ({info.kind}), which do not divide by "
                    f"cp={cp} (head-parallel needs each rank to hold an equal share)"
                )
    rules = attention_rules(model)
    # with every mixer layer found and run head-parallel, the layer types naming them are handled
    others = tuple(x for x in rules.other_layer_types if not layers or x not in MIXER_LAYER_TYPES)
    problems = {
        "attention logit soft-capping": rules.softcap is not None,
        "attention sinks": rules.sinks,
        "an ALiBi bias": rules.alibi,
        "bidirectional attention": rules.bidirectional,
        "chunked attention": rules.chunk_size is not None,
        f"layers that are not attention ({', '.join(others)})": bool(others),
    }
    found = [what for what, present in problems.items() if present]
    if found:
        return f"{type(model).__name__} uses {', '.join(found)}, which context-parallel attention does not apply"
    return None


def check_context_parallel(model: Any, cp: int | None = None) -> None:
    """Raise ``ValueError`` naming why ``model`` cannot run context-parallel over ``cp`` ranks (see
    :func:`context_parallel_refusal`)."""
    reason = context_parallel_refusal(model, cp)
    if reason is not None:
        raise ValueError(f"model: context_parallel refused: {reason}")


def _in_context(checkpoint_func: Any) -> Any:
    """``checkpoint_func`` (transformers' ``_gradient_checkpointing_func``) whose recomputation runs inside
    the :func:`context_parallel` state its forward ran in: the backward recomputes a layer after the
    context has closed (and, on CUDA, in the autograd engine's thread), where the layer would otherwise
    attend over its own shard alone."""

    def checkpoint_in_context(function: Any, *args: Any, **kwargs: Any) -> Any:
        state = _ACTIVE.get()
        if state is None:
            return checkpoint_func(function, *args, **kwargs)

        def run(*a: Any, **k: Any) -> Any:
            token = _ACTIVE.set(state)
            try:
                return function(*a, **k)
            finally:
                _ACTIVE.reset(token)

        return checkpoint_func(run, *args, **kwargs)

    checkpoint_in_context.padless_context_parallel = True  # type: ignore[attr-defined]
    return checkpoint_in_context


def keep_context_in_checkpoints(model: torch.nn.Module) -> int:
    """Make every activation-checkpointed layer of ``model`` recompute inside the context-parallel state
    its forward ran in (idempotent; call before each forward: Trainer enables checkpointing when training
    starts). Returns how many layers were wrapped now."""
    wrapped = 0
    for module in model.modules():
        func = getattr(module, "_gradient_checkpointing_func", None)
        if func is not None and not getattr(func, "padless_context_parallel", False):
            module._gradient_checkpointing_func = _in_context(func)
            wrapped += 1
    return wrapped
