"""Which fused attention kernels can run here, and whether a model's flash path hands them documents.

Two questions the exactness rule (:mod:`padless.attention.select`) and the varlen kernel choice
(:func:`padless.attention.varlen.choose_impl`) ask, answered in one place:

1. **Can this kernel run for this device, dtype and head size?** (:func:`kernel_refusal`). The limits,
   read from flash-attn 2.x (``flash_attn_interface.py``, its README) and torch 2.13's
   ``torch.nn.attention.varlen.varlen_attn`` (a wrapper over torch's own flash kernel):

   ==============  ===========  ===========  =====================================
   kernel          GPU          dtypes       head_dim
   ==============  ===========  ===========  =====================================
   flash_attn      sm80+        fp16, bf16   <= 256 (padded to a multiple of 8 inside)
   torch_varlen    sm80+        fp16, bf16   <= 256 and a multiple of 8
   ==============  ===========  ===========  =====================================

   A V100 (sm70) or T4 (sm75), a head of 320, or a tiny test model's head of 4 therefore falls back
   to the grouped SDPA kernel instead of crashing inside the fused one.

2. **Does the model's flash-attention code carry the document boundaries to the kernel?**
   (:func:`flash_boundaries`). transformers (``modeling_flash_attention_utils._flash_attention_forward``,
   :mod:`padless.attention.transformers_compat`) separates packed documents only when it receives
   ``cu_seq_lens_q/k`` with ``max_length_q/k``, or, from ``position_ids`` alone, when the batch holds
   one row (``_is_packed_sequence``). Models that declare ``_supports_attention_backend`` forward
   their ``**kwargs`` to the attention interface, so the collator's ``cu_seq_lens_q/k`` reach the
   kernel. A few older models (GPT-Neo, Falcon, Bark) call ``_flash_attention_forward`` themselves:
   what they pass is read from their source.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from typing import Any, Literal

import torch

from padless.attention.transformers_compat import FLASH_FORWARD, FLASH_POSITION_IDS_ARG
from padless.devices import dtype_name, is_half_precision

Kernel = Literal["flash_attn", "torch_varlen"]


@dataclass(frozen=True)
class KernelLimits:
    """What a fused varlen kernel needs beyond a CUDA device and fp16/bf16 inputs."""

    min_capability: tuple[int, int]
    """Lowest CUDA compute capability (``(8, 0)``: Ampere, sm80)."""
    max_head_dim: int
    """Largest head size."""
    head_dim_multiple: int
    """The head size must be a multiple of this (1: any)."""


LIMITS: dict[str, KernelLimits] = {
    "flash_attn": KernelLimits(min_capability=(8, 0), max_head_dim=256, head_dim_multiple=1),
    "torch_varlen": KernelLimits(min_capability=(8, 0), max_head_dim=256, head_dim_multiple=8),
}
"""Kernel name -> its limits (see the module docstring)."""


@functools.cache
def flash_attn_installed() -> bool:
    """Whether flash-attn imports *and* exposes ``flash_attn_varlen_func``. ``find_spec`` alone is not
    enough: a wheel built for another torch is found but fails to import (undefined symbols), and
    then the automatic choice must fall back to torch's kernels rather than raise. Cached: the
    answer does not change within a process (``flash_attn_installed.cache_clear()`` to re-check)."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        return False
    try:
        module = importlib.import_module("flash_attn")
    except Exception:  # noqa: BLE001 - ImportError, OSError, RuntimeError: all mean "not usable"
        return False
    return hasattr(module, "flash_attn_varlen_func")


def torch_varlen_installed() -> bool:
    """Whether this torch ships ``torch.nn.attention.varlen``."""
    import importlib.util

    try:
        return importlib.util.find_spec("torch.nn.attention.varlen") is not None
    except ModuleNotFoundError:
        return False


_INSTALLED = {"flash_attn": flash_attn_installed, "torch_varlen": torch_varlen_installed}
_NOT_INSTALLED = {
    "flash_attn": "the flash-attn package is not installed or fails to import",
    "torch_varlen": "this torch has no torch.nn.attention.varlen",
}


def cuda_capability(device: torch.device | str) -> tuple[int, int] | None:
    """The compute capability of CUDA ``device`` (``None``: no CUDA device is visible to ask)."""
    if not torch.cuda.is_available():
        return None
    device = torch.device(device)
    return tuple(torch.cuda.get_device_capability(device if device.index is not None else None))  # type: ignore[return-value]


def kernel_refusal(
    kernel: Kernel,
    device: torch.device | str,
    dtype: torch.dtype,
    head_dim: int | None = None,
    *,
    name: str | None = None,
) -> str | None:
    """Why ``kernel`` cannot run attention on ``device`` in ``dtype`` with heads of ``head_dim``
    (``None``: it can), naming it ``name`` (default: ``kernel``; the rule says ``flash_attention_2``).
    ``head_dim=None`` skips the head check; a CUDA device whose capability cannot be read here (no GPU
    visible to this process) is not held against the kernel, which checks again when it runs."""
    limits = LIMITS[kernel]
    name = name or kernel
    device = torch.device(device)
    if device.type != "cuda":
        return f"{name} runs on CUDA only, not {device.type}"
    if not is_half_precision(dtype):
        return f"{name} needs fp16 or bf16, not {dtype_name(dtype)}"
    if not _INSTALLED[kernel]():
        return _NOT_INSTALLED[kernel]
    capability = cuda_capability(device)
    if capability is not None and capability < limits.min_capability:
        need = "sm{}{}".format(*limits.min_capability)
        return f"{name} needs an {need}+ GPU (Ampere or newer); {device} is sm{capability[0]}{capability[1]}"
    if head_dim is not None:
        if head_dim > limits.max_head_dim:
            return f"{name} takes heads of at most {limits.max_head_dim}, not {head_dim}"
        if head_dim % limits.head_dim_multiple:
            return f"{name} takes heads of a multiple of {limits.head_dim_multiple}, not {head_dim}"
    return None


def head_dim_of(config: Any) -> int | None:
    """The attention head size of a transformers config (the larger of the query/key and value heads
    where they differ, as flash-attention pads values up to it), ``None`` when it cannot be read."""
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config

    def get(name: str) -> Any:
        try:
            return getattr(text, name, None)
        except Exception:  # noqa: BLE001 (Gemma 4's per-layer configs refuse a global head_dim)
            return None

    sizes = [v for v in (get("head_dim"), get("qk_head_dim"), get("v_head_dim")) if isinstance(v, int) and v > 0]
    if not sizes:
        hidden, heads = get("hidden_size"), get("num_attention_heads")
        if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
            sizes = [hidden // heads]
    return max(sizes) if sizes else None


FlashBoundaries = Literal["cu_seq_lens", "position_ids", "none", "undeclared"]
"""What a model's flash-attention code hands the kernel: ``cu_seq_lens`` (the collator's
``cu_seq_lens_q/k``: documents separated in any batch), ``position_ids`` only (transformers finds
documents in them for a batch of one row only), ``none``, or ``undeclared`` (the model reaches the
attention interface without declaring ``_supports_attention_backend``, so nothing promises that its
``**kwargs`` reach it)."""


def flash_boundaries(model_class: type) -> FlashBoundaries:
    """What ``model_class``'s flash-attention path passes to the kernel (see :data:`FlashBoundaries`):
    decided from its ``_supports_attention_backend`` flag, else from the arguments of its own calls
    of transformers' ``_flash_attention_forward`` (the weakest call decides)."""
    if getattr(model_class, "_supports_attention_backend", False):
        return "cu_seq_lens"
    passes = [_call_passes(call) for call in _flash_calls(model_class)]
    if not passes:
        return "undeclared"
    for kind in ("none", "position_ids"):
        if kind in passes:
            return kind  # type: ignore[return-value]
    return "cu_seq_lens"


def flash_boundary_refusal(model_class: type | None) -> str | None:
    """Why packed documents would attend to each other under ``model_class``'s flash-attention code
    (``None``: its code carries ``cu_seq_lens`` to the kernel, or no model class is known)."""
    if model_class is None:
        return None
    name = model_class.__name__
    kind = flash_boundaries(model_class)
    if kind == "none":
        return (
            f"{name}'s flash-attention layers pass neither cu_seq_lens nor position_ids to the kernel, "
            "so packed documents would attend to each other"
        )
    if kind == "position_ids":
        return (
            f"{name}'s flash-attention layers pass only position_ids to the kernel, and transformers finds "
            "packed documents in them only for a batch of one row"
        )
    if kind == "undeclared":
        return (
            f"{name} does not declare that it forwards attention kwargs (cu_seq_lens_q/k) to its attention "
            "layers (_supports_attention_backend)"
        )
    return None


def _flash_calls(model_class: type) -> list[ast.Call]:
    from padless.attention.rules import _module_source

    source = _module_source(model_class)
    if f"{FLASH_FORWARD}(" not in source:
        return []
    calls = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name == FLASH_FORWARD:
                calls.append(node)
    return calls


def _call_passes(call: ast.Call) -> str:
    """``cu_seq_lens`` when a call forwards ``**kwargs`` or ``cu_seq_lens_q``, else ``position_ids`` or ``none``."""
    names = {kw.arg for kw in call.keywords}
    if None in names or "cu_seq_lens_q" in names:
        return "cu_seq_lens"
    positional_ids = len(call.args) > FLASH_POSITION_IDS_ARG
    return "position_ids" if "position_ids" in names or positional_ids else "none"


_LAYER_ATTRIBUTES = ("self_attn", "attn", "attention", "self_attention", "mixer")
"""Attribute names decoder layers call their attention (or mixer, Nemotron-H) module by in transformers."""


def forwards_attention_kwargs(model_class: type | None) -> bool:
    """Whether ``model_class``'s module hands the keyword arguments a forward is sent (``cu_seq_lens_q/k``)
    on to attention: every call of the attention interface and every call of a layer's attention
    module in its source forwards ``**kwargs`` (a model whose class does not declare
    ``_supports_attention_backend``, read from the calls themselves). padless attention checks it at
    run time too: a forward sent boundaries whose attention receives none is refused."""
    if model_class is None:
        return False
    from padless.attention.rules import _module_source

    source = _module_source(model_class)
    if "attention_interface(" not in source:
        return False
    interface, layers = [], []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        star = any(kw.arg is None for kw in node.keywords)
        if isinstance(func, ast.Name) and func.id == "attention_interface":
            interface.append(star)
        elif (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
            and func.attr in _LAYER_ATTRIBUTES
        ):
            layers.append(star)
    return bool(interface) and bool(layers) and all(interface) and all(layers)
