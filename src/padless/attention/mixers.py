"""Token mixers that cannot see document boundaries, run on each packed document alone.

Hybrid and state-space models mix tokens in layers that take no attention mask: gated DeltaNet
(Qwen3.5, Qwen3-Next), Kimi delta attention, Mamba / Mamba2 mixers (Mamba, Bamba, Falcon-H1,
GraniteMoeHybrid, Jamba, Nemotron-H, Zamba2, ...), short convolutions (LFM2), lightning attention
(MiniMax), RG-LRU blocks (RecurrentGemma), RWKV time mixing and token shift, xLSTM. In transformers
(the version :mod:`padless.attention.transformers_compat` names) such a layer sees document boundaries
only inside CUDA kernels (``fla``, ``causal_conv1d``, ``mamba_ssm``) and only where the model passes them
on; its torch fallback runs its state along the whole packed row, so a document reads the previous one.

:func:`enable_per_document_mixers` patches each such layer in place: in a packed forward it runs the
layer's *original* forward on each document alone, documents of similar length batched and
right-padded (:mod:`padless.attention.per_document`); the cost follows the documents, as in padless
attention. These layers are causal, so trailing padding cannot change the tokens before it;
tests/attention/test_mixers.py checks packed == alone for every family, padding inside groups.

Where a forward's documents come from is :mod:`padless.attention.mixer_documents`: the boundaries
it was sent (``cu_seq_lens_q``, :func:`padless.attention.backend.packed_documents`; padless' collators
send them with every packed batch), or, for a peer's batch that carries ``[B, L]`` position ids
alone, their restarts. A forward sent no boundaries (a plain forward, ``generate``, padding, the
model's own 3-D positions) runs the layer's own code, unchanged; boundaries sent with a cache or
recurrent state are refused (the state would span documents).

The per-document torch path is the default on every device, CUDA included. Opt-in and
**unverified**: ``enable_per_document_mixers(model, kernels=True)`` on CUDA, where the kernel package
the model's code would use is installed and the model passes boundaries to it (``fla`` for gated
DeltaNet: ``cu_seqlens``; ``mamba_ssm`` + ``causal_conv1d`` for Mamba2 mixers: ``seq_idx``), flattens
the row to one ``[1, B * L, H]`` sequence and hands the boundaries to the kernel instead
(``how="kernel_cu_seqlens"``). That path follows the model code and no test runs it (the tests run
without those kernels); check it with :func:`padless.verify_isolation` before training with it.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from padless.attention import scans
from padless.attention.context_mixers import active_context, head_parallel_forward
from padless.attention.mixer_documents import _hook_checkpointed_layers, capture_model_forward, layer_documents
from padless.attention.per_document import CACHE_ARGS, MASK_ARGS, run_per_document, run_with_boundaries
from padless.attention.transformers_compat import TOKEN_MIXER_CLASSES
from padless.attention.varlen import _LastValue
from padless.devices import device_of

SCAN, PER_DOCUMENT, KERNEL = "scan", "per_document", "kernel_cu_seqlens"

_SCAN_FUNCTIONS: dict[str, tuple[str, ...]] = {
    # kind -> the functions of the layer's module its forward calls (transformers' torch fallbacks, or
    # the CUDA kernels where installed), replaced during a packed forward by padless.attention.scans
    "gated_deltanet": ("causal_conv1d_fn", "torch_chunk_gated_delta_rule"),
    "mamba2": ("causal_conv1d_fn", "mamba2_chunk_scan", "mamba2_split_conv1d_scan_combined"),
    "short_conv": ("causal_conv1d_fn",),
}
"""Kinds run by one chunked scan over the whole packed row (:mod:`padless.attention.scans`): the layer's
own forward runs, with the functions it calls by these names swapped for document-aware ones. A layer
whose module lacks one of them falls back to :data:`PER_DOCUMENT`."""

KINDS: dict[str, str] = TOKEN_MIXER_CLASSES
"""Layer classes known to mix tokens without the attention mask, by kind (transformers' class names,
:data:`padless.attention.transformers_compat.TOKEN_MIXER_CLASSES`). A layer is matched by its
class name, so a model's own subclass copies (transformers' "Copied from") are matched too."""

_KERNELS: dict[str, tuple[tuple[str, ...], str]] = {
    # kind -> (packages whose kernels take boundaries, the kwarg the model forwards to them)
    "gated_deltanet": (("fla", "causal_conv1d"), "cu_seqlens"),
    "mamba2": (("mamba_ssm", "causal_conv1d"), "seq_idx"),
    "short_conv": (("causal_conv1d",), "seq_idx"),
}
"""Kinds whose transformers code hands its ``**kwargs`` to CUDA kernels that separate documents."""

_SUSPECT_SUFFIXES = ("Mixer", "MambaLayer", "ShortConv", "DeltaNet", "DeltaAttention", "LightningAttention",
                     "RecurrentBlock", "Rglru", "Retention", "Hyena", "LSTMLayer")  # fmt: skip
"""Class-name endings of token mixers of kinds padless does not know (reported ``unknown``)."""
_MARK = "_padless_per_document"  # on a patched layer: (kind, max_padding, kernels)
_CLASSES: dict[type, type] = {}  # layer class -> its per-document subclass
_PATCHES = [0]
"""Bumped whenever :func:`enable_per_document_mixers` or :func:`disable_per_document_mixers` changes a
layer: the model facts cached by :func:`padless.attention.facts.model_facts` are read again after it."""
_SIGNATURES: dict[type, tuple[inspect.Signature, str, str | None]] = {}


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
    """How packed documents stay apart in it: ``scan`` (its own forward over the whole row, its
    convolution and scan given the boundaries as masks: :mod:`padless.attention.scans`), ``per_document``
    (run on each document alone, documents regrouped by length and right-padded), ``kernel_cu_seqlens``
    (a CUDA kernel given the boundaries), or ``unsupported: <reason>``."""


def _kind_of(module: Any) -> str | None:
    name = _base_class(module).__name__
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


def _how(kind: str, device_type: str, kernels: bool = False, module: Any = None) -> str:
    if kind == "unknown":
        return "unsupported: not a layer kind padless knows how to split by document"
    if kernels and device_type == "cuda" and kernels_available(kind):
        return KERNEL
    return SCAN if module is not None and _scannable(kind, module) else PER_DOCUMENT


def _scannable(kind: str, module: Any) -> bool:
    """The layer's module defines every function :data:`_SCAN_FUNCTIONS` swaps for its kind."""
    names = _SCAN_FUNCTIONS.get(kind)
    home = sys.modules.get(_base_class(module).__module__)
    return bool(names) and home is not None and all(callable(getattr(home, n, None)) for n in names)


def _device_type(model: Any) -> str:
    return torch.device(device_of(model)).type


def patches() -> int:
    """How many times mixer layers were patched or restored in this process (a cache key)."""
    return _PATCHES[0]


def mixer_layers(model: Any, modules: Any = None) -> list[MixerInfo]:
    """Every token-mixing layer of ``model`` that is not softmax attention (outermost matches only: the
    RG-LRU inside a RecurrentGemma block is part of that block), with how packed documents are kept
    apart in it on the model's current device. An object without modules (a bare config, a stand-in
    for a model) has no layers to list. ``modules``: ``model.named_modules()`` already listed (the
    model facts walk the tree once for every question)."""
    if not hasattr(model, "named_modules"):
        return []
    device_type = _device_type(model)
    found: list[MixerInfo] = []
    inside: list[str] = []
    for name, module in model.named_modules() if modules is None else modules:
        if any(name.startswith(p + ".") for p in inside):
            continue
        kind = _kind_of(module)
        if kind is None:
            continue
        inside.append(name)
        mark = getattr(module, _MARK, None)
        kernels = bool(mark[2]) if mark is not None else False
        found.append(MixerInfo(name=name, kind=kind, how=_how(kind, device_type, kernels, module)))
    return found


def enable_per_document_mixers(model: Any, *, max_padding: float = 0.25, kernels: bool = False) -> list[str]:
    """Patch every known token mixer of ``model`` (see :func:`mixer_layers`) in place so that a packed
    forward runs it on each document alone; return the names patched (idempotent: already-patched
    layers are named again, not patched twice). A forward with one document per row runs unchanged.
    ``max_padding``: documents share a padded group while padding stays at most this fraction of the
    group's real tokens (``0``: only documents of equal length share a group). ``kernels=True``
    (opt-in, unverified: never run): on CUDA, hand the boundaries to the installed ``fla`` /
    ``mamba_ssm`` kernels instead (see the module docstring); a second call may change both settings.
    Raises ``ValueError``
    naming any token mixer of unknown kind, before patching anything."""
    if max_padding < 0:
        raise ValueError(f"max_padding must be >= 0, got {max_padding}")
    layers = mixer_layers(model)
    unknown = [f"{m.name} ({type(model.get_submodule(m.name)).__name__})" for m in layers if m.kind == "unknown"]
    if unknown:
        raise ValueError(
            "these layers mix tokens in a way padless cannot split by document: "
            + ", ".join(unknown)
            + "; packed rows would leak across documents in them, so train this model with padded batches"
        )
    capture_model_forward(model)
    _hook_checkpointed_layers(model, [m.name for m in layers])
    names = []
    for info in layers:
        module = model.get_submodule(info.name)
        patched, mark = _per_document_class(_base_class(module)), (info.kind, max_padding, kernels)
        if module.__class__ is not patched or getattr(module, _MARK, None) != mark:
            _PATCHES[0] += 1  # a layer changed: facts read before are stale
        module.__class__ = patched
        setattr(module, _MARK, mark)
        names.append(info.name)
    return names


def mixer_refusal(model: Any, layers: list[MixerInfo] | None = None) -> str | None:
    """Why packed rows would not be exact in ``model``'s token mixers (``None``: it has none, or every
    one is patched by :func:`enable_per_document_mixers`): for the exactness rule to cite. ``layers``:
    :func:`mixer_layers` already found."""
    layers = mixer_layers(model) if layers is None else layers
    unknown = [m.name for m in layers if m.kind == "unknown"]
    if unknown:
        return f"layers {', '.join(unknown)} mix tokens in a way padless cannot split by document"
    unpatched = [m.name for m in layers if getattr(model.get_submodule(m.name), _MARK, None) is None]
    if unpatched:
        kinds = sorted({m.kind for m in layers if m.name in unpatched})
        return (
            f"{len(unpatched)} token-mixing layers ({', '.join(kinds)}) carry state along the whole row, "
            "across documents; call padless.attention.mixers.enable_per_document_mixers(model) first"
        )
    return None


def disable_per_document_mixers(model: Any) -> list[str]:
    """Undo :func:`enable_per_document_mixers`: the layers run their own forward again over the whole
    row (the hooks it added stay, inert); return the names restored."""
    _PATCHES[0] += 1
    names = []
    for name, module in model.named_modules():
        if getattr(module, _MARK, None) is not None:
            module.__class__ = _base_class(module)
            delattr(module, _MARK)
            names.append(name)
    return names


def _base_class(module: Any) -> type:
    return getattr(type(module), "_padless_base", type(module))


def _per_document_class(base: type) -> type:
    """``base`` with :func:`_per_document_forward` as its forward. A patched layer changes class rather
    than holding a closure over itself, so ``copy.deepcopy`` (a DPO reference model) copies a layer
    that runs its own weights; the class is named in this module, so pickling finds it."""
    name = f"PerDocument{base.__name__}"
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type(name, (base,), {"forward": _per_document_forward, "_padless_base": base, "__module__": __name__})
        _CLASSES[base] = globals()[name] = cls
    return cls


def _signature(base: type) -> tuple[inspect.Signature, str, str | None]:
    """The layer class's forward signature, the name of its hidden-states argument, its ``**`` name."""
    if base not in _SIGNATURES:
        signature = inspect.signature(base.forward)
        names = list(signature.parameters)[1:]  # after self
        var_keyword = next((n for n, p in signature.parameters.items() if p.kind is p.VAR_KEYWORD), None)
        _SIGNATURES[base] = (signature, names[0], var_keyword)
    return _SIGNATURES[base]


_BOUNDARY_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
"""What a packed batch sends its layers for their documents."""


def _per_document_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """A patched layer's forward: packed rows split by document (see the module docstring)."""
    base = type(self)._padless_base
    kind, max_padding, kernels = getattr(self, _MARK)
    signature, hidden_name, var_keyword = _signature(base)
    arguments = dict(signature.bind(self, *args, **kwargs).arguments)
    del arguments[next(iter(signature.parameters))]
    arguments.update(arguments.pop(var_keyword, None) or {})
    hidden = arguments[hidden_name]
    state = active_context()
    if state is not None:  # a context-parallel shard: documents from the whole rows' ids, never local positions
        _no_state(f"{base.__name__} in a context-parallel forward", _has_cache(arguments))
        names = _SCAN_FUNCTIONS[kind] if _scannable(kind, self) else ()
        run = functools.partial(base.forward, self, *args, **kwargs)
        return head_parallel_forward(run, self, kind, sys.modules[base.__module__], names, hidden, state)
    documents = layer_documents(hidden, arguments)
    cu = documents.cu_seqlens
    if cu is None and any(arguments.get(k) is not None for k in _BOUNDARY_KWARGS):
        # boundaries sent with one document per row: the layer's own code over each whole row, without the
        # boundary kwargs (its torch path refuses them where no CUDA kernel package is installed)
        return base.forward(self, **{k: v for k, v in arguments.items() if k not in _BOUNDARY_KWARGS})
    if cu is None or (not documents.explicit and (_padding_mask(arguments) or _has_cache(arguments))):
        # no packed documents: the layer's own code, unchanged (a plain forward, generate, padding)
        return base.forward(self, *args, **kwargs)
    if _has_cache(arguments):
        raise ValueError(
            f"{base.__name__} was sent packed document boundaries together with a cache or recurrent state, which "
            "would hold the state of several documents; call the model with use_cache=False (padless' collators "
            "send it)"
        )
    if _how(kind, hidden.device.type, kernels, self) == SCAN:
        batch, length = hidden.shape[:2]
        padding = documents.row_padding
        doc, real, doc_real = _SCAN_LAYOUTS.get(
            cu, (batch, length, id(padding), str(hidden.device)), lambda: _scan_layout(cu, padding, batch, length)
        )
        if real is not None and not _other_token_tensors(arguments, hidden_name):
            # the rows' real tokens only, as one sequence: row padding never enters the layer
            with _scans_for(base, kind, doc_real):
                out = base.forward(self, **{**arguments, hidden_name: hidden.reshape(batch * length, -1)[real][None]})
            if not torch.is_tensor(out):
                raise ValueError(
                    f"{base.__name__} returned {type(out).__name__}, not the one tensor its scan path reads"
                )
            return (
                out[0]
                .new_zeros(batch * length, *out.shape[2:])
                .index_copy(0, real, out[0])
                .reshape(batch, length, *out.shape[2:])
            )
        with _scans_for(base, kind, doc):
            return base.forward(self, *args, **kwargs)
    original = functools.partial(base.forward, self)
    if kernels and hidden.device.type == "cuda" and kernels_available(kind):  # opt-in, unverified
        cu_kwargs = _KERNELS[kind][1] == "cu_seqlens"
        return run_with_boundaries(original, arguments, hidden_name, cu, cu_kwargs=cu_kwargs)
    return run_per_document(original, arguments, hidden_name, cu, max_padding)


_SCAN_LAYOUTS = _LastValue()  # cu_seqlens -> the scans' document index and the real tokens, once per forward


def _scan_layout(cu: torch.Tensor, padding: Any, batch: int, length: int) -> tuple[Any, Any, Any]:
    """``(doc [B, L], real, doc_real [1, T])``: each token's document, and where the rows end in
    ``padding`` tokens (the collator sends how many: :data:`padless.layout.ROW_PADDING`) the flat indices
    of the real tokens and their documents (``None, None`` where no row is padded)."""
    doc = scans.document_index(cu, batch, length)
    if padding is None or padding.numel() != batch or not bool(padding.any()):
        return doc, None, None
    keep = torch.arange(length, device=doc.device)[None, :] < (length - padding.to(doc.device))[:, None]
    real = keep.reshape(-1).nonzero().squeeze(1)
    return doc, real, doc.reshape(-1)[real][None]


def _other_token_tensors(arguments: dict[str, Any], hidden_name: str) -> bool:
    """The layer gets another per-token ``[B, L, ...]`` argument, which a compacted call would have to cut
    too (then the padded rows run as they are)."""
    hidden = arguments[hidden_name]
    shape = tuple(hidden.shape[:2])
    return any(
        torch.is_tensor(v) and v.ndim >= 2 and tuple(v.shape[:2]) == shape
        for k, v in arguments.items()
        if k != hidden_name
    )


def _padding_mask(arguments: dict[str, Any]) -> bool:
    """A 2D padding mask with some padding reached the layer (transformers passes mixers ``None`` when
    there is no padding or the mask is 4D)."""
    mask = next((arguments[n] for n in MASK_ARGS if arguments.get(n) is not None), None)
    return mask is not None and mask.ndim == 2 and not bool(mask.all())


def _has_cache(arguments: dict[str, Any]) -> bool:
    return arguments.get("use_cache") is True or any(arguments.get(n) is not None for n in CACHE_ARGS)


@contextmanager
def _scans_for(base: type, kind: str, doc: torch.Tensor) -> Iterator[None]:
    """For the duration of one layer's forward, the functions its module calls for ``kind`` (see
    :data:`_SCAN_FUNCTIONS`) are padless' document-aware scans over ``doc`` ``[B, L]``; restored after,
    so any other forward of the family runs transformers' own."""
    home = sys.modules[base.__module__]
    replacements = {name: _SCANS[name](doc) for name in _SCAN_FUNCTIONS[kind]}
    saved = {name: getattr(home, name) for name in replacements}
    for name, function in replacements.items():
        setattr(home, name, function)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(home, name, function)


def _no_state(name: str, given: bool) -> None:
    if given:
        raise ValueError(f"{name} was handed a recurrent state or asked for one inside a packed row; use_cache=False")


def _conv_over(doc: torch.Tensor) -> Any:
    def causal_conv1d_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
        if hidden_states.shape[-1] != doc.shape[-1]:
            raise ValueError(
                f"a convolution over {hidden_states.shape[-1]} tokens inside a packed row of {doc.shape[-1]}"
            )
        return scans.causal_conv1d(hidden_states, weight, bias, activation, doc)

    return causal_conv1d_fn


def _delta_rule_over(doc: torch.Tensor) -> Any:
    def torch_chunk_gated_delta_rule(
        query,
        key,
        value,
        g,
        beta,
        chunk_size=64,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        **kwargs,
    ):
        _no_state("the gated delta rule", initial_state is not None or output_final_state)
        out = scans.chunk_gated_delta_rule(query, key, value, g, beta, doc, chunk_size, use_qk_l2norm_in_kernel)
        return out, None

    return torch_chunk_gated_delta_rule


def _ssd_over(doc: torch.Tensor) -> Any:
    def mamba2_chunk_scan(
        hidden_states,
        dt,
        A,
        B,
        C,
        chunk_size,
        D=None,
        dt_bias=None,
        initial_states=None,
        dt_softplus=False,
        dt_limit=(0.0, float("inf")),
        return_final_states=False,
        **kwargs,
    ):
        _no_state("Mamba2's scan", initial_states is not None or return_final_states)
        return scans.mamba2_chunk_scan(hidden_states, dt, A, B, C, chunk_size, doc, D, dt_bias, dt_softplus, dt_limit)

    return mamba2_chunk_scan


def _unfused(doc: torch.Tensor) -> Any:
    def mamba2_split_conv1d_scan_combined(*args, **kwargs):
        return None  # the fused kernel takes no document masks: the layer goes on to its convolution and scan

    return mamba2_split_conv1d_scan_combined


_SCANS = {
    "causal_conv1d_fn": _conv_over,
    "torch_chunk_gated_delta_rule": _delta_rule_over,
    "mamba2_chunk_scan": _ssd_over,
    "mamba2_split_conv1d_scan_combined": _unfused,
}
