"""padless attention in transformers: the ``"padless"`` attention backend and its mask function.

How a packed batch reaches the attention function in transformers (in the version
:mod:`padless.attention.transformers_compat` names, read from the sources and checked with a probe
backend on GPT-2, Llama, Mistral and Qwen2): the model forwards its ``**kwargs`` down to every
attention layer, and the decoder layer adds ``position_ids``. So the attention function receives
``position_ids`` (the user's, or ``arange`` when none were given), ``use_cache``, and, when the
collator sends them, ``cu_seq_lens_q/k`` and ``max_length_q/k`` (offsets over the flattened ``B * L``
tokens). Models with ``_supports_attention_backend = True`` promise exactly this forwarding.
Boundaries are taken from ``cu_seq_lens_q`` when present (checked against ``position_ids``, which must
restart at every document), else from ``position_ids`` (a new document wherever a position is not its
predecessor + 1), else from a :func:`packed_documents` context around the forward (for models that
forward neither).

Which mask transformers builds: ``create_causal_mask`` looks the backend name up in
``AttentionMaskInterface``. An unregistered name builds no mask at all, and also *drops* a 2D padding
mask silently. So padless registers :func:`padless_mask`: it builds nothing (no dense ``L x L``
mask), lets right padding through (harmless for causal attention) and refuses any other padding.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from padless.attention.host import host_values
from padless.attention.varlen import VarlenLayout, _LastValue, layout_from_host, varlen_attention

BACKEND_NAME = "padless"
"""The name the padless attention function is registered under."""

Backend = Literal["padless", "sdpa", "eager", "flash_attention_2", "flex_attention"]

_CONTEXT: ContextVar[tuple[Any, Any, Any] | None] = ContextVar("padless_documents", default=None)
"""(position_ids, cu_seqlens, max_seqlen) of the enclosing :func:`packed_documents` context."""
_CONTEXT_K: ContextVar[Any] = ContextVar("padless_documents_k", default=None)
"""cu_seq_lens_k of the enclosing :func:`documents_context` (``None``: the same as cu_seqlens)."""
_LAYOUTS = _LastValue()  # the checked layout of a forward's boundaries, built once per forward


@dataclass(frozen=True)
class _Forward:
    """What the enclosing model's forward was given, as far as documents are concerned (held for its
    duration by a hook on each transformers base model: :mod:`padless.attention.mixer_documents`)."""

    cu_seqlens: Any = None
    """``cu_seq_lens_q`` sent to the forward (``None``: none sent)."""
    position_ids: Any = None
    """The ``position_ids`` it was given."""
    padded: bool = False
    """It was given a 2D ``attention_mask`` with some padding."""
    cached: bool = False
    """It was given a cache (``past_key_values`` / ``cache``) or ``use_cache=True``."""
    row_padding: Any = None
    """``[B]`` trailing padding tokens of each row (:data:`padless.layout.ROW_PADDING`), where sent."""


_MODEL_FORWARD: ContextVar[_Forward] = ContextVar("padless_model_forward", default=_Forward())
# kwargs some models send that change what attention computes; padless cannot honour them.
_REFUSED_KWARGS = {"s_aux": "attention sinks (s_aux)", "position_bias": "an additive position bias"}
# padless_attention's body wrapped in torch.compiler.disable (set on registration): what compiled code calls
_UNTRACED: list[Callable[..., Any]] = []


@contextmanager
def packed_documents(
    *, position_ids: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None
) -> Iterator[None]:
    """Document boundaries for a forward whose attention layers receive neither ``position_ids`` nor
    ``cu_seq_lens_q`` (a model without ``_supports_attention_backend``). Give ``position_ids``
    ``[B, L]`` restarting at 0 per document, or ``cu_seqlens`` ``[N + 1]`` over the flat ``B * L``
    tokens. Kwargs that do reach the attention layers take precedence: ``cu_seqlens`` given here
    are checked against ``position_ids`` that reach them (how :func:`padless.compile_layers` keeps
    the boundaries out of compiled graphs)."""
    if (position_ids is None) == (cu_seqlens is None):
        raise ValueError("packed_documents needs exactly one of position_ids or cu_seqlens")
    with documents_context(position_ids, cu_seqlens, cu_seqlens, max_seqlen):
        yield


@contextmanager
def documents_context(position_ids: Any, cu_seqlens: Any, cu_seqlens_k: Any, max_seqlen: Any) -> Iterator[None]:
    """:func:`packed_documents` with ``cu_seq_lens_k`` kept apart (checked equal to ``cu_seqlens`` with
    the layout): what :func:`padless.compile_layers` hands the attention for boundaries it took out of
    a compiled layer's arguments."""
    token, token_k = _CONTEXT.set((position_ids, cu_seqlens, max_seqlen)), _CONTEXT_K.set(cu_seqlens_k)
    try:
        yield
    finally:
        _CONTEXT.reset(token)
        _CONTEXT_K.reset(token_k)


def cu_seqlens_from_position_ids(position_ids: torch.Tensor, batch: int) -> torch.Tensor:
    """``[N + 1]`` int32 offsets over the flat ``batch * L`` tokens: a document starts at every row
    start and wherever a position is not its predecessor + 1 (transformers' packed-row rule)."""
    _check_position_shape(position_ids, batch)
    pos = position_ids.expand(batch, -1)  # [B, L]
    start = torch.ones(pos.shape, dtype=torch.bool, device=pos.device)
    start[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    first = start.reshape(-1).nonzero().squeeze(1)  # [N]
    return torch.cat([first, first.new_tensor([pos.numel()])]).to(torch.int32)


def sent_boundaries(kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``cu_seq_lens_q`` of a layer's kwargs, checked to come with a ``cu_seq_lens_k`` (``None`` when
    neither was sent). Their values are compared on the host, with the rest of the layout
    (:func:`document_layout`): no device sync here."""
    cu, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if (cu is None) != (cu_k is None):
        raise ValueError("padless attention needs both cu_seq_lens_q and cu_seq_lens_k, or neither")
    return cu


def document_layout(kwargs: dict[str, Any], batch: int, length: int, device: Any) -> VarlenLayout:
    """The checked document layout of a ``[batch, length]`` attention input, from the layer's kwargs
    (``cu_seq_lens_q/k``, ``max_length_q``, ``position_ids``) or a :func:`packed_documents` context.

    Built once per forward (every layer passes the same tensors) from host copies of the boundary
    tensors: :func:`padless.attention.host.host_values`, one device sync at most (none when the batch
    was moved with :func:`padless.batch_to`, which remembers the collator's host copies)."""
    cu, cu_k = sent_boundaries(kwargs), kwargs.get("cu_seq_lens_k")
    max_len = kwargs.get("max_length_q")
    pos = kwargs.get("position_ids")
    context = _CONTEXT.get() if cu is None else None
    if context is not None:  # kwargs that reached the layer take precedence; the rest from the context
        ctx_pos, cu, max_len = context
        cu_k = _CONTEXT_K.get()
        pos = ctx_pos if pos is None else pos
    elif cu is None and pos is None:
        raise ValueError(
            "padless attention received neither position_ids nor cu_seq_lens_q, so it cannot tell where "
            "documents start; wrap the forward in padless.attention.backend.packed_documents(position_ids=...)"
        )
    if pos is not None:
        if pos.shape[-1] != length:
            raise ValueError(f"position_ids cover {pos.shape[-1]} tokens but the attention input has {length}")
        _check_position_shape(pos, batch)
    if cu is not None and (cu.ndim != 1 or cu.numel() < 2 or cu.dtype.is_floating_point):
        raise ValueError(
            f"cu_seq_lens_q must be 1-D integers with at least 2 entries, got {cu.dtype} {tuple(cu.shape)}"
        )
    max_len = None if max_len is None else int(max_len)
    primary = cu if cu is not None else pos
    extra = (batch, length, id(pos), id(cu_k), max_len, str(device))
    make = lambda: _layout_on_host(cu, cu_k, pos, batch, length, max_len, device)  # noqa: E731
    return _LAYOUTS.get(primary, extra, make)  # type: ignore[return-value]


def _layout_on_host(cu, cu_k, pos, batch: int, length: int, max_len: int | None, device: Any) -> VarlenLayout:
    sent = [t for t in (cu, cu_k if cu_k is not cu else None, pos) if t is not None]
    values = dict(zip(map(id, sent), host_values(sent)))  # one transfer for all of them
    cu_host = None if cu is None else values[id(cu)]
    if cu_k is not None and cu_k is not cu and not np.array_equal(values[id(cu_k)], cu_host):
        raise ValueError("cu_seq_lens_q and cu_seq_lens_k differ; padless attention is self-attention over one layout")
    if pos is not None:
        from_pos = cu_seqlens_from_host_positions(values[id(pos)], batch)
        if cu_host is None:
            cu_host, cu = from_pos, None
        elif not np.array_equal(cu_host, from_pos):
            raise ValueError(
                f"position_ids do not restart exactly where cu_seq_lens_q starts documents "
                f"({cu_host.size - 1} documents by cu_seq_lens_q, {from_pos.size - 1} by position_ids); "
                "send position_ids restarting at 0 at every document start"
            )
    return layout_from_host(cu_host, batch * length, max_len, device, on_device=cu)


def _check_position_shape(position_ids: Any, batch: int) -> None:
    if position_ids.ndim != 2 or position_ids.shape[0] not in (1, batch):
        raise ValueError(
            f"position_ids must be [batch, length] (or [1, length]) for padless attention, got shape "
            f"{tuple(position_ids.shape)} (multi-axis rotary positions cannot mark documents)"
        )


def cu_seqlens_from_host_positions(position_ids: np.ndarray, batch: int) -> np.ndarray:
    """:func:`cu_seqlens_from_position_ids` on the host: ``[N + 1]`` int64 offsets from ``[batch, L]``
    (or ``[1, L]``) position ids."""
    _check_position_shape(position_ids, batch)
    pos = np.broadcast_to(position_ids, (batch, position_ids.shape[1]))  # [B, L]
    start = np.ones(pos.shape, dtype=bool)
    start[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    first = np.flatnonzero(start)  # [N]
    return np.concatenate([first, [pos.size]]).astype(np.int64)


def padless_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: ``query`` ``[B, Hq, L, D]``, ``key``/``value`` ``[B, Hk, L, D]``
    -> (``[B, L, Hq, D]``, no weights). Exact causal attention inside each packed document.

    Under ``torch.compile`` it runs untraced (a graph break): its kernels plan buckets from the
    document lengths, which traced would become guards and recompile the graph for every batch."""
    if _UNTRACED and torch.compiler.is_compiling():
        return _UNTRACED[0](module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    return _attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)


_PACKED_KWARGS = ("position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def boundaries_sent(kwargs: dict[str, Any]) -> bool:
    """The forward says where its documents lie: ``cu_seq_lens_q/k`` among the layer's kwargs, a
    shared-prompt tree, or a :func:`packed_documents` context around it."""
    return (
        sent_boundaries(kwargs) is not None or kwargs.get("tree_cu_seqlens") is not None or _CONTEXT.get() is not None
    )


def _covers_rows(kwargs: dict, batch: int, length: int) -> bool:
    """The boundaries sent describe this layer's ``[batch, length]`` tokens (a vision encoder handed
    the text rows' kwargs gets other tokens)."""
    cu = sent_boundaries(kwargs)
    if cu is not None:
        return int(host_values([cu])[0][-1]) == batch * length
    context = _CONTEXT.get()
    if context is not None and context[0] is not None:
        return context[0].shape[-1] == length
    return context is not None


def _lost_boundaries(batch: int, length: int) -> bool:
    """The enclosing model's forward was sent boundaries for these ``[batch, length]`` tokens that did
    not reach this attention layer."""
    cu = _MODEL_FORWARD.get().cu_seqlens
    return cu is not None and int(host_values([cu])[0][-1]) == batch * length


def _bidirectional(module: Any, kwargs: dict) -> bool:
    is_causal = kwargs.get("is_causal")
    return not (getattr(module, "is_causal", True) if is_causal is None else is_causal)


def _positions_mark_documents(attention_mask: Any, query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> bool:
    """No boundaries sent, and the call is one transformers' own packed-row rule reads documents from:
    ``[B, L]`` (or ``[1, L]``) text position ids, no mask, no cache (queries and keys alike). A plain
    forward's positions count ``0..L-1``: one document per row, plain causal attention."""
    pos = kwargs.get("position_ids")
    return (
        attention_mask is None
        and key.shape[2] == query.shape[2]
        and pos is not None
        and pos.ndim == 2
        and pos.shape[-1] == query.shape[2]
        and pos.shape[0] in (1, query.shape[0])
    )


def own_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs) -> tuple[torch.Tensor, None]:
    """A call without packed documents (a plain or left-padded forward, a KV-cache step, cross-attention,
    a vision encoder) run as the model runs it on transformers' own backends: its module's
    ``eager_attention_forward`` where the call needs what sdpa lacks (soft-capping, sinks, a position
    bias), else sdpa with the mask transformers built (:func:`padless_mask` hands it through)."""
    own = {k: v for k, v in kwargs.items() if k not in _PACKED_KWARGS or k == "position_ids"}
    if any(own.get(k) is not None for k in ("softcap", "s_aux", "position_bias")):
        eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
        if eager is not None:
            return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **own)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **own)


def _attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs) -> tuple[torch.Tensor, None]:
    batch, heads, length, dim = query.shape
    sent = boundaries_sent(kwargs)
    if _bidirectional(module, kwargs):
        if sent and _covers_rows(kwargs, batch, length):
            raise ValueError("padless attention is causal only; this layer asks for bidirectional attention")
        # a layer outside the packed rows: a vision encoder attending within each image, which may be
        # handed the text rows' boundaries through **kwargs. The rule refuses models whose token
        # layers attend both ways.
        return own_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    positions = _positions_mark_documents(attention_mask, query, key, kwargs) and not any(
        kwargs.get(name) is not None for name in _REFUSED_KWARGS
    )  # sinks or a position bias with nothing sent: the model's own attention applies them
    if not sent and not positions and _lost_boundaries(batch, length):
        raise ValueError(
            f"this forward was sent document boundaries (cu_seq_lens_q), but {type(module).__name__} received none: "
            "the model does not hand its attention layers the keyword arguments it is sent, so padless attention "
            "cannot keep packed documents apart in it; use attn_implementation='sdpa' (the collator sends a 4D mask)"
        )
    if not sent and not positions:
        # no packed documents here: the model's own semantics, mask and cache included
        return own_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    if key.shape[2] != length:
        raise ValueError(
            f"padless attention got {length} queries but {key.shape[2]} keys together with packed document "
            "boundaries: a cache or cross-attention cannot be split by document; send use_cache=False "
            "(padless' collators do)"
        )
    if value.shape[-1] != dim:
        raise ValueError(
            f"padless attention got value heads of size {value.shape[-1]} and query heads of size {dim}; it needs "
            "them equal (check_exact refuses such models: v_head_dim != qk_head_dim); use backend 'sdpa'"
        )
    if attention_mask is not None:
        raise ValueError(
            f"padless attention got document boundaries and an attention_mask of shape "
            f"{tuple(attention_mask.shape)} (padding, or a mask pattern of the model's own) that it would have "
            "to ignore; send position_ids and cu_seq_lens_q/k without a mask, or use backend 'sdpa' for a 4D mask"
        )
    for name, what in _REFUSED_KWARGS.items():
        if kwargs.get(name) is not None:
            raise ValueError(f"padless attention cannot apply {what} ({name}); use attn_implementation='eager'")
    if kwargs.get("tree_cu_seqlens") is not None:  # a shared-prefix batch (padless.attention.tree)
        from padless.attention.tree import padless_tree_attention

        return padless_tree_attention(query, key, value, scaling, dropout, kwargs), None
    layout = document_layout(kwargs, batch, length, query.device)
    if query.dtype == torch.float32 and torch.is_autocast_enabled(query.device.type):
        # under autocast, RoPE models hand over fp32 queries: compute in the autocast dtype, as
        # transformers' flash-attention integration does (and as the fast varlen kernels need)
        query, key, value = (t.to(torch.get_autocast_dtype(query.device.type)) for t in (query, key, value))
    q = query.transpose(1, 2).reshape(batch * length, heads, dim)  # [T, Hq, D], T = B * L
    k = key.transpose(1, 2).reshape(batch * length, key.shape[1], dim)  # [T, Hk, D]
    v = value.transpose(1, 2).reshape(batch * length, value.shape[1], dim)
    out = varlen_attention(
        q,
        k,
        v,
        layout,
        scale=scaling,
        causal=True,
        dropout_p=dropout,
        sliding_window=kwargs.get("sliding_window"),
        softcap=kwargs.get("softcap"),
    )
    return out.reshape(batch, length, heads, dim), None


def padless_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: int = 0,
    mask_function: Callable | None = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """transformers' mask interface for the padless backend. A call that packed rows make (no padding
    mask, no cache: queries and keys the same tokens, no mask pattern of the model's own) gets no mask:
    :func:`padless_attention` separates the documents it is sent, with no dense ``L x L`` mask. Any
    other call (left padding, a cache, chunked attention, a model's own mask pattern) gets the mask
    transformers' sdpa backend builds, and the attention runs it as sdpa does (:func:`own_attention`)."""
    config = kwargs.get("config")
    plain = (
        attention_mask is None
        and q_length == kv_length
        and not torch.is_tensor(q_offset)
        and q_offset == 0
        and kv_offset == 0
        and not kwargs.get("use_vmap")
        and getattr(config, "attention_chunk_size", None) is None
    )
    if plain:
        return None
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    return sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function or causal_mask_function,
        attention_mask=attention_mask,
        **kwargs,
    )


def register_padless_attention(name: str = BACKEND_NAME) -> str:
    """Register :func:`padless_attention` and :func:`padless_mask` with transformers under ``name``
    (idempotent); then ``model.set_attn_implementation(name)`` or ``attn_implementation=name`` at load."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if not _UNTRACED:
        _UNTRACED.append(torch.compiler.disable(_attention, recursive=True))
    AttentionInterface.register(name, padless_attention)
    AttentionMaskInterface.register(name, padless_mask)
    return name
