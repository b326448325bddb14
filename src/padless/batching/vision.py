"""Images travel with their documents: the vision inputs of a packed (or padded) batch.

A feature of a vision-language model carries what the model's processor returned for that one
document (:class:`padless.attention.multimodal.VisionScheme` says which keys a family reads)::

    input_ids           [n]        text and image placeholder tokens
    mm_token_type_ids   [n]        per-token keys: placed in the row like input_ids (0 on padding)
    pixel_values        [P, D]     image keys: concatenated in the order of the batch's image tokens,
    image_grid_thw      [k, 3]       row by row, document by document (the order the model scatters
                                     image features into placeholder tokens)

and the packed row gets, per document, the positions the model gives that document alone (Qwen-VL's
3-D rope index: :meth:`VisionScheme.rope_index`) and, where a family's image tokens attend both
ways, those blocks inside each document (:func:`block_ids`). A document with images is placed whole:
truncating or splitting it would cut its images, so that is refused naming the feature, and one the
overlong policy drops takes its images with it (counted in the collator's totals). Every key a
feature carries is carried by a stated rule or refused by name; nothing is dropped silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from padless.attention.multimodal import (  # noqa: F401 (IMAGE_KEYS, block_ids re-exported)
    IMAGE_KEYS,
    PER_TOKEN_KEYS,
    VisionScheme,
    block_ids,
    image_inputs,
    rope_positions,
)
from padless.layout import position_ids_from_lengths, repadded_dims

VIDEO_KEYS: tuple[str, ...] = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
"""Qwen-VL's video inputs: concatenated like images (``second_per_grid_ts`` one value per video)."""


def _tensor(value: Any, key: str, where: str) -> torch.Tensor:
    try:
        return value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}'s {key!r} is not an array ({type(value).__name__}): {err}") from None


def _images(value: Any, key: str, keys: Any, where: str) -> torch.Tensor:
    """An image key as one tensor; a list of images of different sizes (a row packed beforehand in
    Arrow, each document padded to its own) is stacked image by image, zero-padded on the dims the
    model crops back by ``image_sizes`` (:func:`padless.layout.repadded_dims`)."""
    try:
        return _tensor(value, key, where)
    except ValueError:
        if not isinstance(value, (list, tuple)) or not value:
            raise
        parts = [_tensor(v, key, where)[None] for v in value]
        if not repadded_dims(key, parts[0].dim(), keys):
            raise
        return _concat(parts, key, 0, [], keys)


def _float32(t: torch.Tensor) -> torch.Tensor:
    """Pixel values read back from lists (``datasets`` rows) as float64 are the processor's float32."""
    return t.float() if t.dtype == torch.float64 else t


def per_token(feature: Mapping[str, Any], key: str, n: int, where: str) -> np.ndarray:
    """A per-token key as an ``[n]`` int64 array (``[1, n]`` accepted); a separator appended to the
    document (``n`` one longer) gets 0."""
    values = np.asarray(_tensor(feature[key], key, where)).reshape(-1).astype(np.int64)
    if values.size == n - 1:  # the collator appended a separator
        values = np.append(values, 0)
    if values.size != n:
        raise ValueError(f"{where}'s {key!r} has {values.size} values for {n} tokens; it needs one per token")
    return values


@dataclass(frozen=True)
class DocImages:
    """The vision inputs of one document, validated."""

    tensors: dict[str, torch.Tensor]
    """Image keys -> the processor's tensor for this document."""
    tokens: dict[str, np.ndarray]
    """Per-token keys -> ``[n]`` arrays."""
    images: int
    """Images in the document."""


def read_images(
    feature: Mapping[str, Any],
    ids: np.ndarray,
    scheme: VisionScheme | None,
    refusal: str | None,
    where: str,
    carried: Sequence[str] = (),
) -> DocImages | None:
    """The validated vision inputs of one feature (``None``: it carries no images; per-token keys of
    a text-only document must then mark no image token, and the row's zeros stand for them). Refused,
    naming the feature and the key: images for a model that does not take them (``refusal``), a key the
    family does not read, per-token keys of the wrong length, placeholder tokens that do not match the
    images. ``carried``: the vision keys the collator carries (default: all)."""
    keys = [k for k in feature if k in (carried or ALL_VISION_KEYS) and feature[k] is not None]  # None: a column unset
    if not any(k in IMAGE_KEYS for k in keys):
        for k in keys:
            if k in PER_TOKEN_KEYS and np.count_nonzero(per_token(feature, k, ids.size, where)):
                raise ValueError(f"{where}'s {k!r} marks image tokens, but it carries no images (no pixel_values)")
        if any(k not in PER_TOKEN_KEYS for k in keys):
            raise ValueError(f"{where} carries {', '.join(map(repr, keys))} without pixel values or image grids")
        return None
    if refusal is not None or scheme is None:
        raise ValueError(
            f"{where} carries image inputs ({', '.join(map(repr, keys))}) that cannot be packed: {refusal}"
        )
    readable = {*scheme.image_keys, *scheme.token_keys, *(VIDEO_KEYS if scheme.positions == "rope3d" else ())}
    unread = [k for k in keys if k not in readable]
    if unread:
        raise ValueError(
            f"{where} carries {', '.join(map(repr, unread))}, which {scheme.family} packing does not read "
            f"(it carries {', '.join(map(repr, sorted(readable)))}); remove them from the features"
        )
    n = ids.size
    tokens = {k: per_token(feature, k, n, where) for k in scheme.token_keys if k in feature}
    tensors = {k: _float32(_images(feature[k], k, keys, where)) for k in keys if k not in tokens}
    if scheme.image_dim == 1:
        tensors = {k: v[None] if v.dim() < 2 else v for k, v in tensors.items()}
    missing = [k for k in scheme.token_keys if k not in tokens]
    if missing:
        raise ValueError(f"{where} carries images but no {', '.join(map(repr, missing))}, which {scheme.family} needs")
    images = _count_images(tensors, scheme)
    image_at, video_at = _placeholders(ids, tokens.get("mm_token_type_ids"), scheme)
    shared = scheme.video_token_id is not None and scheme.video_token_id == scheme.image_token_id
    if shared and "pixel_values" in tensors and "pixel_values_videos" in tensors:
        raise ValueError(
            f"{where} holds images and videos: {scheme.family} reads both at its image token "
            f"(id {scheme.image_token_id}), so one forward holds images or videos, not both; split them"
        )
    placeholders = None if image_at is None else int(image_at.sum())
    expected = _expected_tokens(tensors, scheme, images)
    if placeholders is not None and expected is not None and placeholders != expected:
        raise ValueError(
            f"{where} has {placeholders} image placeholder tokens (id {scheme.image_token_id}) but its "
            f"{images} image{'s' if images != 1 else ''} take {expected}: the ids and the image inputs do not "
            "come from the same processor call (or the text was truncated through an image)"
        )
    if video_at is not None and "video_grid_thw" in tensors:
        grid = tensors["video_grid_thw"].reshape(-1, 3).long()
        frames = int((grid.prod(dim=1) // scheme.merge**2).sum())
        if int(video_at.sum()) != frames:
            raise ValueError(
                f"{where} has {int(video_at.sum())} video placeholder tokens but its video_grid_thw takes {frames}: "
                "the ids and the video inputs do not come from the same processor call"
            )
    if "mm_token_type_ids" in tokens and image_at is not None:
        marked = tokens["mm_token_type_ids"] == 1
        if not np.array_equal(marked, image_at):
            raise ValueError(
                f"{where}'s mm_token_type_ids mark {int(marked.sum())} image tokens where its input_ids hold "
                f"{placeholders} image placeholders; they must mark the same positions"
            )
    return DocImages(tensors, tokens, images)


ALL_VISION_KEYS: tuple[str, ...] = (
    "pixel_values",
    "image_grid_thw",
    "pixel_attention_mask",
    "image_sizes",
    "mm_token_type_ids",
    "token_type_ids",
    "image_embeds",
    "image_attention_mask",
    *VIDEO_KEYS,
)
"""Processor outputs a vision-language feature may carry (``token_type_ids`` counts only where the
model's family reads it; elsewhere the text rule's check of zeros applies)."""


def _placeholders(
    ids: np.ndarray, types_: np.ndarray | None, scheme: VisionScheme
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``[n]`` bool: where a document's image and its video placeholders lie (``None``: the family names no
    such token). Where videos hold the image token (GLM-4V), ``mm_token_type_ids`` 2 marks their frames."""
    image_at = None if scheme.image_token_id is None else ids == scheme.image_token_id
    video_at = None if scheme.video_token_id is None else ids == scheme.video_token_id
    if image_at is not None and scheme.video_token_id == scheme.image_token_id:
        frames = types_ == 2 if types_ is not None else np.zeros_like(image_at)
        image_at, video_at = image_at & ~frames, image_at & frames
    return image_at, video_at


def _count_images(tensors: dict[str, torch.Tensor], scheme: VisionScheme) -> int:
    if "image_grid_thw" in tensors:
        return int(tensors["image_grid_thw"].reshape(-1, 3).shape[0])
    pixels = tensors.get("pixel_values")
    if pixels is None:
        return 0
    return int(pixels.shape[1] if scheme.image_dim == 1 else pixels.shape[0])


def _expected_tokens(tensors: dict[str, torch.Tensor], scheme: VisionScheme, images: int) -> int | None:
    if "image_grid_thw" in tensors:
        grid = tensors["image_grid_thw"].reshape(-1, 3).long()
        return int((grid.prod(dim=1) // scheme.merge**2).sum())
    if scheme.tokens_per_image is not None:
        return images * scheme.tokens_per_image
    return None


def image_patches(feature: Mapping[str, Any]) -> int:
    """The vision-encoder patches of a feature's images (0 without images): Qwen-VL's ``image_grid_thw``
    (``t*h*w`` per image and video), else the patch rows of 2-D ``pixel_values``, else the images'
    pixels over 14 x 14 (the common ViT patch), the unit of ``max_image_patches``."""
    total = 0
    for grid in ("image_grid_thw", "video_grid_thw"):
        if feature.get(grid) is not None:
            total += int(torch.as_tensor(np.asarray(feature[grid])).reshape(-1, 3).prod(dim=1).sum())
    if total or feature.get("pixel_values") is None:
        return total
    pixels = _tensor(feature["pixel_values"], "pixel_values", "feature")
    if pixels.dim() == 2:
        return int(pixels.shape[0])
    return int(pixels[..., 0, :, :].numel()) // (14 * 14)


def require_whole(docs: dict[int, DocImages], placements: Any, lengths: np.ndarray) -> set[int]:
    """The features with images that were placed, each as one whole piece; raise naming a feature
    with images that the overlong policy truncated or split. Returns the placed ones (a dropped
    feature's images leave with it)."""
    placed = set()
    for i in docs:
        pieces = placements.of_feature(i)
        if not pieces:
            continue
        if len(pieces) > 1 or pieces[0][0] != 0 or pieces[0][3] != int(lengths[i]):
            raise ValueError(
                f"feature {i} holds {docs[i].images} image(s) and {int(lengths[i])} tokens, more than the row "
                "holds: truncating or splitting it would cut its images; raise max_length, drop it "
                "(overlong='drop'), or shorten its text before the processor"
            )
        placed.add(i)
    return placed


def packed_vision(
    docs: dict[int, DocImages],
    placements: Any,
    shape: tuple[int, int],
    scheme: VisionScheme,
    input_ids: np.ndarray,
    row_docs: Sequence[Sequence[int]],
) -> tuple[dict[str, Any], np.ndarray | None]:
    """The vision entries of a packed ``shape = [R, L]`` batch and, for ``rope3d`` families, its
    ``[4, R, L]`` position ids (the text positions first); ``None`` otherwise (the text positions stand).
    ``docs``: the features holding images (each placed whole, or a row packed beforehand whose
    documents are its pieces)."""
    order = list(dict.fromkeys(int(f) for f in placements.feature if int(f) in docs))  # row by row
    out: dict[str, Any] = {}
    for key in scheme.token_keys:
        values = np.zeros(shape, dtype=np.int64)
        for j, f in enumerate(placements.feature):
            f = int(f)
            if f in docs and key in docs[f].tokens:
                r, o, n, s = (
                    int(a[j]) for a in (placements.row, placements.offset, placements.length, placements.start)
                )
                values[r, o : o + n] = docs[f].tokens[key][s : s + n]
        out[key] = torch.from_numpy(values)
    keys = list(dict.fromkeys(k for f in order for k in docs[f].tensors))
    if scheme.video_token_id is not None and scheme.video_token_id == scheme.image_token_id:
        held = {k: [f for f in order if k in docs[f].tensors] for k in ("pixel_values", "pixel_values_videos")}
        if all(held.values()):
            raise ValueError(
                f"features {held['pixel_values']} hold images and features {held['pixel_values_videos']} videos: "
                f"{scheme.family} reads both at its image token (id {scheme.image_token_id}), so one forward holds "
                "images or videos, not both; batch them apart"
            )
    for key in keys:
        # a document holds images, videos or both: each kind's keys come from the documents that hold it
        group = VIDEO_KEYS if key in VIDEO_KEYS else tuple(k for k in keys if k not in VIDEO_KEYS)
        holders = [f for f in order if any(k in docs[f].tensors for k in group)]
        missing = [f for f in holders if key not in docs[f].tensors]
        if missing:
            raise ValueError(f"feature {missing[0]} carries no {key!r} while others of the batch do")
        out[key] = _concat([docs[f].tensors[key] for f in holders], key, scheme.image_dim, holders, keys)
    if scheme.positions != "rope3d":
        return out, None
    text = np.stack([position_ids_from_lengths(d) for d in row_docs])
    rope = rope_positions({"input_ids": input_ids, **out}, scheme, row_docs)
    return out, np.concatenate([text[None], rope])


def _pad_to(parts: list[torch.Tensor], dims: Sequence[int]) -> list[torch.Tensor]:
    """``parts`` zero-padded at the end of ``dims`` to the largest of them."""
    sizes = {d: max(p.shape[d] for p in parts) for d in dims}
    out = []
    for p in parts:
        pad = []
        for d in reversed(range(1, p.dim())):
            pad += [0, sizes[d] - p.shape[d] if d in sizes else 0]
        out.append(torch.nn.functional.pad(p, pad) if any(pad) else p)
    return out


def _concat(parts: list[torch.Tensor], key: str, dim: int, order: list[int], keys: Any = ()) -> torch.Tensor:
    """``parts`` concatenated along ``dim``; other dims must agree, except that per-sample image tensors
    (``dim=1``) are zero-padded to the largest image, and image-major ones on the dims the model crops
    back by ``image_sizes`` (:func:`padless.layout.repadded_dims`; ``keys``: the vision keys beside
    ``key``), as the processor pads a batch of them."""
    rank = {p.dim() for p in parts}
    if len(rank) != 1:
        raise ValueError(f"{key!r} has {sorted(rank)} dimensions across features {order}; one processor makes them all")
    if dim == 1:
        return torch.cat(_pad_to(parts, range(2, parts[0].dim())), dim=1)
    parts = _pad_to(parts, repadded_dims(key, parts[0].dim(), keys))
    trailing = {tuple(p.shape[1:]) for p in parts}
    if len(trailing) != 1:
        raise ValueError(
            f"{key!r} of features {order} differ in shape beyond the first dimension ({sorted(trailing)}); "
            "process every image with the same processor settings"
        )
    return torch.cat(parts, dim=0)


def carried_keys(features: Sequence[Mapping[str, Any]], reads_token_types: bool = False) -> tuple[str, ...]:
    """The vision keys a batch of ``features`` carries: all of them where some feature holds images
    (``token_type_ids`` then mark image tokens) or the model's family reads ``token_type_ids``
    (``reads_token_types``), else all but ``token_type_ids`` (which a text batch re-derives: zeros)."""
    keep = reads_token_types or any(image_inputs(f) for f in features)
    return tuple(k for k in ALL_VISION_KEYS if keep or k != "token_type_ids")


def _image_axis(key: str, tensor: torch.Tensor, keys: Any = ()) -> int:
    """The axis images are stacked on: 1 for per-sample tensors (Idefics3's ``pixel_values``
    ``[1, images, C, H, W]`` and ``pixel_attention_mask`` ``[1, images, H, W]``), else 0
    (:func:`padless.batching.image_rows.image_axis`, the one rule)."""
    from padless.batching.image_rows import image_axis

    return image_axis(key, tensor.dim(), keys)


def padded_vision(features: Sequence[Mapping[str, Any]], lengths: Sequence[int], width: int) -> dict[str, Any]:
    """The vision entries of a right-padded ``[B, width]`` batch of the same features (the baseline,
    no model needed: the model computes its own positions and image masks from a padded batch):
    per-token keys (:data:`PER_TOKEN_KEYS`) padded with 0, every other vision key concatenated in
    feature order, along the image axis of per-sample tensors (``[1, images, ...]``, zero-padded as the
    processor pads them) or else the first."""
    out: dict[str, Any] = {}
    carried = carried_keys(features)
    keys = list(dict.fromkeys(k for f in features for k in f if k in carried and f[k] is not None))
    for key in keys:
        where = [i for i, f in enumerate(features) if f.get(key) is not None]
        if key in PER_TOKEN_KEYS:
            values = np.zeros((len(features), width), dtype=np.int64)
            for i in where:
                v = per_token(features[i], key, int(lengths[i]), f"feature {i}")
                values[i, : v.size] = v
            out[key] = torch.from_numpy(values)
            continue
        parts = [_images(features[i][key], key, keys, f"feature {i}") for i in where]
        out[key] = _concat(parts, key, _image_axis(key, parts[0], keys), where, keys)
    return out


def row_vision(pieces: Sequence[Sequence[int]], features: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The vision inputs of a row packed beforehand from ``pieces`` (``(sequence, start, length)``) of
    ``features`` (sequence -> its feature): per-token keys along the row, image tensors in piece order
    (``{}`` when no piece's feature carries images). A piece of a document with images must be the
    whole document: cutting it would cut its images (raised naming the sequence)."""
    keys = [k for i, _, _ in pieces for k, v in features[int(i)].items() if k in ALL_VISION_KEYS and v is not None]
    if not any(k in IMAGE_KEYS for k in keys):
        return {}
    out: dict[str, Any] = {}
    for key in dict.fromkeys(keys):
        if key in PER_TOKEN_KEYS:
            parts = []
            for i, start, length in pieces:
                f = features[int(i)]
                n = len(f["input_ids"])
                values = (
                    per_token(f, key, n, f"sequence {i}") if f.get(key) is not None else np.zeros(n, dtype=np.int64)
                )
                parts.append(values[int(start) : int(start) + int(length)])
            out[key] = np.concatenate(parts)
            continue
        parts = []
        for i, start, length in pieces:
            f = features[int(i)]
            if f.get(key) is None:
                continue
            if int(start) != 0 or int(length) != len(f["input_ids"]):
                raise ValueError(
                    f"sequence {i} holds images and was cut to tokens [{start}, {int(start) + int(length)}) of "
                    f"{len(f['input_ids'])}: a document with images is placed whole; raise max_length or drop it "
                    "(overlong='drop')"
                )
            parts.append(_float32(_images(f[key], key, keys, f"sequence {i}")))
        out[key] = _concat(parts, key, _image_axis(key, parts[0], keys), [int(i) for i, _, _ in pieces], keys)
    return out
