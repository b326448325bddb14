"""Image columns of rows packed beforehand (torch-free): a row's images are its documents' images,
concatenated in document order, so the collator reads them in the order the model consumes the row's
image tokens.

The rule every path that packs rows ahead of the collator shares (``pack_dataset``,
:class:`padless.PackedRows`, :class:`padless.PackedStream`, ``padless pack``)::

    documents   a (1 image)   b (no image)   c (2 images)       packed into one row  a b c
    pixel_values  [Pa, D]        None           [Pc, D]      ->  [Pa + Pc, D]
    image_grid_thw [[t,h,w]]     None           [[..], [..]] ->  [[a's], [c's], [c's]]
    mm_token_type_ids  (per token: placed like input_ids; 0 for a document without images)

- image columns (:data:`IMAGE_COLUMNS`) are concatenated along the image axis: the first one, or the
  second for per-sample tensors ``[1, images, ...]`` (:data:`PER_SAMPLE_RANKS`: Idefics3 and SmolVLM);
  a row without images holds ``None``;
- per-token columns (:data:`PER_TOKEN_COLUMNS`) are token columns: one value per token, packed like
  ``input_ids``;
- a document with images is placed whole: a plan that truncates or splits one is refused naming it
  (:func:`require_whole`), and one the overlong policy drops takes its images with it (counted).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from padless.layout import VISION_KEYS

PER_TOKEN_COLUMNS: tuple[str, ...] = ("mm_token_type_ids", "token_type_ids")
"""Vision columns with one value per token: packed like ``input_ids``."""
IMAGE_COLUMNS: tuple[str, ...] = tuple(k for k in (*VISION_KEYS, "second_per_grid_ts") if k not in PER_TOKEN_COLUMNS)
"""Vision columns with values per image (or patch): concatenated per row along the image axis."""
PER_SAMPLE_RANKS: dict[str, int] = {"pixel_values": 5, "pixel_attention_mask": 4}
"""Key -> the rank of a per-sample tensor ``[1, images, ...]``, stacked along its second axis (the
processors of Idefics3 and SmolVLM); any other rank is image-major, stacked along the first."""


def image_axis(key: str, ndim: int, keys: Iterable[str] = ()) -> int:
    """The axis ``key``'s images are stacked on: 1 for a per-sample tensor, else 0. ``keys``: the
    other vision keys beside it; with ``image_sizes`` (LLaVA-NeXT's any-resolution tiles,
    ``pixel_values [images, tiles, C, H, W]``) a 5-D tensor is image-major, not per-sample."""
    if key == "pixel_values" and "image_sizes" in keys:
        return 0
    return 1 if PER_SAMPLE_RANKS.get(key) == ndim else 0


def holds_images(value: Any) -> bool:
    """A document's image column holds images: set and not empty."""
    return value is not None and len(value) > 0


def require_whole(
    index: np.ndarray,
    start: np.ndarray,
    length: np.ndarray,
    lengths: np.ndarray,
    with_images: np.ndarray,
    name: Callable[[int], str],
) -> None:
    """Raise naming the first document with images (``with_images[doc]``) that the pieces
    ``(index, start, length)`` do not place whole (truncated, split or cut at a row's end)."""
    index = np.asarray(index, dtype=np.int64)
    images = np.asarray(with_images, dtype=bool)[index]
    cut = images & ((np.asarray(start) != 0) | (np.asarray(length) != np.asarray(lengths)[index]))
    if cut.any():
        doc = int(index[np.flatnonzero(cut)[0]])
        raise ValueError(
            f"{name(doc)} holds images and {int(lengths[doc])} tokens, and the plan cuts it: a document with images "
            "is placed whole (cutting it would cut its images); raise the row length, drop it (overlong='drop'), "
            "shorten its text before the processor, or choose a strategy that keeps documents whole (not 'wrapped')"
        )


def concat_images(parts: Sequence[Any], key: str, keys: Iterable[str] = ()) -> np.ndarray:
    """The images of a row's documents (numpy, lists or tensors) as one array, stacked along the image
    axis; per-sample tensors of different image sizes are zero-padded to the largest, as their
    processor pads a batch."""
    arrays = [np.asarray(p.detach().cpu().numpy() if hasattr(p, "detach") else p) for p in parts]
    ranks = {a.ndim for a in arrays}
    if len(ranks) != 1:
        raise ValueError(
            f"{key!r} has {sorted(ranks)} dimensions across a row's documents; one processor makes them all"
        )
    axis = image_axis(key, arrays[0].ndim, keys)
    if axis == 1:
        size = [max(a.shape[d] for a in arrays) for d in range(arrays[0].ndim)]
        arrays = [np.pad(a, [(0, 0), (0, 0), *((0, size[d] - a.shape[d]) for d in range(2, a.ndim))]) for a in arrays]
    elif len({a.shape[1:] for a in arrays}) != 1:
        raise ValueError(
            f"{key!r} differs in shape beyond the first dimension across a row's documents "
            f"({sorted({a.shape[1:] for a in arrays})}); process every image with the same processor settings"
        )
    return np.concatenate(arrays, axis=axis)


def arrow_rank(type_: Any) -> int:
    """Nested list levels of an Arrow type (``list<list<float>>`` is 2)."""
    import pyarrow as pa

    rank = 0
    while pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
        type_, rank = type_.value_type, rank + 1
    return rank


def _offsets(array: Any) -> np.ndarray:
    return np.asarray(array.offsets, dtype=np.int64)


def _grouped(array: Any, starts: np.ndarray, counts: np.ndarray, rows: np.ndarray, num_rows: int) -> Any:
    """A list array of ``num_rows`` rows: row ``r`` holds the child values ``[starts[j], starts[j] +
    counts[j])`` of every ``j`` with ``rows[j] == r``, in order (``rows`` sorted); rows with none are null."""
    import pyarrow as pa

    large = pa.types.is_large_list(array.type)
    itype = np.int64 if large else np.int32
    view = (pa.LargeListViewArray if large else pa.ListViewArray).from_arrays(
        pa.array(starts.astype(itype)), pa.array(counts.astype(itype)), array.values
    )
    per_row = np.bincount(rows, weights=counts, minlength=num_rows).astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(per_row)))
    empty = np.bincount(rows, minlength=num_rows) == 0
    cls = pa.LargeListArray if large else pa.ListArray
    return cls.from_arrays(
        pa.array(offsets.astype(itype)), view.flatten(), type=array.type, mask=pa.array(empty) if empty.any() else None
    )


def pack_image_column(
    array: Any, key: str, docs: np.ndarray, rows: np.ndarray, num_rows: int, keys: Iterable[str] = ()
) -> Any:
    """An Arrow image column (one value per document, null or empty for one without images) packed into
    ``num_rows`` rows: ``docs`` the placed documents in row order, ``rows`` the row of each (sorted).
    Each row holds its documents' images concatenated along the image axis (null: none)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        raise ValueError(
            f"image column {key!r} is {array.type}, not a list per document; store the processor's arrays as lists"
        )
    docs, rows = np.asarray(docs, dtype=np.int64), np.asarray(rows, dtype=np.int64)
    counts = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    keep = counts[docs] > 0
    docs, rows = docs[keep], rows[keep]
    if image_axis(key, arrow_rank(array.type), keys) == 0:
        return _grouped(array, _offsets(array)[docs], counts[docs], rows, num_rows)
    if np.any(counts[docs] != 1):
        raise ValueError(
            f"image column {key!r} holds per-sample tensors [1, images, ...]; a document's must have a first dimension of 1"
        )
    inner = array.values
    first = _offsets(array)[docs]  # each document's one sample
    inner_offsets = _offsets(inner)
    images = _grouped(inner, inner_offsets[first], inner_offsets[first + 1] - inner_offsets[first], rows, num_rows)
    empty = np.bincount(rows, minlength=num_rows) == 0
    cls = pa.LargeListArray if pa.types.is_large_list(array.type) else pa.ListArray
    itype = np.int64 if pa.types.is_large_list(array.type) else np.int32
    return cls.from_arrays(
        pa.array(np.arange(num_rows + 1, dtype=itype)), images, type=array.type,
        mask=pa.array(empty) if empty.any() else None,
    )  # fmt: skip


def arrow_column(values: Sequence[Any]) -> Any:
    """One document's processor output per entry (an array, list or tensor; ``None`` without images) as
    an Arrow list column of the array's dtype (``pixel_values [P, D]`` float32 -> ``list<list<float>>``,
    as ``datasets`` stores it); every array of the column has the same rank."""
    import pyarrow as pa

    arrays = [
        None if v is None else np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v) for v in values
    ]
    present = [a for a in arrays if a is not None]
    if not present:
        return pa.nulls(len(arrays))
    if len({a.ndim for a in present}) != 1 or present[0].ndim == 0:
        raise ValueError(
            f"an image column holds arrays of ranks {sorted({a.ndim for a in present})}; one processor makes them all"
        )
    ndim = present[0].ndim
    child = pa.array(np.concatenate([a.ravel() for a in present]))
    for k in range(ndim - 1, 0, -1):  # the inner levels: regular lists of shape[k] values
        sizes = np.concatenate([np.full(int(np.prod(a.shape[:k])), a.shape[k], dtype=np.int64) for a in present])
        child = pa.ListArray.from_arrays(pa.array(np.concatenate(([0], np.cumsum(sizes))).astype(np.int32)), child)
    sizes = np.array([0 if a is None else a.shape[0] for a in arrays], dtype=np.int64)
    missing = np.array([a is None for a in arrays])
    offsets = pa.array(np.concatenate(([0], np.cumsum(sizes))).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, child, mask=pa.array(missing) if missing.any() else None)
