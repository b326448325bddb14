"""Does a packed batch fit the model it meets? The check for batches made without the model.

``PackingCollator.for_model(model)`` asks :func:`padless.check_exact` and builds what the model's
backend needs. A model-free ``PackingCollator(max_length=...)`` cannot: it sends a plain block-causal
4D mask that replaces the model's own mask, sliding window and chunks included, and restarted position
ids that models computing their own positions ignore. Such a batch is exact on some models and
silently wrong on others (every sliding-window family, every hybrid, decoders without position ids),
so a collator built without the model refuses to collate until it is fitted to one
(:func:`padless.check_collator`, beside ``for_model`` in :mod:`padless.batching.rowformat`), or unless
it is made with ``model_free=True``, which leaves each batch to :func:`check_batch`.

:func:`check_batch` checks one (model, batch) pair: it reads what the batch carries (a 4D mask, the
varlen kwargs, or position ids alone) and the documents of each row (from the restarted
``position_ids``), asks the exactness rule about this model, backend and longest document, and compares the
batch's mask with the mask the rule's windows call for, entry by entry. padless' own consumers of a
(model, batch) pair call it (``sequence_logprobs``, the guard's checks).

:func:`check_attention_mask` is the model-free half, cheap enough for every step (``model_loss`` runs
it): a batch whose rows hold several documents must carry no ``attention_mask`` or a 4D one that keeps
them apart. transformers looks for packed rows in ``position_ids`` only when ``attention_mask`` is
None, so a 2D mask added to a packed batch (an all-ones one, as many pipelines add) silently lets
every document attend to the documents before it::

    position_ids   0 1 2 0 1          2D mask  1 1 1 1 1  ->  row-causal: query 3 sees keys 0-3
    needed         block-causal: query 3 sees key 3 only, query 4 keys 3-4
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from padless.attention.adapters import base_model_of
from padless.attention.verdict import BATCH_FIX as _FIX
from padless.layout import cu_seqlens_from_lengths

_MASK_FIX = (
    "drop the 'attention_mask' key (the restarted position_ids mark the documents) or let the collator "
    "make the mask (PackingCollator.for_model(model, ...))"
)
_CHECKED: dict[int, tuple[weakref.ref, Any]] = {}
"""``id`` of a 4D mask tensor -> (a weak reference to it, the window it was found to carry): a batch
run twice (a DPO policy and its reference) is compared entry by entry once. Keyed by ``id`` (tensors
compare elementwise), the entry leaves when the tensor is freed."""


def _checked(mask: Any, window: Any) -> bool:
    entry = _CHECKED.get(id(mask))
    return entry is not None and entry[0]() is mask and entry[1] == window


def _remember(mask: Any, window: Any) -> None:
    key = id(mask)
    _CHECKED[key] = (weakref.ref(mask, lambda _ref: _CHECKED.pop(key, None)), window)


def carried_inputs(batch: Mapping[str, Any]) -> str:
    """What ``batch`` carries for attention (:data:`padless.layout.AttentionInputs`): a 4D mask first
    (a hybrid's batch carries ``cu_seq_lens_q/k`` beside it, for its token mixers)."""
    mask = batch.get("attention_mask")
    if isinstance(mask, Mapping) or getattr(mask, "ndim", 0) == 4:
        return "mask4d"
    if "cu_seq_lens_q" in batch or "cu_seq_lens_k" in batch:
        return "varlen"
    if mask is not None:
        return "padding"
    return "position_ids"


def row_documents(batch: Mapping[str, Any]) -> list[list[int]]:
    """The document lengths of each row, read from the restarted ``position_ids``."""
    from padless.layout import lengths_from_position_ids

    positions = batch.get("position_ids")
    if positions is None:
        raise ValueError(f"the batch has no position_ids, so its documents cannot be read; {_FIX}")
    pos = np.asarray(positions.detach().cpu() if hasattr(positions, "detach") else positions)
    if pos.ndim == 3:  # multimodal RoPE: [axes, R, L]; every axis restarts the same way for text
        pos = pos[0]
    return [lengths_from_position_ids(row).tolist() for row in pos.reshape(-1, pos.shape[-1])]


def check_batch(model: Any, batch: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` unless ``model(**batch)`` computes for every packed document exactly what
    the document computes alone, by the exactness rule; return otherwise. Padded batches (a 2D
    ``attention_mask``) pass unchecked: they are not packed. What the batch carries is compared with
    the rule's :class:`padless.attention.verdict.Verdict` by the comparison :func:`padless.check_collator`
    makes of a collator's settings (:func:`padless.attention.verdict.mismatch`), then its 4D masks
    entry by entry with the verdict's windows."""
    from padless.attention import select
    from padless.attention.verdict import mismatch

    check_attention_mask(batch)
    kind = carried_inputs(batch)
    if kind == "padding":  # one document per row (check_attention_mask): a padded batch
        return
    backend = base_model_of(model).config._attn_implementation
    docs = row_documents(batch)
    # where this forward runs (autocast counts), for this batch's longest document
    verdict = select.check_exact(model, backend, max_length=max(max(r) for r in docs))
    reason = mismatch(
        verdict, kind, subject="batch", use_cache=batch.get("use_cache", True), boundaries=_sends_boundaries(batch)
    )
    if reason is not None:
        raise ValueError(reason)
    _check_boundaries(batch, docs)
    blocks = _check_images(batch, verdict, docs)
    if kind == "mask4d":
        _check_masks(batch["attention_mask"], verdict.windows, docs, verdict.mask_dtype, blocks)


def _sends_boundaries(batch: Mapping[str, Any]) -> bool:
    """The batch tells a hybrid's token mixers where its documents lie: ``cu_seq_lens_q/k``, or (a
    peer's batch) ``[B, L]`` text position ids, whose restarts the mixers read where nothing is sent
    (:mod:`padless.attention.mixer_documents`); multi-axis rotary positions alone tell them nothing."""
    if "cu_seq_lens_q" in batch:
        return True
    positions = batch.get("position_ids")
    return positions is not None and getattr(positions, "ndim", 0) == 2


def _check_boundaries(batch: Mapping[str, Any], docs: list[list[int]]) -> None:
    """``cu_seq_lens_q/k`` sent beside the position ids must start the same documents."""
    cu, cu_k = batch.get("cu_seq_lens_q"), batch.get("cu_seq_lens_k")
    if cu is None and cu_k is None:
        return
    if cu is None or cu_k is None or not np.array_equal(_host(cu), _host(cu_k)):
        raise ValueError(f"the batch's cu_seq_lens_q and cu_seq_lens_k differ (or one is missing); {_FIX}")
    expected = cu_seqlens_from_lengths([n for row in docs for n in row])
    if not np.array_equal(_host(cu).astype(np.int64), expected):
        raise ValueError(
            f"the batch's cu_seq_lens_q ({_host(cu).size - 1} documents) do not start the documents its "
            f"position_ids restart at ({expected.size - 1}); {_FIX}"
        )


def _check_images(batch: Mapping[str, Any], verdict: Any, docs: list[list[int]]) -> np.ndarray | None:
    """Raise unless a batch's images are exact on the verdict's model: the family packs images
    (:attr:`padless.attention.verdict.Verdict.images_reason`), Qwen-VL positions are each document's
    own 3-D rope index; returns the bidirectional image blocks its 4D mask must carry (``None``: none)."""
    from padless.attention import multimodal

    given = multimodal.image_inputs(batch)
    if not given:
        return None
    if verdict.images_reason is not None:
        raise ValueError(
            f"this batch carries image inputs ({', '.join(given)}) that are not exact here: {verdict.images_reason}"
        )

    scheme = verdict.vision
    if scheme.positions == "rope3d":
        positions = batch.get("position_ids")
        pos = None if positions is None else _host(positions)
        if pos is None or pos.ndim != 3 or pos.shape[0] != 4:
            shape = None if pos is None else pos.shape
            raise ValueError(
                f"this batch carries images for {scheme.family}, whose positions are a 3-D rope index per "
                f"document, sent as position_ids [4, R, L] (text positions first), but its position_ids "
                f"have shape {shape}; {_FIX}"
            )
        expected = multimodal.rope_positions(batch, scheme, docs)
        if not np.array_equal(pos[1:], expected):
            raise ValueError(
                f"this batch's 3-D position_ids are not each document's own rope index ({scheme.family} "
                f"computes them per document); {_FIX}"
            )
    if scheme.blocks is None:
        return None
    types = batch.get("token_type_ids")
    if types is None:
        raise ValueError(f"this batch carries images for {scheme.family} without token_type_ids; {_FIX}")
    return multimodal.block_ids(_host(types), scheme, docs)


def _check_masks(mask: Any, windows: Any, docs: list[list[int]], dtype: Any, blocks: np.ndarray | None = None) -> None:
    from padless.attention.masks import additive_block_causal_mask

    if isinstance(windows, dict):
        if not isinstance(mask, Mapping) or set(windows) - set(mask):
            raise ValueError(
                f"the model's layer types need masks with sliding windows {windows}, this batch "
                f"carries one block-causal mask; {_FIX}"
            )
        wanted = {t: (mask[t], w) for t, w in windows.items()}
    else:
        masks = list(mask.values()) if isinstance(mask, Mapping) else [mask]
        wanted = {str(i): (m, windows) for i, m in enumerate(masks)}
    for name, (m, window) in wanted.items():
        if m.dtype != dtype:
            raise ValueError(f"the batch's 4D mask is {m.dtype}, the model computes in {dtype}; {_FIX}")
        if blocks is None and _checked(m, window):
            continue
        expected = additive_block_causal_mask(docs, dtype=m.dtype, device=m.device, window=window, blocks=blocks)
        if expected.shape != m.shape or not bool(((m == 0) == (expected == 0)).all()):
            what = f"a sliding window of {window} tokens" if window is not None else "no sliding window"
            if blocks is not None:
                what += " and each image's tokens attending to each other"
            raise ValueError(
                f"the batch's 4D mask ({name}) is not the block-causal mask with {what} that this model needs; {_FIX}"
            )
        if blocks is None:
            _remember(m, window)


def check_attention_mask(batch: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming ``attention_mask`` unless the batch's mask can keep its documents
    apart; model-free and ``O(rows x length)``, so every step can afford it.

    * no ``attention_mask``: nothing to check here (:func:`check_batch` judges position ids alone);
    * a 2D mask ``[B, L]`` (the shape of ``input_ids``): only where every row holds one document (a
      padded batch). On packed rows (position ids restarting inside the attended tokens, several
      placed pieces in a row, or varlen ``cu_seq_lens``) transformers skips its packed-row detection;
    * a 4D mask (or a dict of them, per layer type) ``[B, 1 | heads, L, L]``: no query may see the
      row's first key or the key just before its own document (read from the restarted position
      ids); :func:`check_batch` compares the whole mask with the model's;
    * any other shape is refused.
    """
    mask = batch.get("attention_mask")
    if mask is None:
        return
    shape = _tokens_shape(batch)
    masks = list(mask.values()) if isinstance(mask, Mapping) else [mask]
    for m in masks:
        ndim = getattr(m, "ndim", None)
        got = tuple(getattr(m, "shape", ()))
        if ndim == 2 and not isinstance(mask, Mapping):
            if shape is not None and got != shape:
                raise ValueError(
                    f"the batch's attention_mask has shape {got}, its input_ids {shape}; a 2D mask "
                    f"must match them (one document per row); {_MASK_FIX}"
                )
            packed = _packed_rows(batch, m)
            if packed:
                raise ValueError(
                    f"this batch is packed ({packed}) and carries a 2D attention_mask {got}: "
                    "transformers then skips its packed-row detection, so the documents of a row "
                    f"attend to each other; {_MASK_FIX}"
                )
            continue
        if ndim != 4:
            raise ValueError(
                f"the batch's attention_mask has shape {got}: padless reads a 2D mask [B, L] (one "
                "document per row) or a 4D mask [B, 1, L, L] (a dict of them per layer type), "
                f"not this; {_MASK_FIX}"
            )
        if shape is not None and (got[0] not in (1, shape[0]) or got[2:] != (shape[1], shape[1])):
            raise ValueError(
                f"the batch's 4D attention_mask has shape {got}, its input_ids {shape}; it must be "
                f"[{shape[0]}, 1, {shape[1]}, {shape[1]}]; {_MASK_FIX}"
            )
        if not is_tree(batch):  # a shared prompt's tree mask shows the prompt to every completion, by design
            _check_blocks(batch, m)


def is_tree(batch: Mapping[str, Any]) -> bool:
    """Whether the batch's placements put a completion after a shared prompt (a piece whose first token
    is predicted from somewhere other than the token just before it)."""
    pl = getattr(batch, "placements", None)
    prev = getattr(pl, "prev_offset", None)
    return prev is not None and bool((np.asarray(prev) != np.asarray(pl.offset) - 1).any())


def _tokens_shape(batch: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(B, L)`` of the batch's tokens (``input_ids``, else ``labels``, else ``inputs_embeds``)."""
    for key in ("input_ids", "labels", "inputs_embeds"):
        value = batch.get(key)
        if value is not None and getattr(value, "ndim", 0) >= 2:
            return tuple(int(n) for n in value.shape[:2])  # type: ignore[return-value]
    return None


def _host(value: Any) -> np.ndarray:
    return np.asarray(value.detach().cpu() if hasattr(value, "detach") else value)


def _packed_rows(batch: Mapping[str, Any], mask2d: Any) -> str:
    """Why the batch's rows hold several documents (empty if they do not)."""
    rows = _host(mask2d).shape[0]
    cu = batch.get("cu_seq_lens_q", batch.get("cu_seq_lens_k"))
    if cu is not None and _host(cu).size - 1 > rows:
        return f"cu_seq_lens_q holds {_host(cu).size - 1} documents for {rows} rows"
    placements = getattr(batch, "placements", None)
    if placements is not None and placements.row.size:
        per_row = np.bincount(np.asarray(placements.row, dtype=np.int64))
        if per_row.max() > 1:
            return f"row {int(per_row.argmax())} holds {int(per_row.max())} placed pieces"
    positions = batch.get("position_ids")
    if positions is not None:
        pos = _host(positions)
        if pos.ndim == 3:  # multimodal RoPE [axes, R, L]: the text axes restart alike
            pos = pos[0]
        attended = _host(mask2d) != 0
        if pos.shape == attended.shape:
            starts = ((pos == 0) & attended).sum(axis=1)
            if starts.max(initial=0) > 1:
                r = int(starts.argmax())
                return f"the position_ids of row {r} restart at 0 {int(starts[r])} times"
    return ""


def _check_blocks(batch: Mapping[str, Any], mask: Any) -> None:
    """A 4D mask must hide, from every query of a row's second or later document, the key just before
    its document and the row's first key (a causal mask without document blocks shows both)."""
    positions = batch.get("position_ids")
    if positions is None or not isinstance(mask, torch.Tensor) or not isinstance(positions, torch.Tensor):
        return
    if mask.dtype == torch.bool:
        visible = lambda m: m  # noqa: E731
    elif mask.is_floating_point():
        visible = lambda m: m == 0  # noqa: E731  additive: 0 where attended
    else:
        return  # an integer 4D mask: its convention is the model's to read
    pos = positions[0] if positions.dim() == 3 else positions
    if pos.dim() != 2 or pos.shape[-1] != mask.shape[-1]:
        return
    pos = pos.to(mask.device).long()
    q = torch.arange(pos.shape[1], device=mask.device).expand_as(pos)
    start = q - pos  # where each query's document starts
    later = (start > 0) & (pos >= 0)
    if not bool(later.any()):
        return
    b, qq = later.nonzero(as_tuple=True)
    before = (start[b, qq] - 1).clamp(min=0)
    rows = b if mask.shape[0] == pos.shape[0] else torch.zeros_like(b)
    for key in (before, torch.zeros_like(before)):
        seen = visible(mask[rows, :, qq, key])  # [K, heads]
        if bool(seen.any()):
            k = int(seen.any(dim=-1).nonzero()[0, 0])
            raise ValueError(
                f"the batch's 4D attention_mask lets query {int(qq[k])} of row {int(b[k])} see key "
                f"{int(key[k])}, in an earlier document (the position_ids restart at "
                f"{int(start[b[k], qq[k]])}): it is not block-causal; {_MASK_FIX}"
            )
