"""Image columns of rows packed beforehand (torch-free): a row's images are its documents' images,
concatenated in document order, so the collator reads them in the order the model consumes the row's
image tokens.

The rule every path that packs rows ahead of the collator shares (``pack_dataset``,
:class:`padless.PackedRows`, :class:`padless.PackedStream`, ``padless pack``)::

    documents   a (1 image)   b (no image)   c (2 images)       packed into one row  a b c
    pixel_values  [Pa, D]        None           [Pc, D]      ->  [Pa + Pc, D]
    image_grid_thw [[t,h,w]]     None           [[..], [..]] ->  [[a's], [c's], [c's]]
    mm_token_type_ids  (per token: placed like input_ids; 0 for a document without images)

- image columns (:data:`padless.layout.IMAGE_COLUMNS`) are concatenated along the image axis: the first one, or the
  second for per-sample tensors ``[1, images, ...]`` (:data:`padless.layout.PER_SAMPLE_RANKS`: Idefics3 and SmolVLM);
  a row without images holds ``None``;
- per-token columns (:data:`padless.layout.PER_TOKEN_COLUMNS`) are token columns: one value per token, packed like
  ``input_ids``;
- a document with images is placed whole: a plan that truncates or splits one is refused naming it
  (:func:`require_whole`), and one the overlong policy drops takes its images with it (counted).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from padless.layout import IMAGE_COLUMNS, PER_SAMPLE_RANKS, PER_TOKEN_COLUMNS, image_axis, repadded_dims

__all__ = [
    "IMAGE_COLUMNS",
    "PER_SAMPLE_RANKS",
    "PER_TOKEN_COLUMNS",
    "arrow_rank",
    "concat_images",
    "documents_with_images",
    "holds_images",
    "image_axis",
    "pack_image_column",
    "require_whole",
]


def holds_images(value: Any) -> bool:
    """A document's image column holds images: set and not empty."""
    return value is not None and len(value) > 0


def documents_with_images(columns: Iterable[Any], n: int) -> np.ndarray:
    """``[n]`` bool: the documents that some Arrow image column (one value per document, null or empty
    without images; an all-null column of type null holds none) holds images for."""
    import pyarrow as pa
    import pyarrow.compute as pc

    held = np.zeros(n, dtype=bool)
    for column in columns:
        if not pa.types.is_null(column.type):
            held |= pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False) > 0
    return held


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
    axis; per-sample tensors of different image sizes are zero-padded to the largest, and image-major ones
    on the dims the model crops back by ``image_sizes`` (:func:`padless.layout.repadded_dims`), as their
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
    else:
        dims = repadded_dims(key, arrays[0].ndim, keys)
        size = {d: max(a.shape[d] for a in arrays) for d in dims}
        arrays = [np.pad(a, [(0, size[d] - a.shape[d] if d in size else 0) for d in range(a.ndim)]) for a in arrays]
    if axis == 0 and len({a.shape[1:] for a in arrays}) != 1:
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
        pa.array(np.arange(num_rows + 1, dtype=itype)),
        images,
        type=array.type,
        mask=pa.array(empty) if empty.any() else None,
    )
