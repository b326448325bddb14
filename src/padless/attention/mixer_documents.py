"""Where the documents of a packed forward lie, as seen from a token-mixing layer inside it.

Decoder layers do not pass ``position_ids`` to their mixers, gradient checkpointing re-runs a layer
in backward outside the model's forward, and left padding restarts position ids too: this module
answers "which documents does this layer's input hold?" in each of those cases, for
:mod:`padless.attention.mixers`. Sources, first found wins: ``cu_seq_lens_q`` or ``position_ids``
among the layer's own arguments; what the enclosing decoder layer resolved; a
:func:`padless.attention.backend.packed_documents` context; the ``position_ids`` given to the model's forward (captured
by a hook on each transformers base model).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from padless.attention.backend import _CONTEXT, cu_seqlens_from_position_ids, sent_boundaries
from padless.attention.varlen import _LastValue

_MODEL_POSITIONS: ContextVar[tuple[Any, bool]] = ContextVar("padless_model_positions", default=(None, False))
"""The ``position_ids`` the model's forward was given, and whether it was given a 2D padding mask."""
_LAYER_DOCUMENTS: ContextVar[Any] = ContextVar("padless_layer_documents", default=None)
"""The :class:`Documents` the enclosing decoder layer resolved (``None``: no enclosing layer)."""
_FROM_POSITIONS = _LastValue()  # position_ids -> cu_seqlens, once per forward
_CHECKED = _LastValue()  # cu_seqlens checked against the layer's tokens, once per forward


@dataclass(frozen=True)
class Documents:
    """Where the documents of a layer's input lie, and how padless learned it."""

    cu_seqlens: torch.Tensor | None
    """``[N + 1]`` offsets over the flat ``B * L`` tokens; ``None``: one document per row."""
    explicit: bool
    """Sent as boundaries (``cu_seq_lens_q``, :func:`padless.attention.backend.packed_documents`), not inferred from
    ``position_ids`` restarts (which also happen under left padding)."""


def layer_documents(hidden: torch.Tensor, call: dict[str, Any]) -> Documents:
    """The documents of a layer's input ``hidden`` ``[B, L, ...]``; ``call``: the layer's arguments by
    name. Sources, first found wins: ``cu_seq_lens_q`` or ``position_ids`` among ``call``; the
    documents the enclosing decoder layer resolved (see :func:`_hook_checkpointed_layers`); a
    :func:`padless.attention.backend.packed_documents` context; the ``position_ids`` given to the model's forward. A new
    document starts wherever a position is not its predecessor + 1, unless a 2D padding mask was given
    (transformers' rule: position_ids mark packed documents only without a mask)."""
    cu = sent_boundaries(call) if "cu_seq_lens_q" in call else None
    explicit = cu is not None
    pos = call.get("position_ids")
    if cu is None and pos is None:
        enclosing = _LAYER_DOCUMENTS.get()
        if enclosing is not None:
            return enclosing
        context = _CONTEXT.get()
        if context is not None:
            pos, cu, _ = context
            explicit = True
        else:
            pos = _MODEL_POSITIONS.get()[0]
    batch, length = hidden.shape[:2]
    if cu is None and pos is not None:
        pos = _text_positions(pos)
        if pos.shape[-1] != length:
            raise ValueError(
                f"position_ids cover {pos.shape[-1]} tokens but a token-mixing layer got {length}; "
                "packed documents cannot be told apart (a chunked or cached forward of a packed row)"
            )
        if not explicit and _MODEL_POSITIONS.get()[1]:
            return Documents(None, False)  # the model got a padding mask: restarts are padding, not packing
        cu = _FROM_POSITIONS.get(pos, batch, lambda: cu_seqlens_from_position_ids(pos, batch))
    if cu is None:
        return Documents(None, explicit)
    return Documents(_CHECKED.get(cu, (batch, length), lambda: _checked(cu, hidden)), explicit)


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


def _capture_model_positions(model: Any) -> None:
    """Hook every transformers base model inside ``model`` so that the ``position_ids`` its forward is
    given are visible to the mixers below it (the decoder layers do not pass them to the mixers)."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if not isinstance(module, PreTrainedModel) or getattr(module, "_padless_positions_hook", False):
            continue
        params = inspect.signature(module.forward).parameters
        declared = "position_ids" in params
        if not declared and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            continue
        hook = _ModelPositionsHook(list(params), declared)
        module.register_forward_pre_hook(hook.before, with_kwargs=True)
        module.register_forward_hook(hook.after, with_kwargs=True, always_call=True)
        module._padless_positions_hook = True


@contextmanager
def _no_positions() -> Iterator[None]:
    token, layer_token = _MODEL_POSITIONS.set((None, False)), _LAYER_DOCUMENTS.set(None)
    try:
        yield
    finally:
        _LAYER_DOCUMENTS.reset(layer_token)
        _MODEL_POSITIONS.reset(token)


def _text_positions(pos: torch.Tensor) -> torch.Tensor:
    # multi-axis rotary positions ([3 or 4, B, L], Qwen3.5 text): the first axis runs along the text
    return pos[0] if pos.ndim == 3 else pos


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


class _ModelPositionsHook:
    """Sets what a base model's forward was given (position ids, a padding mask?) for its duration.
    Hooks are small classes, not closures, so a patched model still pickles."""

    def __init__(self, names: list[str], declared: bool = True) -> None:
        self.names = names  # the forward's parameter names, for positional arguments
        self.declared = declared
        """The forward names ``position_ids``; ``False``: it takes them through ``**kwargs`` (Mamba,
        RWKV, xLSTM), and a call without them leaves what an enclosing model was given."""
        self.tokens: list[Any] = []

    def before(self, module: Any, args: tuple, kwargs: dict) -> None:
        given = dict(zip(self.names, args, strict=False)) | kwargs
        if not self.declared and "position_ids" not in given:
            self.tokens.append(None)  # e.g. MambaModel inside MambaForCausalLM, which keeps the kwarg
            return
        mask = given.get("attention_mask")
        padded = _is_tensor(mask) and mask.ndim == 2 and not bool(mask.all())
        self.tokens.append(_MODEL_POSITIONS.set((given.get("position_ids"), padded)))

    def after(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if self.tokens:
            token = self.tokens.pop()
            if token is not None:
                _MODEL_POSITIONS.reset(token)


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
