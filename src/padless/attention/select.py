"""The one rule that says whether a packed batch is exact on a (model, backend, device, dtype).

Each transformers attention backend is described by a :class:`BackendSpec`: what a packed batch
must carry for it (:data:`AttentionInputs`) and why it would *not* isolate documents for a given
model, device and dtype. :func:`resolve_backend` returns a backend that is exact or raises an error
naming one that is; the collator's ``for_model``, ``verify`` and the bench all ask it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from padless.attention.varlen import flash_attn_available

if TYPE_CHECKING:
    import torch

AttentionInputs = Literal["mask4d", "varlen", "position_ids"]
"""What a packed batch carries so the attention backend isolates documents:
``mask4d`` a 4D additive block-causal float mask (SDPA, eager); ``varlen`` cumulative sequence
lengths ``cu_seq_lens_q/k`` and ``max_length_q/k`` (padless varlen, flash-attn); ``position_ids``
restarted position ids alone (flash-attn's own detection)."""
ATTENTION_INPUTS: tuple[str, ...] = ("mask4d", "varlen", "position_ids")


@dataclass(frozen=True)
class _Target:
    device: torch.device
    dtype: torch.dtype
    config: Any
    model_class: type | None
    max_length: int | None


@dataclass(frozen=True)
class BackendSpec:
    """How a transformers attention backend isolates packed documents."""

    inputs: AttentionInputs
    """What the collator must send: ``varlen`` (position_ids + cu_seq_lens_q/k, max_length_q/k, no
    attention_mask), ``mask4d`` (4D float additive block-causal mask + position_ids) or ``position_ids``."""
    refuse: Callable[[_Target], str | None]
    """Why the backend cannot guarantee isolation for a model, device and dtype (None: it can)."""


def _half(t: _Target) -> bool:
    from padless.models import is_half_precision

    return is_half_precision(t.dtype)


def _softcap(t: _Target) -> float | None:
    return getattr(t.config, "attn_logit_softcapping", None)


def _active_window(t: _Target) -> int | None:
    """The model's sliding window if some layer uses one and rows may be longer than it."""
    window = getattr(t.config, "sliding_window", None)
    if window is None or (t.max_length is not None and t.max_length <= window):
        return None
    layer_types = getattr(t.config, "layer_types", None)
    if layer_types is not None:
        return window if "sliding_attention" in layer_types else None
    return None if getattr(t.config, "use_sliding_window", True) is False else window


def _lacks(t: _Target, flag: str) -> bool:
    return t.model_class is not None and not getattr(t.model_class, flag, False)


def _refuse_padless(t: _Target) -> str | None:
    if _lacks(t, "_supports_attention_backend"):
        return f"{t.model_class.__name__} does not pass position_ids and attention kwargs to its attention layers"
    if getattr(t.config, "attention_chunk_size", None) is not None:
        return "the model uses chunked attention"
    if _softcap(t) is not None and not (t.device.type == "cuda" and _half(t) and flash_attn_available()):
        return "attention logit soft-capping needs flash-attn on CUDA with fp16/bf16"
    return None


def _refuse_mask4d(t: _Target, name: str, flag: str | None) -> str | None:
    if flag and _lacks(t, flag):
        return f"{t.model_class.__name__} does not support attn_implementation={name!r}"
    window = _active_window(t)
    if window is not None:
        return f"a 4D mask replaces the model's sliding window ({window} tokens) in every layer"
    if name == "sdpa" and _softcap(t) is not None:
        return "sdpa has no attention logit soft-capping"
    return None


def _refuse_flash2(t: _Target) -> str | None:
    if t.device.type != "cuda":
        return f"flash_attention_2 runs on CUDA only, not {t.device.type}"
    if not _half(t):
        return f"flash_attention_2 needs fp16 or bf16, not {t.dtype}"
    if not flash_attn_available():
        return "the flash-attn package is not installed"
    if _lacks(t, "_supports_flash_attn"):
        return f"{t.model_class.__name__} does not support flash_attention_2"
    return None


def _refuse_flex(t: _Target) -> str | None:
    if t.device.type == "cpu":
        return "FlexAttention has no backward on CPU in torch 2.13 and crashes the process with 4D masks"
    if _lacks(t, "_supports_flex_attn"):
        return f"{t.model_class.__name__} does not support flex_attention"
    if getattr(t.config, "use_cache", False):
        return "config.use_cache=True disables transformers' packed-row detection from position_ids"
    return None


BACKENDS: dict[str, BackendSpec] = {
    "padless": BackendSpec("varlen", _refuse_padless),
    "sdpa": BackendSpec("mask4d", lambda t: _refuse_mask4d(t, "sdpa", "_supports_sdpa")),
    "eager": BackendSpec("mask4d", lambda t: _refuse_mask4d(t, "eager", None)),
    # transformers 5.24 infers documents from position_ids only when the batch has one row
    # (_is_packed_sequence): with B > 1 it needs cu_seq_lens_q/k, so flash_attention_2 takes varlen.
    "flash_attention_2": BackendSpec("varlen", _refuse_flash2),
    "flex_attention": BackendSpec("position_ids", _refuse_flex),
}
"""Backend name -> what the collator sends for it and when it is refused."""

_PREFERENCE = ("padless", "flash_attention_2", "sdpa", "eager")
"""Fastest exact first: padless' cost follows the documents; the mask4d backends pay for L x L."""


def backend_inputs(backend: str) -> AttentionInputs:
    """What a packed batch must carry for ``backend`` (see :class:`BackendSpec`)."""
    spec = BACKENDS.get(backend)
    if spec is None:
        raise ValueError(
            f"attention backend {backend!r} has no known way to isolate packed documents; "
            f"use one of {', '.join(BACKENDS)}"
        )
    return spec.inputs


def _model_class(config: Any) -> type | None:
    if config is None:
        return None
    if hasattr(config, "config") and hasattr(config, "forward"):  # a model was given
        return type(config)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except (KeyError, ValueError):
        return None  # unknown to transformers: padless_attention still refuses at run time


def resolve_backend(
    requested: str | None = None,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    config: Any = None,
    max_length: int | None = None,
) -> str:
    """The attention backend to train packed rows with: ``requested`` if it can isolate documents for
    this model (``config``: a transformers config or model), device and dtype, else ``ValueError``
    naming one that can; with ``requested=None`` the fastest exact one. ``max_length`` (longest row)
    lets a mask4d backend serve a sliding-window model whose window covers the whole row. Registers
    the padless backend when it is returned, so the name can be used at once."""
    import torch

    config_obj = getattr(config, "config", config) if config is not None and hasattr(config, "forward") else config
    target = _Target(torch.device(device), dtype, config_obj, _model_class(config), max_length)
    if requested is not None:
        spec = BACKENDS.get(requested)
        if spec is None:
            raise ValueError(f"unknown attention backend {requested!r}; choose one of {', '.join(BACKENDS)}")
        reason = spec.refuse(target)
        if reason is not None:
            raise ValueError(
                f"attention backend {requested!r} cannot guarantee isolated packed documents here: {reason}; "
                f"use backend {_first_exact(target)!r}"
            )
        chosen = requested
    else:
        chosen = _first_exact(target)
    from padless.attention.backend import BACKEND_NAME, register_padless_attention

    if chosen == BACKEND_NAME:
        register_padless_attention()
    return chosen


def _first_exact(target: _Target) -> str:
    reasons = []
    for name in _PREFERENCE:
        reason = BACKENDS[name].refuse(target)
        if reason is None:
            return name
        reasons.append(f"{name}: {reason}")
    raise ValueError("no attention backend can isolate packed documents here (" + "; ".join(reasons) + ")")
