"""Token mixers that cannot see document boundaries, run on each packed document alone.

Hybrid and state-space models mix tokens in layers that take no attention mask: gated DeltaNet
(Qwen3.5, Qwen3-Next), Kimi delta attention, Mamba / Mamba2 mixers (Mamba, Bamba, Falcon-H1,
GraniteMoeHybrid, Jamba, Nemotron-H, Zamba2, ...), short convolutions (LFM2), lightning attention
(MiniMax), RG-LRU blocks (RecurrentGemma), RWKV time mixing and token shift, xLSTM. In transformers
5.24 such a layer sees document boundaries only inside CUDA kernels (``fla``, ``causal_conv1d``,
``mamba_ssm``) and only where the model passes them on; its torch fallback runs its state along the
whole packed row, so a document reads the one before it.

:func:`enable_per_document_mixers` patches each such layer in place: in a packed forward it splits the
row's hidden states ``[B, L, H]`` by document, groups documents of similar length, right-pads each
group into a ``[n_docs, P, H]`` batch, calls the layer's *original* forward on it with no cache and no
padding mask, and scatters the outputs back::

    row   | a a a b b c c c c |          group 1 (P = 4): | c c c c |   group 2 (P = 3): | a a a |
                                                                                        | b b . |

These layers are causal (token ``t`` reads tokens ``<= t``), so trailing padding cannot change the
outputs of the tokens before it; tests/attention/test_mixers.py checks packed == alone per family,
with padding inside a group. Where does the forward learn its documents? In order: ``cu_seq_lens_q``
among the layer's kwargs, the layer's own ``position_ids`` argument, a :func:`padless.packed_documents`
context, else the ``position_ids`` given to the model's forward (captured by a hook on each
transformers base model); a new document starts wherever a position is not its predecessor + 1. A
forward with one document per row runs the layer unchanged.

On CUDA, where the kernel package the model's code would use is installed and the model passes
boundaries to it (``fla`` for gated DeltaNet: ``cu_seqlens``; ``mamba_ssm`` + ``causal_conv1d`` for
Mamba2 mixers: ``seq_idx``), the row is flattened to one ``[1, B * L, H]`` sequence and the boundaries
are handed to the kernel instead (``how="kernel_cu_seqlens"``). Those kernels are not installed where
this module was written: that path is written from the model code and not exercised by the tests.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from padless.attention.backend import _CONTEXT, cu_seqlens_from_position_ids, sent_boundaries
from padless.attention.varlen import _LastValue

if TYPE_CHECKING:
    import torch

PER_DOCUMENT, KERNEL = "per_document", "kernel_cu_seqlens"

KINDS: dict[str, str] = {
    # transformers 5.24 class name -> layer kind
    "Qwen3_5GatedDeltaNet": "gated_deltanet",
    "Qwen3_5MoeGatedDeltaNet": "gated_deltanet",
    "Qwen3NextGatedDeltaNet": "gated_deltanet",
    "LaraMiniGatedDeltaNet": "gated_deltanet",
    "OlmoHybridGatedDeltaNet": "gated_deltanet",
    "Qwen4ExpTextGatedDeltaNet": "gated_deltanet",
    "KimiLinearDeltaAttention": "kimi_delta_attention",
    "BailingHybridDeltaAttention": "kimi_delta_attention",
    "Glm5NextTextLinearAttention": "kimi_delta_attention",
    "Lfm2ShortConv": "short_conv",
    "Lfm2MoeShortConv": "short_conv",
    "Lfm3ShortConv": "short_conv",
    "MambaMixer": "mamba",
    "FalconMambaMixer": "mamba",
    "JambaMambaMixer": "mamba",
    "ZambaMambaMixer": "mamba",
    "Mamba2Mixer": "mamba2",
    "BambaMixer": "mamba2",
    "FalconH1Mixer": "mamba2",
    "GraniteMoeHybridMambaLayer": "mamba2",
    "NemotronHMamba2Mixer": "mamba2",
    "Zamba2MambaMixer": "mamba2",
    "MiniMaxLightningAttention": "linear_attention",
    "RecurrentGemmaRecurrentBlock": "rg_lru",
    "RwkvSelfAttention": "rwkv",
    "RwkvFeedForward": "rwkv_token_shift",
    "xLSTMLayer": "xlstm",
}
"""Layer classes known to mix tokens without the attention mask, by kind. A layer is matched by its
class name, so a model's own subclass copies (transformers' "Copied from") are matched too."""

_KERNELS: dict[str, tuple[tuple[str, ...], str]] = {
    # kind -> (packages whose kernels take boundaries, the kwarg the model forwards to them)
    "gated_deltanet": (("fla", "causal_conv1d"), "cu_seqlens"),
    "mamba2": (("mamba_ssm", "causal_conv1d"), "seq_idx"),
}
"""Kinds whose transformers code hands its ``**kwargs`` to CUDA kernels that separate documents."""

_SUSPECT_SUFFIXES = ("Mixer", "MambaLayer", "ShortConv", "DeltaNet", "DeltaAttention", "LightningAttention",
                     "RecurrentBlock", "Rglru", "Retention", "Hyena", "LSTMLayer")  # fmt: skip
"""Class-name endings of token mixers of kinds padless does not know (reported ``unknown``)."""
_CACHE_ARGS = ("cache", "cache_params", "past_key_values", "past_key_value", "layer_past")
_STATE_ARGS = ("state",)
_MASK_ARGS = ("attention_mask", "mask")
_BOUNDARY_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx", "cu_seqlens")
_MARK = "_padless_per_document"

_MODEL_POSITIONS: ContextVar[tuple[Any, bool]] = ContextVar("padless_model_positions", default=(None, False))
"""The ``position_ids`` the model's forward was given, and whether it was given a 2D padding mask."""
_LAYER_DOCUMENTS: ContextVar[Any] = ContextVar("padless_layer_documents", default=None)
_FROM_POSITIONS = _LastValue()  # position_ids -> cu_seqlens, once per forward
_PLANS = _LastValue()  # cu_seqlens -> gather / scatter indices, once per forward


@dataclass(frozen=True)
class MixerInfo:
    """One token-mixing layer of a model that is not softmax attention."""

    name: str
    """The layer's module path in the model (``model.layers.0.linear_attn``)."""
    kind: str
    """What kind of layer it is: ``gated_deltanet``, ``kimi_delta_attention``, ``mamba``, ``mamba2``,
    ``short_conv``, ``linear_attention``, ``rg_lru``, ``rwkv``, ``rwkv_token_shift``, ``xlstm``, or
    ``unknown``."""
    how: str
    """How packed documents stay apart in it: ``per_document`` (run on each document alone),
    ``kernel_cu_seqlens`` (a CUDA kernel given the boundaries), or ``unsupported: <reason>``."""


def _kind_of(module: Any) -> str | None:
    import torch

    name = type(module).__name__
    if name in KINDS:
        return KINDS[name]
    if name.endswith(_SUSPECT_SUFFIXES):
        return "unknown"
    if isinstance(module, torch.nn.Conv1d) and module.padding != (0,) and module.padding != "valid":
        return "unknown"  # a causal convolution over the sequence, outside any known layer
    return None


def kernels_available(kind: str) -> bool:
    """Whether the CUDA kernel packages that separate documents inside a ``kind`` layer are installed."""
    spec = _KERNELS.get(kind)
    return spec is not None and all(importlib.util.find_spec(p) is not None for p in spec[0])


def _how(kind: str, device_type: str) -> str:
    if kind == "unknown":
        return "unsupported: not a layer kind padless knows how to split by document"
    if device_type == "cuda" and kernels_available(kind):
        return KERNEL
    return PER_DOCUMENT


def _device_type(model: Any) -> str:
    for p in model.parameters():
        return p.device.type
    return "cpu"


def mixer_layers(model: Any) -> list[MixerInfo]:
    """Every token-mixing layer of ``model`` that is not softmax attention (outermost matches only: the
    RG-LRU inside a RecurrentGemma block is part of that block), with how packed documents are kept
    apart in it on the model's current device."""
    device_type = _device_type(model)
    found: list[MixerInfo] = []
    inside: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(p + ".") for p in inside):
            continue
        kind = _kind_of(module)
        if kind is None:
            continue
        inside.append(name)
        found.append(MixerInfo(name=name, kind=kind, how=_how(kind, device_type)))
    return found


def enable_per_document_mixers(model: Any, *, max_padding: float = 0.25) -> list[str]:
    """Patch every known token mixer of ``model`` (see :func:`mixer_layers`) in place so that a packed
    forward runs it on each document alone; return the names patched (idempotent: already-patched
    layers are named again, not patched twice). A forward with one document per row runs unchanged.
    ``max_padding``: documents share a padded group while padding stays at most this fraction of the
    group's real tokens (``0``: only documents of equal length share a group). Raises ``ValueError``
    naming any token mixer of unknown kind, before patching anything."""
    if max_padding < 0:
        raise ValueError(f"max_padding must be >= 0, got {max_padding}")
    layers = mixer_layers(model)
    unknown = [f"{m.name} ({type(model.get_submodule(m.name)).__name__})" for m in layers if m.kind == "unknown"]
    if unknown:
        raise ValueError(
            "these layers mix tokens in a way padless cannot split by document: " + ", ".join(unknown)
            + "; packed rows would leak across documents in them, so train this model with padded batches"
        )  # fmt: skip
    _capture_model_positions(model)
    _hook_checkpointed_layers(model, [m.name for m in layers])
    names = []
    for info in layers:
        module = model.get_submodule(info.name)
        original = getattr(module, _MARK, None)
        if original is None:
            original = module.forward
            setattr(module, _MARK, original)
        module.forward = _per_document_forward(module, original, info.kind, max_padding)
        names.append(info.name)
    return names


def disable_per_document_mixers(model: Any) -> list[str]:
    """Undo :func:`enable_per_document_mixers` (the slow reference runs the layers unpatched); return
    the names restored."""
    names = []
    for name, module in model.named_modules():
        original = getattr(module, _MARK, None)
        if original is not None:
            module.forward = original
            delattr(module, _MARK)
            names.append(name)
    return names


# -- documents of a forward ------------------------------------------------------------------------


def _capture_model_positions(model: Any) -> None:
    """Hook every transformers base model inside ``model`` so that the ``position_ids`` its forward is
    given are visible to the mixers below it (the decoder layers do not pass them to the mixers)."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if not isinstance(module, PreTrainedModel) or getattr(module, "_padless_positions_hook", False):
            continue
        params = inspect.signature(module.forward).parameters
        if "position_ids" not in params:
            continue
        tokens: list[Any] = []
        names = list(params)

        def before(mod, args, kwargs, tokens=tokens, names=names):
            given = dict(zip(names, args)) | kwargs
            mask = given.get("attention_mask")
            padded = _is_tensor(mask) and mask.ndim == 2 and not bool(mask.all())
            tokens.append(_MODEL_POSITIONS.set((given.get("position_ids"), padded)))

        def after(mod, args, kwargs, output, tokens=tokens):
            if tokens:
                _MODEL_POSITIONS.reset(tokens.pop())

        module.register_forward_pre_hook(before, with_kwargs=True)
        module.register_forward_hook(after, with_kwargs=True, always_call=True)
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


@dataclass(frozen=True)
class Documents:
    """Where the documents of a layer's input lie, and how padless learned it."""

    cu_seqlens: torch.Tensor | None
    """``[N + 1]`` offsets over the flat ``B * L`` tokens; ``None``: one document per row."""
    explicit: bool
    """Sent as boundaries (``cu_seq_lens_q``, :func:`padless.packed_documents`), not inferred from
    ``position_ids`` restarts (which also happen under left padding)."""


def layer_documents(hidden: torch.Tensor, call: dict[str, Any]) -> Documents:
    """The documents of a layer's input ``hidden`` ``[B, L, ...]``; ``call``: the layer's arguments by
    name. Sources, first found wins: ``cu_seq_lens_q`` or ``position_ids`` among ``call``; the
    documents the enclosing decoder layer resolved (see :func:`_hook_checkpointed_layers`); a
    :func:`padless.packed_documents` context; the ``position_ids`` given to the model's forward. A new
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
    return Documents(None if cu is None else _checked(cu, hidden), explicit)


def _checked(cu: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor | None:
    batch, length = hidden.shape[:2]
    if cu.numel() - 1 == batch:  # one document per row (cu_seqlens starts every row)
        return None
    if int(cu[-1]) != batch * length:
        raise ValueError(f"document boundaries cover {int(cu[-1])} tokens but the layer got {batch} x {length}")
    return cu


def _hook_checkpointed_layers(model: Any, mixer_names: list[str]) -> None:
    """Gradient checkpointing re-runs a decoder layer's forward during backward, outside the model's
    forward and outside any :func:`padless.packed_documents` context: the mixers would then see no
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
        tokens: list[Any] = []

        def before(mod, args, kwargs, tokens=tokens):
            first = args[0] if args else kwargs.get("hidden_states")
            found = layer_documents(first, kwargs) if _is_tensor(first) and first.ndim >= 2 else Documents(None, False)
            tokens.append(_LAYER_DOCUMENTS.set(found))
            checkpoint = mod.__dict__.get("_gradient_checkpointing_func")
            if checkpoint is not None and not getattr(checkpoint, "_padless", False):
                mod._gradient_checkpointing_func = _checkpoint_with_documents(checkpoint)

        def after(mod, args, kwargs, output, tokens=tokens):
            if tokens:
                _LAYER_DOCUMENTS.reset(tokens.pop())

        layer.register_forward_pre_hook(before, with_kwargs=True)
        layer.register_forward_hook(after, with_kwargs=True, always_call=True)
        layer._padless_documents_hook = True


def _checkpoint_with_documents(checkpoint: Callable) -> Callable:
    def run_checkpointed(function: Callable, *args: Any, **kwargs: Any) -> Any:
        documents = _LAYER_DOCUMENTS.get()  # this forward's, for the recomputation in backward too

        def with_documents(*a: Any, **k: Any) -> Any:
            token = _LAYER_DOCUMENTS.set(documents)
            try:
                return function(*a, **k)
            finally:
                _LAYER_DOCUMENTS.reset(token)

        return checkpoint(with_documents, *args, **kwargs)

    run_checkpointed._padless = True
    return run_checkpointed


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


# -- grouping documents of similar length -----------------------------------------------------------


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
    import torch

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


# -- the patched forward ----------------------------------------------------------------------------


def _per_document_forward(module: Any, original: Callable, kind: str, max_padding: float) -> Callable:
    signature = inspect.signature(original)
    names = list(signature.parameters)
    hidden_name = names[0]

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        call = signature.bind(*args, **kwargs)
        arguments = dict(call.arguments)
        extra = arguments.pop(next((n for n, p in signature.parameters.items() if p.kind is p.VAR_KEYWORD), ""), {})
        arguments.update(extra)
        hidden = arguments[hidden_name]
        documents = layer_documents(hidden, arguments)
        cu = documents.cu_seqlens
        if cu is None or (not documents.explicit and _padding_mask(arguments)):
            # transformers' own rule: restarted position_ids mark packed documents only without a
            # padding mask (left-padded generation restarts them too)
            return original(*args, **kwargs)
        if _has_cache(arguments):
            raise ValueError(
                f"{type(module).__name__} got a packed row (documents restart inside it) together with a cache "
                "or recurrent state, which would hold the state of several documents; call the model with "
                "use_cache=False (padless' collators send it)"
            )
        if hidden.device.type == "cuda" and kernels_available(kind):
            return _kernel_call(original, arguments, hidden_name, kind, cu)
        return _split_call(original, arguments, hidden_name, cu, max_padding)

    return forward


def _padding_mask(arguments: dict[str, Any]) -> bool:
    """A 2D padding mask with some padding reached the layer (transformers passes mixers ``None`` when
    there is no padding or the mask is 4D)."""
    mask = next((arguments[n] for n in _MASK_ARGS if arguments.get(n) is not None), None)
    return mask is not None and mask.ndim == 2 and not bool(mask.all())


def _has_cache(arguments: dict[str, Any]) -> bool:
    return arguments.get("use_cache") is True or any(arguments.get(n) is not None for n in _CACHE_ARGS + _STATE_ARGS)


def _is_token_tensor(value: Any, batch: int, length: int) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.ndim >= 2 and tuple(value.shape[:2]) == (batch, length)


def _document_arguments(arguments: dict[str, Any], hidden_name: str) -> dict[str, Any]:
    """The arguments of one per-document call, before per-token tensors are regrouped: no cache, no
    state, no padding mask, no boundaries (each call holds whole documents only)."""
    out = {}
    for name, value in arguments.items():
        if name in _BOUNDARY_KWARGS:
            continue
        if name in _CACHE_ARGS or name in _STATE_ARGS or name in _MASK_ARGS:
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


def _split_call(original: Callable, arguments: dict[str, Any], hidden_name: str, cu: torch.Tensor,
                max_padding: float) -> Any:  # fmt: skip
    import torch

    hidden = arguments[hidden_name]
    batch, length = hidden.shape[:2]
    plan = _PLANS.get(cu, (max_padding, hidden.device), lambda: _plan(cu, max_padding, hidden.device))
    base = _document_arguments(arguments, hidden_name)
    outputs = []
    with _no_positions():  # nested mixers (none known) must not see the row's positions
        for group in plan:
            outputs.append(original(**{k: _regroup(v, group, batch, length) for k, v in base.items()}))
    flat = torch.cat([g.flat for g in plan])  # every token of the row exactly once

    def scatter(parts: list[Any], given: Any) -> Any:
        first = parts[0]
        if isinstance(first, torch.Tensor) and first.ndim >= 2 and first.shape[:2] == plan[0].valid.shape:
            values = torch.cat([p[g.valid] for p, g in zip(parts, plan, strict=True)])  # [T, ...]
            out = values.new_zeros(batch * length, *values.shape[1:]).index_copy(0, flat, values)
            return out.reshape(batch, length, *values.shape[1:])
        return given  # a state or cache: the caller's own, untouched (a packed row leaves no valid state)

    state = next((arguments.get(n) for n in _STATE_ARGS if n in arguments), None)
    if isinstance(outputs[0], tuple):
        return tuple(scatter([o[i] for o in outputs], state) for i in range(len(outputs[0])))
    return scatter(outputs, state)


def _kernel_call(original: Callable, arguments: dict[str, Any], hidden_name: str, kind: str, cu: torch.Tensor) -> Any:
    """The row flattened to one sequence ``[1, B * L, ...]`` with its boundaries handed to the CUDA
    kernels the model's code calls (written from transformers 5.24's code; not exercised here)."""
    import torch

    hidden = arguments[hidden_name]
    batch, length = hidden.shape[:2]
    call = {k: v for k, v in arguments.items() if k not in _BOUNDARY_KWARGS and k not in _MASK_ARGS}
    for name in _CACHE_ARGS:
        if call.get(name) is not None:
            call[name] = None
    call = {k: (v.reshape(1, batch * length, *v.shape[2:]) if _is_token_tensor(v, batch, length) else v)
            for k, v in call.items()}  # fmt: skip
    cu = cu.to(device=hidden.device, dtype=torch.int32)
    if _KERNELS[kind][1] == "cu_seqlens":
        call["cu_seq_lens_q"] = call["cu_seq_lens_k"] = cu
    lengths = cu[1:] - cu[:-1]
    seq_idx = torch.repeat_interleave(torch.arange(lengths.numel(), device=cu.device, dtype=torch.int32), lengths)
    call["seq_idx"] = seq_idx[None]  # [1, B * L]: the document of each token (causal_conv1d, mamba_ssm)
    out = original(**call)
    if isinstance(out, tuple):
        return tuple(o.reshape(batch, length, *o.shape[2:]) if isinstance(o, torch.Tensor) and o.shape[:2] == (1, batch * length)
                     else o for o in out)  # fmt: skip
    return out.reshape(batch, length, *out.shape[2:])
