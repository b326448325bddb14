"""What padless relies on in transformers' internals, read from transformers 5.24.0 (``constraints.txt`` pins it).

Each name here is a function, attribute or model type of transformers that a padless module calls, sets,
matches by text or judges by, or a text padless looks for in a model's module source (the marks at the end). The modules that use them import them from here, and prose elsewhere that
describes transformers' behaviour points here. tests/attention/test_transformers_compat.py checks that
the installed transformers still has every name listed, and that :data:`VERSION` is the pinned one:
moving the pin means re-reading these facts in the new version's sources.

It lives in ``attention`` (not ``models``) because attention reads most of it, and models and integrations
may import attention but attention may import neither (tests/test_structure.py, ``MAY_IMPORT``). It
imports nothing, so importing it costs nothing. data/ and the floor (``padless.hub``) may not import it;
their prose points here.
"""

from __future__ import annotations

VERSION = "5.24.0"
"""The transformers release the facts below were read from: the ``transformers==`` pin of ``constraints.txt``."""
SERIES = VERSION.rsplit(".", 1)[0]
""":data:`VERSION` without its patch number (``"5.24"``), as refusal messages name it."""

FLASH_UTILS = "transformers.modeling_flash_attention_utils"
"""Module of the flash-attention glue every model's flash path goes through."""
FLASH_FORWARD = "_flash_attention_forward"
"""Function of :data:`FLASH_UTILS` a model's flash path calls: it separates packed documents only when it
gets ``cu_seq_lens_q/k`` with ``max_length_q/k``, or, from ``position_ids`` alone, when the batch holds one row."""
FLASH_POSITION_IDS_ARG = 7
"""Index of ``position_ids`` among :data:`FLASH_FORWARD`'s positional parameters."""
PACKED_SEQUENCE_CHECK = "_is_packed_sequence"
"""Function of :data:`FLASH_UTILS` that finds documents from ``position_ids`` alone, for a batch of one row only."""

MASKING_UTILS = "transformers.masking_utils"
"""Module of the mask builders that models with ``layer_types`` and most recent models call."""
MASK_BUILDERS = ("create_causal_mask", "create_sliding_window_causal_mask")
"""Mask builders of :data:`MASKING_UTILS`: each returns a 4D ``attention_mask`` as it is (it replaces the
model's window) and looks the backend name up in :data:`MASK_INTERFACE`."""
MASK_PASSTHROUGH = "_preprocess_mask_arguments"
"""Function of :data:`MASKING_UTILS` where a 4D mask passed in skips mask building."""
MASK_INTERFACE = "AttentionMaskInterface"
"""Registry of :data:`MASKING_UTILS`: backend name -> mask function. An unregistered name builds no mask and
drops a 2D padding mask silently, so padless registers its own."""
PACKED_FROM_POSITIONS = "find_packed_sequence_indices"
"""Function of :data:`MASKING_UTILS` that finds a packed row's documents from restarted ``position_ids`` (any
batch size, no 2D mask, no cache) when a model calls a mask builder with ``position_ids``."""

LOSS_UTILS = "transformers.loss.loss_utils"
"""Module of Trainer's loss table: ``LOSS_MAPPING`` (``loss_type`` -> function) and ``ForCausalLMLoss``, the
loss function that counts ``labels[..., 1:]``."""
LOSS_NAMES = ("LOSS_MAPPING", "ForCausalLMLoss")
"""Names of :data:`LOSS_UTILS` that decide whether Trainer shifts labels for a model."""

DISTRIBUTED_LOADING = "is_distributed_loading_by_transformers"
"""``PreTrainedModel`` property Trainer reads to leave a model that shards itself unmoved and unwrapped."""
ADAPTER_KWARGS = "adapter_kwargs"
"""``from_pretrained`` keyword for the adapter lookup, which asks the hub for ``adapter_config.json`` (25 s
of retries offline) unless it carries ``local_files_only=True`` too."""

NO_BOUNDARY_MODEL_TYPES = ("granitemoehybrid", "zamba", "recurrent_gemma")
"""Model types whose class declares ``_supports_attention_backend`` but whose decoder layers call attention
without ``position_ids`` or ``cu_seq_lens`` (tests/attention/test_mixers.py holds this)."""
OWN_MASK_MODEL_TYPES = ("doge",)
"""Model types whose attention layers add a 4D mask of their own making (Doge's dynamic mask) to the scores
(tests/attention/test_sweep.py holds this)."""

TOKEN_MIXER_CLASSES: dict[str, str] = {
    # class name -> layer kind
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
"""Layer classes of transformers that mix tokens without the attention mask, by kind (a class name of any
model's modeling file; :data:`padless.attention.mixers.KINDS` matches layers by it)."""

# Source-text marks: strings :func:`padless.attention.rules.attention_rules` looks for in a model's module
# source to learn how its mask path works. Renamed in a new release, a mark silently changes verdicts, so
# tests/attention/test_transformers_compat.py finds each one in the model modules that rely on it.
SLIDING_MASK_MARKS = ("sliding_window_causal_mask", "sliding_attention", "sliding_window_mask")
"""Source text of models whose mask path honours ``config.sliding_window`` (Mistral, Gemma 2, ...); a model
whose source has a window setting and none of these nor :data:`REMOTE_SLIDING_MASK_MARKS` (Moshi, OLMoE)
builds a plain causal mask on sdpa / eager, so its packed mask must not carry a window either."""
REMOTE_SLIDING_MASK_MARKS = ("_prepare_4d_causal_attention_mask_with_cache_position",)
"""The same, in modeling files written for transformers 4.x that a hub repository ships as remote code: no
model module of this release has it, so no test can hold it to this release."""
MASK_DICT_MARK = "causal_mask_mapping := attention_mask, dict"
"""Source text of base models that take a dict ``layer type -> 4D mask`` as ``attention_mask`` and use it as
it is (Gemma 3, Qwen2, ...: models with ``layer_types``)."""
SINK_MARK = "s_aux="
"""Source text of attention layers with learned sinks (GPT-OSS): an extra softmax column per head."""
OFFSET_POSITIONS_MARK = "create_position_ids_from_input_ids"
"""RoBERTa-family embeddings number positions from ``padding_idx + 1`` when they compute them."""
POSITION_MASK_MARK = r"(?s)(create_\w*mask\(|mask_function\(|mask_kwargs = \{)[^)}]*position_ids"
"""Regular expression (a string: this module imports nothing) for a mask builder called with
``position_ids`` (Llama, Llama 4): transformers then finds the documents of a packed row from restarted
position ids (:data:`PACKED_FROM_POSITIONS`, any batch size, no 2D mask, no cache) and builds per-document
masks with the model's own windows."""
MASK4D_MARKS = ("masking_utils",)
"""Source text of models whose mask path goes through :data:`MASKING_UTILS`, which passes a 4D mask through
as it is; a model with none of these, :data:`REMOTE_MASK4D_MARKS` and :data:`AUTO_DECODER_MARK` (OpenAI GPT,
XLM) expands a 2D mask itself."""
REMOTE_MASK4D_MARKS = ("_prepare_4d",)
"""The same for modeling files written for transformers 4.x (remote code), whose ``_prepare_4d_*`` mask
helpers (``modeling_attn_mask_utils``) pass a 4D mask through; this release has no such module."""
AUTO_DECODER_MARK = "AutoModel"
"""Source text of composite models that build their decoder with ``AutoModel`` (Fuyu): judged by that
decoder's rules, so a 4D mask is taken to pass through."""
DECODER_FLAG_MARK = "is_causal=config.is_decoder"
"""BERT-family layers are causal only with ``config.is_decoder=True``."""
