"""What padless relies on in transformers' internals, read from transformers 5.24.0 (``constraints.txt`` pins it).

Each name here is a function, attribute or model type of transformers that a padless module calls, sets,
matches by text or judges by. The modules that use them import them from here, and prose elsewhere that
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
