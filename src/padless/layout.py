"""Sequence lengths -> the index tensors a packed row is described by.

A packed row of ``L`` tokens holding documents of lengths ``[3, 2, 4]`` (L = 9) is described by::

    position_ids   0 1 2 0 1 0 1 2 3     restart at 0 for every document
    document_ids   0 0 0 1 1 2 2 2 2     which document each token belongs to
    cu_seqlens     0 3 5 9               cumulative offsets (flash-attn's varlen convention)

Padding at the end of a row is its own document (position ids restart at 0 there too), so a row
stays a valid packed row and padding never joins the last real document. Functions take numpy or
python ints and return numpy int64 arrays; the collators turn them into tensors.

The row vocabulary (:data:`AttentionInputs`, :data:`Layout`, :data:`MaskWindows`) lives here too, below
both the batching that builds rows and the attention that judges them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

IGNORE_INDEX = -100
"""The label value that cross-entropy ignores (``torch.nn.CrossEntropyLoss``'s default)."""

# The row vocabulary: what a packed row carries for attention and how it is laid out. Batching builds
# rows with these words and attention judges them, so both import them from here, below both.
AttentionInputs = Literal["mask4d", "varlen", "position_ids"]
"""What a packed batch carries so the attention backend isolates documents:
``mask4d`` a 4D additive block-causal float mask (SDPA, eager); ``varlen`` cumulative sequence
lengths ``cu_seq_lens_q/k`` and ``max_length_q/k`` (padless varlen, flash-attn); ``position_ids``
restarted position ids alone (flash-attn's own detection)."""
ATTENTION_INPUTS: tuple[str, ...] = ("mask4d", "varlen", "position_ids")

Layout = Literal["documents", "shared_prompt"]
"""How a row is laid out: ``documents`` (each document attends to itself only: SFT packing, preference
pairs with ``share_prompt=False``) or ``shared_prompt`` (a prompt once, several completions attending
to it and not to each other: :class:`padless.PreferenceCollator`, :class:`padless.RolloutCollator`)."""
LAYOUTS: tuple[str, ...] = ("documents", "shared_prompt")

MaskWindows = int | dict[str, int | None] | None
"""What the 4D mask path sends: ``None`` one block-causal mask for every layer; ``w`` one mask with
a window of ``w`` tokens for every layer; a dict layer type -> window (``None``: no window), sent as
a dict of masks that the model picks from per layer."""


ROW_PADDING = "padless_row_padding"
"""Batch key: ``[R]`` trailing padding tokens of each packed row, sent with a hybrid model's batches so that
its token mixers run the rows' real tokens only; the hook on the model's forward takes it out of the call
(:mod:`padless.attention.mixer_documents`), so no layer of the model sees it."""

VISION_KEYS: tuple[str, ...] = (
    "pixel_values",
    "image_grid_thw",
    "video_grid_thw",
    "pixel_values_videos",
    "pixel_attention_mask",
    "image_sizes",
    "mm_token_type_ids",
    "image_embeds",
    "image_attention_mask",
)
"""Processor outputs of vision-language models: :class:`padless.PackingCollator` and
:class:`padless.PaddingCollator` carry them with their documents (:mod:`padless.batching.vision`); the
preference and rollout collators refuse them."""
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


def repadded_dims(key: str, ndim: int, keys: Iterable[str] = ()) -> tuple[int, ...]:
    """The dims of an image-major ``key`` tensor (``ndim`` dims) that each document pads to its own
    images and the model crops back per image by ``image_sizes`` (``keys``: the vision keys beside it),
    so documents of different sizes are zero-padded at the end of these dims to the largest, as their
    processor pads a batch: LLaVA-NeXT's any-resolution tiles (``pixel_values [images, tiles, C, H, W]``,
    padded on ``tiles``; the model keeps each image's first tiles, counted from ``image_sizes``) and
    Pixtral's images (``pixel_values [images, C, H, W]``, padded at the bottom and right; Pixtral's
    tower keeps each image's ``image_sizes`` patches). ``()``: every dim but the first must agree."""
    if key != "pixel_values" or "image_sizes" not in keys:
        return ()
    return {5: (1,), 4: (2, 3)}.get(ndim, ())


def _as_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(lengths, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be one-dimensional, got shape {arr.shape}")
    if arr.size and arr.min() < 1:
        i = int(np.argmin(arr))
        raise ValueError(f"document {i} has length {int(arr[i])}; every document needs at least 1 token")
    return arr


def cu_seqlens_from_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """``[n + 1]`` cumulative offsets, starting at 0."""
    arr = _as_lengths(lengths)
    out = np.zeros(arr.size + 1, dtype=np.int64)
    np.cumsum(arr, out=out[1:])
    return out


def position_ids_from_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """``[sum(lengths)]`` positions restarting at 0 at every document start."""
    arr = _as_lengths(lengths)
    total = int(arr.sum())
    starts = np.repeat(cu_seqlens_from_lengths(arr)[:-1], arr)
    return np.arange(total, dtype=np.int64) - starts


def document_ids_from_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """``[sum(lengths)]`` the index of the document each token belongs to."""
    arr = _as_lengths(lengths)
    return np.repeat(np.arange(arr.size, dtype=np.int64), arr)


def lengths_from_position_ids(position_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Inverse of :func:`position_ids_from_lengths` for one row: a new document starts at every 0.

    Raises if the ids are not a concatenation of ``0, 1, ..., l-1`` runs, since a row whose
    positions do not restart cleanly cannot be split into documents unambiguously.
    """
    pos = np.asarray(position_ids, dtype=np.int64)
    if pos.ndim != 1:
        raise ValueError(f"position_ids must be one row (1-D), got shape {pos.shape}")
    if pos.size == 0:
        return np.zeros(0, dtype=np.int64)
    if pos[0] != 0:
        raise ValueError(f"position_ids must start at 0, got {int(pos[0])}")
    starts = np.flatnonzero(pos == 0)
    lengths = np.diff(np.append(starts, pos.size))
    if not np.array_equal(pos, position_ids_from_lengths(lengths)):
        bad = int(np.flatnonzero(pos != position_ids_from_lengths(lengths))[0])
        raise ValueError(f"position_ids do not count up by 1 inside a document (at index {bad})")
    return lengths


# ------------------------------------------------------------------------ tokens and rows

Piece = tuple[int, int, int]
"""A slice of a sequence placed in a row: ``(sequence index, start, length)``. A row is a tuple of
pieces, in order; a sequence split by the overlong policy appears as several pieces."""


class TokenError(ValueError):
    """Token ids or labels that cannot be trained on; ``reason`` names the kind of problem
    (``bad_type``, ``empty``, ``bad_token``, ``bad_label``, ``length_mismatch``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _int_array(values: Any, what: str, where: str) -> np.ndarray:
    if values is None:
        raise TokenError("bad_type", f"{where}: {what} is null; expected a list of integer token ids")
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().cpu().numpy()
    try:
        arr = np.asarray(values)
    except (ValueError, OverflowError) as exc:
        raise TokenError("bad_type", f"{where}: {what} is not a flat list of integers ({exc})") from None
    if arr.ndim != 1:
        raise TokenError("bad_type", f"{where}: {what} must be a 1-D list of integers, got shape {arr.shape}")
    if arr.size == 0:
        return arr.astype(np.int64)
    if arr.dtype == object:  # python ints beyond int64, or mixed types
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in arr.tolist()):
            raise TokenError("bad_type", f"{where}: {what} must hold integers only")
        big = next((v for v in arr.tolist() if not -(2**63) <= v < 2**63), None)
        if big is None:
            return arr.astype(np.int64)
        raise TokenError(
            "bad_token" if what == "input_ids" else "bad_label",
            f"{where}: {what} holds {big}, far outside any vocabulary",
        )
    if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
        arr = arr.astype(np.int64)  # 3.0 from a JSON/CSV reader is the integer 3
    if arr.dtype.kind not in "iu":
        raise TokenError("bad_type", f"{where}: {what} must be integer token ids, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) >= 2**63:
        raise TokenError("bad_token", f"{where}: {what} holds {int(arr.max())}, far outside any vocabulary")
    return arr.astype(np.int64, copy=False)


def check_tokens(
    input_ids: Any, labels: Any = None, *, vocab_size: int | None = None, where: str = "sequence"
) -> tuple[np.ndarray, np.ndarray]:
    """The one validator of token ids and labels; every entry point (collators, rows, streams,
    files) calls it, so a bad token is refused the same way wherever it comes in.

    ``input_ids``: a non-empty 1-D sequence of integers in ``[0, vocab_size)`` (``[0, inf)`` without
    a vocabulary). ``labels`` (optional, unshifted): the same length, each ``IGNORE_INDEX`` or a valid
    id (a label past the vocabulary would fail inside cross-entropy, on a GPU as a device assert).
    Returns int64 ``(input_ids, labels)``; without labels, a copy of the ids (every token trained).
    Raises :class:`TokenError` (a ``ValueError``) whose message starts with ``where``.
    """
    ids = _int_array(input_ids, "input_ids", where)
    if ids.size == 0:
        raise TokenError("empty", f"{where} is an empty sequence; every sequence needs at least one token")
    high = f"{vocab_size}" if vocab_size is not None else "inf"
    low_i, high_i = int(ids.min()), int(ids.max())
    if low_i < 0 or (vocab_size is not None and high_i >= vocab_size):
        bad = int(np.flatnonzero((ids < 0) | (ids >= (vocab_size if vocab_size is not None else 2**63 - 1)))[0])
        raise TokenError(
            "bad_token", f"{where}: token id {int(ids[bad])} is outside the vocabulary [0, {high}) (input_ids[{bad}])"
        )
    if labels is None:
        return ids, ids.copy()
    lab = _int_array(labels, "labels", where)
    if lab.size != ids.size:
        raise TokenError(
            "length_mismatch", f"{where}: labels has {lab.size} tokens but input_ids has {ids.size}; they must match"
        )
    wrong = (lab != IGNORE_INDEX) & ((lab < 0) | (lab >= (vocab_size if vocab_size is not None else 2**63 - 1)))
    if wrong.any():
        bad = int(np.flatnonzero(wrong)[0])
        raise TokenError(
            "bad_label",
            f"{where}: label {int(lab[bad])} (labels[{bad}]) is neither {IGNORE_INDEX} "
            f"(not trained) nor a token id in [0, {high})",
        )
    return ids, lab


def build_row(
    pieces: Sequence[Piece], lookup: Callable[[int], tuple[np.ndarray, np.ndarray]], dtype: Any = np.int64
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The one row builder: ``(input_ids, labels, seq_lengths)`` of a row made of ``pieces``
    (:data:`Piece` tuples, or a ``[k, 3]`` int array of them).

    ``lookup(i)`` gives sequence ``i``'s ``(input_ids, labels)`` arrays. Labels are copied as they
    are (unshifted); :func:`mask_document_starts` masks each document's first label when the row is
    trained. An empty row is invalid: every row holds at least one piece.
    """
    if len(pieces) == 0:
        raise ValueError("a row needs at least one piece")
    ids, labels = [], []
    for index, start, length in pieces:
        seq, lab = lookup(int(index))
        if length < 1 or start < 0 or start + length > min(seq.size, lab.size):
            raise ValueError(
                f"sequence {index} has {seq.size} tokens and {lab.size} labels, too few for the "
                f"piece [{start}, {start + length}); were the lengths planned from these sequences?"
            )
        ids.append(seq[start : start + length])
        labels.append(lab[start : start + length])
    return (
        np.concatenate(ids).astype(dtype, copy=False),
        np.concatenate(labels).astype(dtype, copy=False),
        np.fromiter((n for _, _, n in pieces), dtype=dtype, count=len(pieces)),
    )


def mask_document_starts(labels: np.ndarray, seq_lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """``labels`` with the label at every document start set to ``IGNORE_INDEX`` (in place).

    Labels are unshifted: the label at a document's first position is what the *previous* token
    would be trained to predict, i.e. the last token of the previous document predicting the first
    of this one. Masking it is what keeps documents from training on each other's boundaries.
    """
    labels[cu_seqlens_from_lengths(seq_lengths)[:-1]] = IGNORE_INDEX
    return labels


def append_separator(
    input_ids: np.ndarray, labels: np.ndarray, separator_id: int, *, trainable: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """``input_ids`` ending with ``separator_id`` (appended unless already last), and its labels.

    The one rule for an appended separator (EOS): it is a target exactly when the token before it is
    a target (and ``trainable``). A model learns to end what it is trained to write (an answer, a
    whole text) but not to end a prompt or a tool result, which it is never asked to produce.
    """
    if input_ids.size and input_ids[-1] == separator_id:
        return input_ids, labels
    trained = trainable and labels.size > 0 and labels[-1] != IGNORE_INDEX
    return (
        np.append(input_ids, separator_id).astype(input_ids.dtype, copy=False),
        np.append(labels, separator_id if trained else IGNORE_INDEX).astype(labels.dtype, copy=False),
    )


def untokenized(feature: Any, where: str) -> str:
    """Why ``feature`` (named ``where``) cannot be collated: it has no ``input_ids``; what to do with a
    record of a form padless reads from files instead (text, chats, Alpaca, ShareGPT, prompt / completion)."""
    keys = sorted(feature) if isinstance(feature, Mapping) else type(feature).__name__
    return (
        f"{where} has no 'input_ids' ({keys}): collators take token ids; a record of text, chats, Alpaca, "
        "ShareGPT or prompt / completion is tokenized by padless.load_corpus(...) (or trained by padless' "
        "SFTTrainer, which renders it)"
    )
