"""How a vision-language model reads the images of a packed row: :class:`VisionScheme`.

A packed row of image-text documents is exact when every text position computes what it computes
with its document alone. Three things decide that beyond the text rule
(:mod:`padless.attention.select`), and they differ by model family:

- **where the image features go**: every family here scatters the vision encoder's outputs into the
  image placeholder tokens of the whole batch in order (``masked_scatter``), so the vision tensors of
  a batch are concatenated in the order of its image tokens (row by row, document by document), and
  the encoder sees each image alone (per-image batch entries, or Qwen-VL's per-image ``cu_seqlens``
  from ``image_grid_thw``);
- **positions**: 1-D positions restarting per document, or Qwen-VL's 3-D rope index (temporal,
  height, width), which the model computes per sequence with ``get_rope_index``; padless calls that
  same method on each document alone and places the result in the row (rope deltas belong to
  generation and are never carried);
- **image attention**: some families let image tokens attend to each other both ways (Gemma 3 within
  each image, PaliGemma over the prompt prefix): the 4D mask then carries those blocks, inside each
  document only, and a backend without a 4D mask cannot.

:func:`vision_scheme` reads the scheme of a model from :data:`FAMILIES`, the families the multimodal
sweep (``tests/multimodal``) proves exact; a vision-language model of any other family is refused for
images, with the reason, while its text-only rows are still judged by the text rule.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from padless.attention.adapters import base_model_of
from padless.attention.rules import config_of

Positions = Literal["text", "rope3d"]
Blocks = Literal["image_runs", "prefix"] | None

IMAGE_KEYS: tuple[str, ...] = (
    "pixel_values",
    "pixel_values_videos",
    "image_embeds",
    "image_grid_thw",
    "video_grid_thw",
)
"""Keys that mean a feature carries images (or videos)."""

PER_TOKEN_KEYS: tuple[str, ...] = ("mm_token_type_ids", "token_type_ids")
"""Vision keys with one value per token: placed in the row like ``input_ids`` (0 on padding)."""


@dataclass(frozen=True)
class VisionScheme:
    """How one model family reads images; what the packing collator needs to carry them exactly."""

    family: str
    """The model type (``config.model_type``)."""
    positions: Positions
    """``text``: 1-D positions restarting per document; ``rope3d``: Qwen-VL's 3-D rope index per document,
    sent as ``position_ids`` ``[4, R, L]`` (the text positions first, as transformers takes them for
    packed rows, then the three rope axes)."""
    blocks: Blocks = None
    """Bidirectional attention among image tokens: ``image_runs`` within each run of tokens whose
    ``token_type_ids`` are 1 (Gemma 3), ``prefix`` over the tokens whose ``token_type_ids`` are 0
    (PaliGemma's prompt prefix); ``None``: causal everywhere."""
    image_keys: tuple[str, ...] = ("pixel_values",)
    """Keys the model's forward reads per image, concatenated along :attr:`image_dim` in row order."""
    image_dim: int = 0
    """0: image-major tensors (``[images or patches, ...]``); 1: per-sample tensors
    ``[1, images, ...]`` (Idefics3, SmolVLM), concatenated along the image axis."""
    token_keys: tuple[str, ...] = ()
    """Per-token keys the forward needs (:data:`PER_TOKEN_KEYS`)."""
    needs_mask4d: str | None = None
    """Why this family's images run only on a backend that takes a 4D mask (``None``: any exact backend)."""
    image_token_id: int | None = None
    """The image placeholder token."""
    tokens_per_image: int | None = None
    """Placeholder tokens per image where the family fixes it (``None``: from ``image_grid_thw``, or unknown)."""
    video_token_id: int | None = None
    """The video placeholder token as the model reads it: GLM-4V's video frames hold the image token
    (``mm_token_type_ids`` 2 tells them apart), so one forward holds images or videos, not both."""
    merge: int = 1
    """Qwen-VL's spatial merge: an image of grid ``t x h x w`` patches takes ``t*h*w // merge**2`` tokens."""
    rope_owner: type | None = None
    """The class whose ``get_rope_index`` the model calls (``rope3d``)."""
    rope_config: Any = None
    """The config that method reads (``rope3d``)."""

    def rope_index(self, ids: np.ndarray, types_: np.ndarray, images: Any, videos: Any, extra: dict) -> np.ndarray:
        """``[3, n]`` positions of one document alone, as the model computes them (``rope3d``)."""
        owner = types.SimpleNamespace(config=self.rope_config)
        owner.get_vision_position_ids = functools.partial(self.rope_owner.get_vision_position_ids, owner)
        position_ids, _deltas = self.rope_owner.get_rope_index(
            owner,
            input_ids=torch.as_tensor(ids, dtype=torch.long)[None],
            mm_token_type_ids=torch.as_tensor(types_, dtype=torch.int32)[None],
            image_grid_thw=images,
            video_grid_thw=videos,
            attention_mask=None,
            **extra,
        )
        return position_ids[:, 0].numpy()


_QWEN = dict(positions="rope3d", image_keys=("pixel_values", "image_grid_thw"), token_keys=("mm_token_type_ids",))
_ANYRES = dict(positions="text", image_keys=("pixel_values", "image_sizes"))
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen2_vl": _QWEN,
    "qwen2_5_vl": _QWEN,
    "qwen3_vl": _QWEN,
    "qwen3_5": _QWEN,  # hybrid: its gated DeltaNet layers run per document (padless.attention.mixers)
    "gemma3": dict(positions="text", blocks="image_runs", token_keys=("token_type_ids",)),
    "llava": dict(positions="text"),
    "smolvlm": dict(positions="text", image_keys=("pixel_values", "pixel_attention_mask"), image_dim=1),
    "idefics3": dict(positions="text", image_keys=("pixel_values", "pixel_attention_mask"), image_dim=1),
    "idefics2": dict(
        positions="text",
        image_keys=("pixel_values", "pixel_attention_mask"),
        image_dim=1,
        needs_mask4d="its perceiver resampler cross-attends its latents to the image features through the model's "
        "attention implementation, which padless varlen attention (self-attention over packed documents) does not run",
    ),
    "llava_next": _ANYRES,
    "llava_next_video": _ANYRES,  # images as LLaVA-NeXT; its videos are not swept
    "mistral3": _ANYRES,  # image_sizes: each image's own size inside its padded pixel_values
    "internvl": dict(positions="text"),
    "aya_vision": dict(positions="text"),  # Cohere2's sliding layers: windows read from its language model
    "glm4v": {**_QWEN, "videos_at_image_token": True},  # its frames hold the image token, typed 2
}
"""Model type -> the scheme's fields: the families whose packed image-text rows the multimodal sweep
proves equal to each document alone (logits and gradients)."""


def is_vision_model(model_or_config: Any) -> bool:
    """The model (or config) reads images: a ``vision_config``, a forward that takes ``pixel_values``, or a
    config transformers maps to an image-text-to-text class (Fuyu, Chameleon and others without a
    separate vision config)."""
    import inspect

    config = config_of(model_or_config)
    if getattr(config, "vision_config", None) is not None:
        return True
    if hasattr(model_or_config, "forward"):
        return "pixel_values" in inspect.signature(base_model_of(model_or_config).forward).parameters
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING

    try:
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING[type(config)]  # a lazy mapping: `in` misses some of its entries
    except (KeyError, ValueError, TypeError):
        return False
    return True


def image_inputs(inputs: Mapping[str, Any]) -> list[str]:
    """The keys of a feature or batch that carry images or videos (:data:`IMAGE_KEYS` set to a value)."""
    return [k for k in IMAGE_KEYS if inputs.get(k) is not None]


def vision_scheme(
    model_or_config: Any, modules: Sequence[tuple[str, Any]] | None = None
) -> tuple[VisionScheme | None, str | None]:
    """``(scheme, None)`` where padless packs this model's images exactly, else ``(None, why not)``;
    ``(None, None)`` for a model without a vision tower (text only: nothing to say). ``modules``: the
    model's ``named_modules()`` where the caller listed them already (:func:`padless.attention.facts.model_facts`)."""
    if model_or_config is None or not is_vision_model(model_or_config):
        return None, None
    config = config_of(model_or_config)
    family = getattr(config, "model_type", None)
    fields = FAMILIES.get(family)
    if fields is None:
        return None, (
            f"padless has not verified how {family!r} places images in packed rows (its positions and image "
            f"attention), so image inputs are refused for it; families it packs with images: "
            f"{', '.join(sorted(FAMILIES))}; text-only rows are packed as usual"
        )
    fields = dict(fields)
    image_token_id = getattr(config, "image_token_id", None)
    if image_token_id is None:
        image_token_id = getattr(config, "image_token_index", None)
    fields.setdefault("tokens_per_image", getattr(config, "mm_tokens_per_image", None))
    video_token_id = getattr(config, "video_token_id", None)
    if video_token_id is None:
        video_token_id = getattr(config, "video_token_index", None)
    fields["video_token_id"] = image_token_id if fields.pop("videos_at_image_token", False) else video_token_id
    if fields["positions"] == "rope3d":
        owner = _rope_owner(model_or_config, modules)
        if owner is None:
            return (
                None,
                f"{family!r}: its module with get_rope_index was not found, so its 3-D positions cannot be computed",
            )
        fields.update(rope_owner=owner[0], rope_config=owner[1])
        fields["merge"] = int(getattr(config.vision_config, "spatial_merge_size", 1))
    elif family == "llava" and getattr(config.vision_config, "model_type", None) == "pixtral":
        # Pixtral's tower: images of their own sizes, padded (cropped back by image_sizes), tokens per its patches
        fields.update(image_keys=("pixel_values", "image_sizes"), tokens_per_image=None)
    elif family == "llava":
        fields["tokens_per_image"] = getattr(config, "image_seq_length", None)
    return VisionScheme(family=family, image_token_id=image_token_id, **fields), None


def _rope_owner(model_or_config: Any, modules: Sequence[tuple[str, Any]] | None = None) -> tuple[type, Any] | None:
    """The class whose ``get_rope_index`` computes the model's 3-D positions and the config it reads:
    a model's submodule (among ``modules``, its ``named_modules()``, when given); for a bare config, the
    class of that name beside the image-text-to-text class transformers maps it to (``None``: not found)."""
    if hasattr(model_or_config, "modules"):
        found = (m for _, m in modules) if modules is not None else base_model_of(model_or_config).modules()
        owner = next((m for m in found if callable(getattr(type(m), "get_rope_index", None))), None)
        return None if owner is None else (type(owner), owner.config)
    import sys

    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING

    try:
        top = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING[type(model_or_config)]
    except (KeyError, ValueError):
        return None
    module = vars(sys.modules[top.__module__])
    owners = [c for c in module.values() if isinstance(c, type) and "get_rope_index" in vars(c)]
    return (owners[0], model_or_config) if owners else None


def image_refusal(scheme: VisionScheme | None, reason: str | None, inputs: str, layout: str) -> str | None:
    """Why packed rows with images are not exact for this scheme, attention inputs and layout (``None``: they are)."""
    if reason is not None:
        return reason
    if scheme is None:
        return "the model has no vision tower (no vision_config), so there is nothing to read image inputs"
    if layout != "documents":
        return "shared-prompt rows do not carry images yet"
    if scheme.blocks is not None and inputs != "mask4d":
        return (
            f"{scheme.family}'s image tokens attend to each other both ways, which only a 4D mask carries; "
            "train images on attn_implementation='sdpa' or 'eager'"
        )
    if scheme.needs_mask4d is not None and inputs != "mask4d":
        return f"{scheme.family}: {scheme.needs_mask4d}; train images on attn_implementation='sdpa' or 'eager'"
    return None


def block_ids(tokens: np.ndarray, scheme: VisionScheme, row_docs: Sequence[Sequence[int]]) -> np.ndarray | None:
    """``[R, L]`` ids of the bidirectional blocks of a batch (-1: causal), unique per row and never
    spanning two documents: ``image_runs`` each run of tokens with ``token_type_ids == 1``, ``prefix``
    each document's tokens with ``token_type_ids == 0`` before its first 1."""
    if scheme.blocks is None:
        return None
    ids = np.full(tokens.shape, -1, dtype=np.int64)
    for r, docs in enumerate(row_docs):
        start, block = 0, 0
        for n in docs:
            t = tokens[r, start : start + n]
            if scheme.blocks == "image_runs":
                image = t == 1
                first = image & ~np.concatenate([[False], image[:-1]])
                runs = np.cumsum(first) - 1 + block
                ids[r, start : start + n] = np.where(image, runs, -1)
                block += int(first.sum())
            else:
                suffix = np.cumsum(t != 0) > 0
                ids[r, start : start + n] = np.where(suffix, -1, block)
                block += 1
            start += n
    return ids


def rope_positions(batch: Mapping[str, Any], scheme: VisionScheme, row_docs: Sequence[Sequence[int]]) -> np.ndarray:
    """``[3, R, L]``: each document's own 3-D rope index, recomputed from a batch's ``input_ids``,
    ``mm_token_type_ids`` and grids as the model consumes them (images in token order): the positions
    the packing collator sends, and what :func:`padless.check_batch` compares a batch's with."""
    host = lambda v: np.asarray(v.detach().cpu() if hasattr(v, "detach") else v)  # noqa: E731
    ids = host(batch["input_ids"])
    types_ = host(batch["mm_token_type_ids"]) if batch.get("mm_token_type_ids") is not None else np.zeros_like(ids)
    grids = {1: batch.get("image_grid_thw"), 2: batch.get("video_grid_thw")}
    used = {1: 0, 2: 0}
    out = np.zeros((3, *ids.shape), dtype=np.int64)
    for r, docs in enumerate(row_docs):
        start = 0
        for n in docs:
            t = types_[r, start : start + n]
            out[:, r, start : start + n] = np.arange(n)
            if t.any():
                take, extra = {}, {}
                for kind in (1, 2):
                    tokens = int((t == kind).sum())
                    g, k = grids[kind], used[kind]
                    while tokens > 0:
                        if g is None or k >= len(g):
                            raise ValueError(
                                f"row {r}: more image tokens than image_grid_thw / video_grid_thw describe"
                            )
                        tokens -= int(torch.as_tensor(g[k]).prod()) // scheme.merge**2
                        k += 1
                    take[kind] = None if g is None or k == used[kind] else torch.as_tensor(g[used[kind] : k])
                    if kind == 2 and take[2] is not None and batch.get("second_per_grid_ts") is not None:
                        extra = {"second_per_grid_ts": torch.as_tensor(batch["second_per_grid_ts"])[used[2] : k]}
                    used[kind] = k
                out[:, r, start : start + n] = scheme.rope_index(ids[r, start : start + n], t, take[1], take[2], extra)
            start += n
    return out
