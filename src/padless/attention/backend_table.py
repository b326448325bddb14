"""The backend table the exactness rule reads (:mod:`padless.attention.select`): per transformers
attention backend, what a packed batch must carry for it and why it would *not* isolate documents
for a given model, device and dtype.

Each backend is a :class:`BackendSpec` in :data:`BACKENDS`: its inputs
(:data:`padless.layout.AttentionInputs`) and a refusal that reads the question put to the rule
(:class:`_Case`: the model's facts, the backend, the row length and layout). The model's own limits,
the same on every backend, and the layouts stay with the rule (:func:`padless.attention.select.decide`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from padless.attention.facts import ModelFacts
from padless.attention.kernels import flash_boundary_refusal, forwards_attention_kwargs, kernel_refusal
from padless.attention.transformers_compat import NO_BOUNDARY_MODEL_TYPES, OWN_MASK_MODEL_TYPES
from padless.layout import AttentionInputs


@dataclass(frozen=True)
class _Case:
    """One question put to the rule: these model facts, with this backend, for rows of this length
    and layout. The refusals read the facts through it."""

    facts: ModelFacts
    backend: str
    max_length: int | None
    layout: str = "documents"

    rules = property(lambda self: self.facts.rules)
    config = property(lambda self: self.facts.config)
    model_class = property(lambda self: self.facts.model_class)
    device = property(lambda self: self.facts.device)
    dtype = property(lambda self: self.facts.dtype)
    head_dim = property(lambda self: self.facts.head_dim)
    attention_free = property(lambda self: self.facts.attention_free)


@dataclass(frozen=True)
class BackendSpec:
    """How a transformers attention backend isolates packed documents."""

    inputs: AttentionInputs
    """What the collator must send: ``varlen`` (position_ids + cu_seq_lens_q/k, max_length_q/k, no
    attention_mask), ``mask4d`` (4D float additive block-causal mask + position_ids) or ``position_ids``."""
    refuse: Callable[[_Case], str | None]
    """Why the backend cannot guarantee isolation for a model, device and dtype (None: it can)."""


def _lacks(t: _Case, flag: str) -> bool:
    return t.model_class is not None and not getattr(t.model_class, flag, False)


MIXER_LAYER_TYPES = ("linear_attention", "conv", "hybrid", "mamba", "attention")
"""``config.layer_types`` entries exact once every token mixer found in the model runs per document
(:func:`padless.attention.mixers.enable_per_document_mixers`): gated DeltaNet / Kimi delta / lightning attention / Mamba
mixers (``linear_attention``, ``mamba``), LFM2 short convolutions (``conv``), Falcon-H1 / Zamba's
parallel or shared blocks (``hybrid``) and GraniteMoeHybrid's name for softmax attention
(``attention``). Other non-attention types (``indexed_attention``, compressed attention) stay refused."""


_NO_BOUNDARIES = "decoder layers pass its attention no position_ids or document boundaries"
_OWN_MASK = "attention layers add a 4D mask of their own (a dynamic mask) that padless attention would drop"
_PADLESS_REFUSED: dict[str, str] = {
    **dict.fromkeys(NO_BOUNDARY_MODEL_TYPES, _NO_BOUNDARIES),
    **dict.fromkeys(OWN_MASK_MODEL_TYPES, _OWN_MASK),
}
"""Model types padless attention refuses although their class declares ``_supports_attention_backend``
(:mod:`padless.attention.transformers_compat` lists them), with why: decoder layers that call attention
without the ``position_ids`` / ``cu_seq_lens`` padless attention separates documents by
(tests/attention/test_mixers.py holds these), and attention layers that add a 4D mask of their own making
to the scores (Doge's dynamic mask), which padless attention, computing per document without a mask,
would drop (tests/attention/test_sweep.py holds this)."""


def _head_sizes(config: Any) -> tuple[int | None, int | None]:
    """(query/key head size, value head size) where a config declares them apart (MLA: Kimi-Linear,
    Bailing-hybrid, DeepSeek-V3), else ``(None, None)``."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    qk, v = getattr(text, "qk_head_dim", None), getattr(text, "v_head_dim", None)
    if isinstance(qk, int) and isinstance(v, int):
        return qk, v
    return None, None


def _flash_softcap_dropout(t: _Case) -> str | None:
    if t.rules.softcap is not None and t.rules.dropout > 0:
        return "flash-attn has no attention dropout together with logit soft-capping (attention_dropout > 0)"
    return None


def _refuse_padless(t: _Case) -> str | None:
    # a hybrid's collator sends cu_seq_lens_q/k for its mixers; where its module's code hands them on to
    # attention (read from its calls), padless attention gets them too (and refuses at run time if not)
    forwards = bool(t.facts.mixer_layers) and forwards_attention_kwargs(t.model_class)
    if _lacks(t, "_supports_attention_backend") and not forwards:
        return f"{t.model_class.__name__} does not pass position_ids and attention kwargs to its attention layers"
    model_type = getattr(
        t.config.get_text_config() if hasattr(t.config, "get_text_config") else t.config, "model_type", None
    )
    if model_type in _PADLESS_REFUSED:
        return f"{model_type} {_PADLESS_REFUSED[model_type]}"
    qk, v = _head_sizes(t.config)
    if qk is not None and v is not None and qk != v:
        return (
            f"padless attention needs value heads as large as query/key heads, and this model's are {v} and {qk} "
            "(v_head_dim != qk_head_dim)"
        )
    if t.rules.chunk_size is not None:
        return "the model uses chunked attention"
    if t.rules.sinks:
        return "padless attention has no attention sinks (s_aux)"
    if t.rules.softcap is not None:
        kernel = kernel_refusal("flash_attn", t.device, t.dtype, t.head_dim)
        if kernel is not None:
            return f"attention logit soft-capping needs flash-attn on CUDA with fp16/bf16, and here {kernel}"
        return _flash_softcap_dropout(t)
    return None


def _refuse_mask4d(t: _Case, name: str, flag: str | None) -> str | None:
    if flag and _lacks(t, flag):
        return f"{t.model_class.__name__} does not support attn_implementation={name!r}"
    if not t.rules.takes_4d_mask:
        owner = t.model_class.__name__ if t.model_class is not None else "this model"
        return f"{owner} expands a 2D padding mask itself and cannot take the 4D block mask"
    if t.rules.chunk_size is not None and not t.rules.masks_from_position_ids:
        return "a 4D mask replaces the model's chunked attention, and the model builds no mask from position_ids"
    windows = t.rules.mask_windows(t.max_length)
    if isinstance(windows, dict) and not t.rules.accepts_mask_dict:
        owner = t.model_class.__name__ if t.model_class is not None else "this model"
        return f"layers differ in sliding window ({windows}) and {owner} takes no 4D mask per layer type"
    mixer_types = [x for x in t.rules.other_layer_types if x in MIXER_LAYER_TYPES]
    if isinstance(windows, dict) and mixer_types:
        return (
            f"layers differ in sliding window ({windows}) and the per-layer-type 4D masks have none for the "
            f"token-mixer layers ({', '.join(map(repr, mixer_types))}), which the model looks up by layer type"
        )
    if name == "sdpa" and t.rules.softcap is not None:
        return "sdpa has no attention logit soft-capping"
    return None


def _refuse_flash2(t: _Case) -> str | None:
    kernel = kernel_refusal("flash_attn", t.device, t.dtype, t.head_dim, name="flash_attention_2")
    if kernel is not None:
        return kernel
    if _lacks(t, "_supports_flash_attn"):
        return f"{t.model_class.__name__} does not support flash_attention_2"
    return flash_boundary_refusal(t.model_class) or _flash_softcap_dropout(t)


def _refuse_flex(t: _Case) -> str | None:
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
    # transformers infers documents from position_ids only when the batch has one row
    # (_is_packed_sequence, padless.attention.transformers_compat): with B > 1 it needs cu_seq_lens_q/k,
    # so flash_attention_2 takes varlen.
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
