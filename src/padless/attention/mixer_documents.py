"""Where the documents of a packed forward lie, as seen from a token-mixing layer inside it.

One source: the boundaries the forward was **sent**. ``cu_seq_lens_q`` among the layer's own
arguments (transformers 5 decoder layers hand their ``**kwargs`` to the mixer), else the
``cu_seq_lens_q`` the enclosing model's forward was given (a hook on each transformers base model
holds them for the forward's duration, for decoder layers that do not pass them on) or a
:func:`padless.attention.backend.packed_documents` context. padless' collators send them with every
packed batch. Gradient checkpointing re-runs a decoder layer in backward, outside the model's
forward: the decoder layer resolves its documents once and its checkpoint function carries them.

A forward sent none runs the model's own code (:mod:`padless.attention.mixers`): a plain forward,
``generate`` with a cache, a left-padded batch, the model's own 3-D rotary positions. The one other
reading, kept for a peer's batch that carries restarted ``[B, L]`` text positions alone (TRL's
``padding_free``, transformers' ``DataCollatorWithFlattening``): the position ids given to the model,
without a padding mask or a cache, start a document wherever a position is not its predecessor + 1
(transformers' own packed-row rule for attention). :func:`inferred_forwards` counts those forwards,
for the trainers to say so.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from padless.attention.backend import _CONTEXT, _MODEL_FORWARD, _Forward, cu_seqlens_from_position_ids, sent_boundaries
from padless.attention.varlen import _LastValue
from padless.layout import ROW_PADDING

_LAYER_DOCUMENTS: ContextVar[Any] = ContextVar("padless_layer_documents", default=None)
"""The :class:`Documents` the enclosing decoder layer resolved (``None``: no enclosing layer)."""
_FROM_POSITIONS = _LastValue()  # position_ids -> cu_seqlens, once per forward
_CHECKED = _LastValue()  # cu_seqlens checked against the layer's tokens, once per forward
_INFERRED = [0]
_CACHE_KWARGS = ("past_key_values", "cache", "cache_params")


@dataclass(frozen=True)
class Documents:
    """Where the documents of a layer's input lie, and how padless learned it."""

    cu_seqlens: torch.Tensor | None
    """``[N + 1]`` offsets over the flat ``B * L`` tokens; ``None``: one document per row."""
    explicit: bool
    """Sent as boundaries (``cu_seq_lens_q``, :func:`padless.attention.backend.packed_documents`), not read
    from a peer's restarted ``position_ids``."""
    row_padding: Any = None
    """``[B]`` trailing padding tokens of each row, where the forward was sent them
    (:data:`padless.layout.ROW_PADDING`); carried with the documents into a checkpointed recomputation."""


def inferred_forwards() -> int:
    """How many layer calls in this process found their documents in a peer's restarted position ids
    (no boundaries sent): the trainers report it."""
    return _INFERRED[0]


def layer_documents(hidden: torch.Tensor, call: dict[str, Any]) -> Documents:
    """The documents of a layer's input ``hidden`` ``[B, L, ...]``; ``call``: the layer's arguments by
    name. The boundaries sent (see the module docstring), else a peer's ``[B, L]`` position ids given
    to the model without a padding mask or cache, else ``Documents(None, False)``: no packed documents,
    the layer runs its own code."""
    batch, length = hidden.shape[:2]
    cu = sent_boundaries(call)
    if cu is None:
        enclosing = _LAYER_DOCUMENTS.get()
        if enclosing is not None:
            return enclosing
        cu = _forward_boundaries(batch, length)
    if cu is not None:
        checked = _CHECKED.get(cu, (batch, length), lambda: _checked(cu, hidden))
        padding = _MODEL_FORWARD.get().row_padding
        enclosing = _LAYER_DOCUMENTS.get()
        if padding is None and enclosing is not None:  # a checkpointed recomputation, outside the forward
            padding = enclosing.row_padding
        return Documents(checked, True, padding)
    forward = _MODEL_FORWARD.get()
    pos = forward.position_ids
    if pos is None or forward.padded or forward.cached or pos.ndim != 2 or pos.shape[-1] != length:
        return Documents(None, False)  # a plain, padded, cached or multi-axis-position forward: its own code
    if pos.shape[0] not in (1, batch):
        return Documents(None, False)
    cu = _FROM_POSITIONS.get(pos, batch, lambda: cu_seqlens_from_position_ids(pos, batch))
    checked = _CHECKED.get(cu, (batch, length), lambda: _checked(cu, hidden))
    if checked is not None:
        _INFERRED[0] += 1
    return Documents(checked, False)


def _forward_boundaries(batch: int, length: int) -> torch.Tensor | None:
    """``cu_seqlens`` sent to the enclosing forward: a :func:`packed_documents` context, else the
    ``cu_seq_lens_q`` given to the model's forward."""
    context = _CONTEXT.get()
    if context is not None:
        pos, cu, _ = context
        if cu is not None:
            return cu
        if pos.ndim == 3:
            pos = pos[0]  # multi-axis rotary positions given to the context: the text axis first
        if pos.shape[-1] != length:
            raise ValueError(
                f"packed_documents positions cover {pos.shape[-1]} tokens but a token-mixing layer got {length}"
            )
        return _FROM_POSITIONS.get(pos, batch, lambda: cu_seqlens_from_position_ids(pos, batch))
    return _MODEL_FORWARD.get().cu_seqlens


def _checked(cu: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor | None:
    """``cu`` checked to cover the layer's ``B x L`` tokens; ``None`` when it holds one document per row."""
    batch, length = hidden.shape[:2]
    if int(cu[-1]) != batch * length or int(cu[0]) != 0:
        raise ValueError(
            f"document boundaries cover {int(cu[-1]) - int(cu[0])} tokens but the layer got {batch} x {length}"
        )
    if cu.numel() == batch + 1 and bool((cu[1:] - cu[:-1] == length).all()):
        return None
    row_starts = torch.arange(0, batch * length, length, device=cu.device)
    if not bool(torch.isin(row_starts, cu.to(row_starts.dtype)).all()):
        raise ValueError("a document runs across the end of a row; every row must start a document")
    return cu


def capture_model_forward(model: Any) -> None:
    """Hook every transformers base model inside ``model`` so that the boundaries (and position ids)
    its forward is given are visible to the mixers below it, whose decoder layers may not pass them on."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if not isinstance(module, PreTrainedModel) or getattr(module, "_padless_forward_hook", False):
            continue
        params = inspect.signature(module.forward).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) and not (
            {"position_ids", "cu_seq_lens_q"} & set(params)
        ):
            continue
        hook = _ModelForwardHook(list(params))
        module.register_forward_pre_hook(hook.before, with_kwargs=True)
        module.register_forward_hook(hook.after, with_kwargs=True, always_call=True)
        module._padless_forward_hook = True


@contextmanager
def _no_documents() -> Iterator[None]:
    """Inside: no forward's documents are visible (a per-document call of a layer holds whole documents)."""
    token, layer_token = _MODEL_FORWARD.set(_Forward()), _LAYER_DOCUMENTS.set(None)
    context_token = _CONTEXT.set(None)
    try:
        yield
    finally:
        _CONTEXT.reset(context_token)
        _LAYER_DOCUMENTS.reset(layer_token)
        _MODEL_FORWARD.reset(token)


def _hook_checkpointed_layers(model: Any, mixer_names: list[str]) -> None:
    """Gradient checkpointing re-runs a decoder layer's forward during backward, outside the model's
    forward and outside any :func:`padless.attention.backend.packed_documents` context: the mixers would then see no
    documents and recompute other values (wrong gradients, or a CheckpointError). So the decoder layer
    around each mixer (a transformers ``GradientCheckpointingLayer``) resolves the documents in a
    forward pre-hook, and its checkpoint function is wrapped so that the function it checkpoints runs,
    in forward and in recomputation alike, with the documents of the forward that called it."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    for name in mixer_names:
        parts = name.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            layer = model.get_submodule(".".join(parts[:cut]))
            if isinstance(layer, GradientCheckpointingLayer):
                break
        else:
            continue
        if getattr(layer, "_padless_documents_hook", False):
            continue
        hook = _LayerDocumentsHook()
        layer.register_forward_pre_hook(hook.before, with_kwargs=True)
        layer.register_forward_hook(hook.after, with_kwargs=True, always_call=True)
        layer._padless_documents_hook = True


class _ModelForwardHook:
    """Sets what a base model's forward was given for its duration: an inner model (a VLM's language
    model, MambaModel inside MambaForCausalLM) keeps what the outer one was given where it is given
    nothing itself. Hooks are small classes, not closures, so a patched model still pickles."""

    def __init__(self, names: list[str]) -> None:
        self.names = names  # the forward's parameter names, for positional arguments
        self.tokens: list[Any] = []

    def before(self, module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        padding = kwargs.pop(ROW_PADDING, None)  # padless' own key: no layer of the model sees it
        given = dict(zip(self.names, args, strict=False)) | kwargs
        outer = _MODEL_FORWARD.get()
        mask = given.get("attention_mask")
        padded = _is_tensor(mask) and mask.ndim == 2 and not bool(mask.all())
        cached = given.get("use_cache") is True or any(given.get(k) is not None for k in _CACHE_KWARGS)
        cu = given.get("cu_seq_lens_q")
        pos = given.get("position_ids")
        state = _Forward(
            cu_seqlens=cu if cu is not None else outer.cu_seqlens,
            position_ids=pos if pos is not None else outer.position_ids,
            padded=padded or outer.padded,
            cached=cached or outer.cached,
            row_padding=padding if padding is not None else outer.row_padding,
        )
        self.tokens.append(_MODEL_FORWARD.set(state))
        return (args, kwargs) if padding is not None else None

    def after(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if self.tokens:
            _MODEL_FORWARD.reset(self.tokens.pop())


class _LayerDocumentsHook:
    """Resolves a decoder layer's documents for its duration, and wraps its checkpoint function."""

    def __init__(self) -> None:
        self.tokens: list[Any] = []

    def before(self, module: Any, args: tuple, kwargs: dict) -> None:
        first = args[0] if args else kwargs.get("hidden_states")
        found = layer_documents(first, kwargs) if _is_tensor(first) and first.ndim >= 2 else Documents(None, False)
        self.tokens.append(_LAYER_DOCUMENTS.set(found))
        checkpoint = module.__dict__.get("_gradient_checkpointing_func")
        if checkpoint is not None and not isinstance(checkpoint, _CheckpointWithDocuments):
            module._gradient_checkpointing_func = _CheckpointWithDocuments(checkpoint)

    def after(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if self.tokens:
            _LAYER_DOCUMENTS.reset(self.tokens.pop())


class _CheckpointWithDocuments:
    """A checkpoint function whose checkpointed function runs, in forward and in recomputation alike,
    with the documents of the forward that called it."""

    def __init__(self, checkpoint: Callable) -> None:
        self.checkpoint = checkpoint

    def __call__(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        return self.checkpoint(_WithDocuments(function, _LAYER_DOCUMENTS.get()), *args, **kwargs)


class _WithDocuments:
    def __init__(self, function: Callable, documents: Any) -> None:
        self.function, self.documents = function, documents

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        token = _LAYER_DOCUMENTS.set(self.documents)
        try:
            return self.function(*args, **kwargs)
        finally:
            _LAYER_DOCUMENTS.reset(token)


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)
