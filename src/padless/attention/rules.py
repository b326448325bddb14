"""What a model's own attention computes, read from its config and class: the facts the exactness
rule (:func:`padless.attention.select.check_exact`) and the 4D mask builder need.

A packed row is exact only if every token sees what it would see with its document alone. That is
block-causal attention *intersected with the model's own rules*: a sliding window stays a window
inside a packed document. How transformers models declare their windows (in the version
:mod:`padless.attention.transformers_compat` names, read from
``models/{mistral,starcoder2,gemma2,gemma3,qwen2}/modeling_*.py``):

- ``config.layer_types`` (Gemma 2/3, Qwen2, Qwen3, Cohere2, ...): layer ``i`` is
  ``"sliding_attention"`` (window ``config.sliding_window``) or ``"full_attention"`` (no window). The
  base model builds ``causal_mask_mapping = {"full_attention": ..., "sliding_attention": ...}``
  unless the ``attention_mask`` passed in is already a dict, which it then uses as it is, by layer
  type. Qwen2 derives ``layer_types`` from ``use_sliding_window`` and ``max_window_layers`` (layers
  ``i >= max_window_layers`` slide).
- no ``layer_types`` (Mistral, Mixtral, Starcoder2, Phi-3, Qwen3-MoE): every layer uses
  ``config.sliding_window`` when it is set (Qwen configs set it to ``None`` without
  ``use_sliding_window``), and the model builds one mask for all layers.

A 4D tensor passed as ``attention_mask`` is returned as it is by ``create_causal_mask`` and
``create_sliding_window_causal_mask`` (``masking_utils._preprocess_mask_arguments``): it *replaces*
the model's window, so the packed mask must carry the window itself.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from dataclasses import dataclass
from typing import Any

from padless.attention.adapters import adapter_refusal, base_model_of
from padless.attention.transformers_compat import (
    AUTO_DECODER_MARK,
    DECODER_FLAG_MARK,
    MASK4D_MARKS,
    MASK_DICT_MARK,
    OFFSET_POSITIONS_MARK,
    POSITION_MASK_MARK,
    REMOTE_MASK4D_MARKS,
    REMOTE_SLIDING_MASK_MARKS,
    SINK_MARK,
    SLIDING_MASK_MARKS,
)
from padless.layout import MaskWindows  # noqa: F401 (re-exported: the row vocabulary lives in padless.layout)

FULL, SLIDING = "full_attention", "sliding_attention"
ATTENTION_LAYER_TYPES = (FULL, SLIDING)
"""Layer types whose attention is block-causal (optionally windowed) over the row."""
CHUNKED = "chunked_attention"
"""Llama 4's chunked layers (``attention_chunk_size``): attention, judged by :attr:`AttentionRules.chunk_size`."""
PER_TOKEN_LAYER_TYPES = ("mlp", "moe", "dense", "ffn")
"""Layer types that mix no tokens (hybrid patterns such as Nemotron-H list them beside attention)."""
_SLIDING_MASKS = (*SLIDING_MASK_MARKS, *REMOTE_SLIDING_MASK_MARKS)
"""A source with any of these honours ``sliding_window`` (this release's models and 4.x remote code)."""
_POSITION_MASK = re.compile(POSITION_MASK_MARK)
_MASK4D = (*MASK4D_MARKS, *REMOTE_MASK4D_MARKS, AUTO_DECODER_MARK)
"""A source with any of these passes a 4D mask through as it is."""


@dataclass(frozen=True)
class AttentionRules:
    """A model's own attention semantics, as far as packing is concerned."""

    windows: dict[str, int | None]
    """Attention layer type -> its sliding window in tokens (``None``: full causal). A model without
    ``layer_types`` has one entry."""
    per_layer_type: bool
    """The model picks a mask per layer type (``config.layer_types``)."""
    accepts_mask_dict: bool
    """The base model takes a dict ``layer type -> 4D mask`` as ``attention_mask`` (transformers models
    with ``layer_types``)."""
    other_layer_types: tuple[str, ...]
    """Layer types that are not block-causal attention (recurrent, linear, chunked, ...): their state
    runs along the whole row, across documents."""
    softcap: float | None
    """Attention logit soft-capping (``attn_logit_softcapping``)."""
    dropout: float
    """Attention dropout probability in training (``attention_dropout``)."""
    sinks: bool
    """Learned attention sinks (``s_aux``): an extra softmax column per head."""
    alibi: bool
    """An ALiBi bias (BLOOM, MPT, Falcon with ``alibi=True``): built from the row, not from
    restarted position ids."""
    bidirectional: bool
    """Some layers attend both ways (``use_bidirectional_attention``)."""
    chunk_size: int | None
    """Chunked attention (``attention_chunk_size``, Llama 4)."""
    takes_position_ids: bool | None
    """The model's ``forward`` accepts ``position_ids`` (``None``: model class unknown)."""
    offset_positions: bool = False
    """The model numbers positions from ``padding_idx + 1`` when it computes them itself (RoBERTa,
    CamemBERT, XLM-RoBERTa, Data2Vec-text, ...), so restarted position ids from 0 are not the positions
    a document has alone."""
    takes_4d_mask: bool = True
    """The model's mask path passes a 4D mask through as it is (``False``: it expands a 2D padding
    mask itself, so a 4D block mask breaks it)."""
    masks_from_position_ids: bool = False
    """The model passes ``position_ids`` to transformers' mask builders, so a batch of restarted
    ``position_ids`` alone (no ``attention_mask``, ``use_cache=False``) gets per-document masks on sdpa
    and eager, with the model's own sliding windows."""
    adapter: str | None = None
    """Why the PEFT adapter wrapping the model breaks packing (prompt learning), ``None`` when it does
    not or there is none (:func:`padless.attention.adapters.adapter_refusal`)."""

    def mask_windows(self, max_length: int | None) -> MaskWindows:
        """What a 4D mask must carry for rows whose documents hold at most ``max_length`` tokens
        (``None``: unbounded). A window at least as long as every document changes nothing and is
        dropped; layer types left with the same window share one mask (see :data:`MaskWindows`)."""
        active = {
            t: w if w is not None and (max_length is None or max_length > w) else None for t, w in self.windows.items()
        }
        distinct = set(active.values())
        if len(distinct) <= 1:
            return next(iter(distinct), None)
        return active

    def active_windows(self, max_length: int | None) -> list[int]:
        """The windows shorter than some document of rows of ``max_length`` tokens."""
        masks = self.mask_windows(max_length)
        values = masks.values() if isinstance(masks, dict) else [masks]
        return sorted({w for w in values if w is not None})


def model_class_of(model_or_config: Any) -> type | None:
    """The causal-LM class of a model (the class a PEFT adapter wraps: :func:`base_model_of`), or the class
    transformers maps a config to (``None``: unknown)."""
    if model_or_config is None:
        return None
    if hasattr(model_or_config, "config") and hasattr(model_or_config, "forward"):
        return _unsharded_class(type(base_model_of(model_or_config)))
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(model_or_config)]
    except (KeyError, ValueError):
        return None


def _unsharded_class(cls: type) -> type:
    """The model's own class under FSDP2: ``fully_shard`` swaps it for a subclass ``FSDP<Name>`` of
    ``(FSDPModule, <Name>)`` defined in torch, whose module source says nothing of the model."""
    fsdp = sys.modules.get("torch.distributed.fsdp")  # never imported here: if absent, nothing is sharded
    sharded = getattr(fsdp, "FSDPModule", None)
    if sharded is None or not issubclass(cls, sharded):
        return cls
    return next(base for base in cls.__mro__[1:] if not issubclass(base, sharded))


def config_of(model_or_config: Any) -> Any:
    """The config of a model (of the model a PEFT adapter wraps), or the config itself."""
    if hasattr(model_or_config, "config") and hasattr(model_or_config, "forward"):
        return base_model_of(model_or_config).config
    return model_or_config


def _text_config(config: Any) -> Any:
    """The config of the decoder that reads the tokens (a multimodal model's ``text_config``; the config
    itself otherwise): its windows, layer types and soft-capping are the ones that apply."""
    get_text = getattr(config, "get_text_config", None)
    if get_text is None:
        return config
    try:
        return get_text(decoder=True)
    except (TypeError, ValueError):
        return config


@dataclass(frozen=True)
class _SourceMarks:
    """What a model's module source says (the source-text marks of :mod:`padless.attention.transformers_compat`),
    read once per model class."""

    known: bool = False
    """The source could be read (``False``: every other field keeps its permissive default)."""
    sliding_mask: bool = True
    """The mask path honours ``sliding_window`` (``transformers_compat.SLIDING_MASK_MARKS``)."""
    mask_dict: bool = False
    """The base model takes a dict of 4D masks by layer type."""
    sinks: bool = False
    """Attention sinks (``s_aux``)."""
    decoder_flag: bool = False
    """Layers are causal only with ``config.is_decoder`` (BERT family)."""
    offset_positions: bool = False
    """Positions computed from ``padding_idx + 1`` (RoBERTa family)."""
    masks_from_position_ids: bool = False
    """Mask builders called with ``position_ids`` (``transformers_compat.POSITION_MASK_MARK``)."""
    takes_4d_mask: bool = True
    """A 4D mask passes through as it is (``transformers_compat.MASK4D_MARKS``)."""


@functools.cache
def _source_marks(model_class: type) -> _SourceMarks:
    source = _module_source(model_class)
    if not source:
        return _SourceMarks()
    return _SourceMarks(
        known=True,
        sliding_mask=any(mark in source for mark in _SLIDING_MASKS),
        mask_dict=MASK_DICT_MARK in source,
        sinks=SINK_MARK in source,
        decoder_flag=DECODER_FLAG_MARK in source,
        offset_positions=OFFSET_POSITIONS_MARK in source,
        masks_from_position_ids=bool(_POSITION_MASK.search(source)),
        takes_4d_mask=any(mark in source for mark in _MASK4D),
    )


@functools.cache
def _module_source(model_class: type) -> str:
    module = sys.modules.get(model_class.__module__)
    try:
        return inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):
        return ""


def _text_model_class(model_or_config: Any, text_config: Any) -> type | None:
    """The class of the language model inside a vision-language wrapper (``model.language_model``,
    e.g. ``MistralModel`` inside ``Mistral3ForConditionalGeneration``), whose module builds the
    attention masks (sliding windows included); for a config, the class transformers maps its text
    config to. ``None``: not a wrapper, or unknown."""
    if hasattr(model_or_config, "forward"):
        base = base_model_of(model_or_config)
        inner = getattr(base, "model", base)
        lm = getattr(inner, "language_model", None) or getattr(base, "language_model", None)
        return _unsharded_class(type(lm)) if lm is not None and hasattr(lm, "forward") else None
    if text_config is config_of(model_or_config):
        return None
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    try:
        return MODEL_MAPPING[type(text_config)]
    except (KeyError, ValueError):
        return None


def attention_rules(model_or_config: Any) -> AttentionRules:
    """Read :class:`AttentionRules` from a transformers model or config (see the module docstring)."""
    config = _text_config(config_of(model_or_config))
    model_class = model_class_of(model_or_config)
    get = lambda name, default=None: getattr(config, name, default)  # noqa: E731
    window = get("sliding_window")
    if get("use_sliding_window") is False:
        window = None
    layer_types = get("layer_types")
    if layer_types:
        types = list(dict.fromkeys(layer_types))
        windows = {t: (window if t == SLIDING else None) for t in types if t in ATTENTION_LAYER_TYPES}
        others = tuple(t for t in types if t not in (*ATTENTION_LAYER_TYPES, CHUNKED, *PER_TOKEN_LAYER_TYPES))
    else:
        windows, others = {SLIDING if window is not None else FULL: window}, ()
    marks = _source_marks(model_class) if model_class is not None else _SourceMarks()
    text_class = _text_model_class(model_or_config, config)
    if text_class is not None and model_class is not None and text_class.__module__ != model_class.__module__:
        marks = _source_marks(text_class)  # a vision-language wrapper: its language model builds the masks
    if marks.known and not marks.sliding_mask:
        windows = {t: None for t in windows}  # the model's own mask has no window (see SLIDING_MASK_MARKS)
    mpt_alibi = bool(getattr(get("attn_config"), "alibi", False)) if get("model_type") == "mpt" else False
    takes_position_ids = None
    if model_class is not None:
        takes_position_ids = "position_ids" in inspect.signature(model_class.forward).parameters
    return AttentionRules(
        windows=windows,
        per_layer_type=bool(layer_types),
        accepts_mask_dict=marks.mask_dict,
        other_layer_types=others,
        softcap=get("attn_logit_softcapping"),
        dropout=float(get("attention_dropout", 0.0) or 0.0),
        sinks=marks.sinks,
        alibi=bool(get("alibi", False)) or get("model_type") == "bloom" or mpt_alibi,
        bidirectional=bool(get("use_bidirectional_attention", False))
        or (marks.decoder_flag and get("is_decoder") is False),
        chunk_size=get("attention_chunk_size"),
        takes_position_ids=takes_position_ids,
        offset_positions=marks.offset_positions,
        masks_from_position_ids=marks.masks_from_position_ids,
        takes_4d_mask=marks.takes_4d_mask,
        adapter=adapter_refusal(model_or_config),
    )
