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

In a vision-language wrapper these are read from its language model, found by what it is
(:func:`text_model`: the submodule whose config is the text config, or that holds the text attention
layers), whatever attribute holds it: its config and its module's source marks, not the wrapper's. A
wrapper whose language model cannot be found while its text config names a window is refused.

A 4D tensor passed as ``attention_mask`` is returned as it is by ``create_causal_mask`` and
``create_sliding_window_causal_mask`` (``masking_utils._preprocess_mask_arguments``): it *replaces*
the model's window, so the packed mask must carry the window itself.
"""

from __future__ import annotations

import dataclasses
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
    MASK_BUILDERS,
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
    """Why no backend can pack the model, read before any attention rule: the PEFT adapter wrapping it
    breaks packing (prompt learning, :func:`padless.attention.adapters.adapter_refusal`), or the facts of
    a wrapper's language model cannot be read (none found while its text config names windows, or it runs
    another attention implementation than the wrapper says); ``None``: neither."""
    text_model: str | None = None
    """The class name of the language model whose config and module source the rules were read from
    (:func:`text_model`; for a bare config, the class its text config maps to); ``None``: the model's own."""

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


def text_model(model: Any) -> Any:
    """The module of a vision-language wrapper that builds the text attention mask and holds the decoder
    layers, found by what it is, whatever attribute holds it (``language_model``, ``text_model``, ...):

    1. the outermost ``PreTrainedModel`` submodule whose config *is* the text config;
    2. failing that, the outermost ``PreTrainedModel`` submodule whose config is of the text config's
       class, outside any vision tower (a submodule whose config is another sub-config of the model's);
    3. failing that, the innermost ``PreTrainedModel`` submodule holding every ``*Attention`` layer
       outside the vision towers, and no tower.

    The model itself where it is no wrapper (its text config is its config); ``None``: a wrapper whose
    language model none of these finds, or an object without modules."""
    base = base_model_of(model)
    config = getattr(base, "config", None)
    text = _text_config(config)
    if text is config or not hasattr(base, "named_modules"):
        return base if text is config else None
    from transformers import PreTrainedModel

    subs = [v for v in vars(config).values() if _is_config(v) and v is not text]
    sub_types = {type(v) for v in subs} - {type(text)}
    modules = [(n, m) for n, m in base.named_modules() if n]
    towers = [
        n
        for n, m in modules
        if (c := getattr(m, "config", None)) is not None and (any(c is v for v in subs) or type(c) in sub_types)
    ]
    outside = lambda name: not any(name == t or name.startswith(t + ".") for t in towers)  # noqa: E731
    models = [(n, m) for n, m in modules if isinstance(m, PreTrainedModel)]
    found = next((m for _, m in models if m.config is text), None)
    found = found or next((m for n, m in models if isinstance(m.config, type(text)) and outside(n)), None)
    if found is not None:
        return found
    layers = [n for n, m in modules if type(m).__name__.endswith("Attention") and outside(n)]
    holders = [(n, m) for n, m in models if layers and all(x.startswith(n + ".") for x in layers)]
    if not holders:
        return None
    name, holder = holders[-1]  # pre-order: the last holder is the innermost
    return None if any(t.startswith(name + ".") for t in towers) else holder  # a wrapper's own model: not found


def _is_config(value: Any) -> bool:
    return hasattr(value, "to_dict") and hasattr(value, "model_type") and not isinstance(value, type)


def _text_model_class(model_or_config: Any, text_config: Any) -> type | None:
    """For a bare config, the class transformers maps its text config to, whose module builds the
    attention masks (``None``: not a multimodal config, or unknown)."""
    if text_config is config_of(model_or_config):
        return None
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    try:
        return MODEL_MAPPING[type(text_config)]
    except (KeyError, ValueError):
        return None


def _wrapper_class(config: Any) -> type | None:
    """The image-text-to-text class transformers maps a bare config to (``None``: none)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING

    try:
        return MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING[type(config)]
    except (KeyError, ValueError):
        return None


def _builds_text_mask(model_class: type) -> bool:
    """The class's module calls transformers' mask builders itself (PaliGemma's wrapper builds the mask
    its language model gets), so the mask a batch carries reaches the language model through it."""
    source = _module_source(model_class)
    return any(f"{name}(" in source for name in MASK_BUILDERS)


def _text_facts(
    model_or_config: Any, config: Any, model_class: type | None
) -> tuple[Any, _SourceMarks, str | None, str | None]:
    """The text config the rules read, the source marks of the mask path the text tokens go through,
    the class name of the wrapper's language model read (``None``: the model's own) and why its facts
    cannot be read (``None``: they can)."""
    outer = _source_marks(model_class) if model_class is not None else _SourceMarks()
    if not hasattr(model_or_config, "forward"):  # a bare config: the class its text config maps to
        text_class = _text_model_class(model_or_config, config)
        wrapper = model_class or _wrapper_class(model_or_config)
        if text_class is None or (wrapper is not None and text_class.__module__ == wrapper.__module__):
            return config, outer, None, None
        inner = _source_marks(text_class)
        marks = _wrapped(_source_marks(wrapper), wrapper, inner) if wrapper is not None else inner
        return config, marks, text_class.__name__, None
    base = base_model_of(model_or_config)
    module = text_model(model_or_config)
    if module is base or (module is None and (config is config_of(model_or_config) or not _windowed(config))):
        return config, outer, None, None
    if module is None:
        return (
            config,
            outer,
            None,
            (
                f"padless found no language model in {type(base).__name__} (no submodule whose config is its text "
                f"config {type(config).__name__}, nor one holding its attention layers), so it cannot read which "
                "sliding windows or chunks its attention applies"
            ),
        )
    text_class = _unsharded_class(type(module))
    outer_impl = getattr(base.config, "_attn_implementation", None)
    inner_impl = getattr(module.config, "_attn_implementation", None)
    reason = None
    if outer_impl and inner_impl and outer_impl != inner_impl and not {outer_impl, inner_impl} <= MASK_BACKENDS:
        reason = (
            f"its language model {text_class.__name__} runs attention {inner_impl!r} while the model's config says "
            f"{outer_impl!r} (the wrapper did not switch it), so a batch built for one is wrong for the other; "
            "give both one attention implementation"
        )
    if model_class is None or text_class.__module__ == model_class.__module__:
        return module.config, outer, text_class.__name__, reason
    return module.config, _wrapped(outer, model_class, _source_marks(text_class)), text_class.__name__, reason


MASK_BACKENDS = frozenset({"sdpa", "eager"})
"""The backends whose packed batch is the 4D mask, taken as it is (``inputs == "mask4d"`` in
:data:`padless.attention.backend_table.BACKENDS`, which imports this module: the sweep test holds the two
equal). A wrapper judged on one whose language model runs the other gets the batch that language model
needs; any other pair of different implementations does not."""


def _wrapped(outer: _SourceMarks, model_class: type, inner: _SourceMarks) -> _SourceMarks:
    """The marks of a language model inside a wrapper of another module: its own, except where the
    wrapper builds the text mask itself, whose mask path the batch's mask goes through first."""
    if not (outer.known and _builds_text_mask(model_class)):
        return inner
    return dataclasses.replace(
        inner,
        sliding_mask=outer.sliding_mask,
        mask_dict=outer.mask_dict and inner.mask_dict,
        takes_4d_mask=outer.takes_4d_mask and inner.takes_4d_mask,
        masks_from_position_ids=outer.masks_from_position_ids,
    )


def _windowed(config: Any) -> bool:
    """The config names a sliding window, a chunk size or per-layer attention types."""
    return any(getattr(config, k, None) for k in ("sliding_window", "attention_chunk_size", "layer_types"))


def attention_rules(model_or_config: Any) -> AttentionRules:
    """Read :class:`AttentionRules` from a transformers model or config (see the module docstring)."""
    model_class = model_class_of(model_or_config)
    config, marks, text_name, unread = _text_facts(
        model_or_config, _text_config(config_of(model_or_config)), model_class
    )
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
        adapter=adapter_refusal(model_or_config) or unread,
        text_model=text_name,
    )
