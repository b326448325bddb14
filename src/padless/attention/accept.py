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
``position_ids``), asks the one rule about this model, backend and longest document, and compares the
batch's mask with the one the rule's windows call for, entry by entry. padless' own consumers of a
(model, batch) pair call it (``sequence_logprobs``, the guard's checks).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from padless.attention.adapters import base_model_of

_FIX = "build the collator with PackingCollator.for_model(model, ...)"
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
    """What ``batch`` carries for attention (:data:`padless.attention.select.AttentionInputs`)."""
    if "cu_seq_lens_q" in batch or "cu_seq_lens_k" in batch:
        return "varlen"
    mask = batch.get("attention_mask")
    if isinstance(mask, Mapping) or getattr(mask, "ndim", 0) == 4:
        return "mask4d"
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
    the document computes alone, by the one rule; return otherwise. Padded batches (a 2D
    ``attention_mask``) pass unchecked: they are not packed."""
    from padless.attention.select import (
        attention_free,
        backend_inputs,
        check_exact,
        compute_target,
        mask_windows,
        model_inputs,
    )

    kind = carried_inputs(batch)
    if kind == "padding":
        return
    inner = base_model_of(model)
    backend = inner.config._attn_implementation
    docs = row_documents(batch)
    longest = max(max(r) for r in docs)
    device, dtype = compute_target(inner)  # where this forward runs (autocast counts)
    check_exact(model, backend, device=device, dtype=dtype, max_length=longest)
    needed = model_inputs(model, backend)
    if kind == "position_ids" and backend_inputs(backend) == "mask4d" and not attention_free(model):
        from padless.attention.rules import attention_rules

        if not attention_rules(model).masks_from_position_ids:
            raise ValueError(f"this batch carries position_ids alone, and {type(inner).__name__} does not build its "
                             f"masks from them, so its documents would attend to each other; {_FIX}")  # fmt: skip
        if batch.get("use_cache", True) is not False:
            raise ValueError("this batch carries position_ids alone without use_cache=False; with a cache transformers "
                             f"does not look for documents in them; {_FIX}")  # fmt: skip
        return
    if kind != needed:
        raise ValueError(f"this batch carries {kind!r} attention inputs, but attn_implementation={backend!r} "
                         f"isolates documents only with {needed!r}; {_FIX}")  # fmt: skip
    if kind != "mask4d":
        return
    _check_masks(batch["attention_mask"], mask_windows(model, longest), docs, inner.dtype)


def _check_masks(mask: Any, windows: Any, docs: list[list[int]], dtype: Any) -> None:
    from padless.attention.masks import additive_block_causal_mask

    if isinstance(windows, dict):
        if not isinstance(mask, Mapping) or set(windows) - set(mask):
            raise ValueError(f"the model's layer types need masks with sliding windows {windows}, this batch "
                             f"carries one block-causal mask; {_FIX}")  # fmt: skip
        wanted = {t: (mask[t], w) for t, w in windows.items()}
    else:
        masks = list(mask.values()) if isinstance(mask, Mapping) else [mask]
        wanted = {str(i): (m, windows) for i, m in enumerate(masks)}
    for name, (m, window) in wanted.items():
        if m.dtype != dtype:
            raise ValueError(f"the batch's 4D mask is {m.dtype}, the model computes in {dtype}; {_FIX}")
        if _checked(m, window):
            continue
        expected = additive_block_causal_mask(docs, dtype=m.dtype, device=m.device, window=window)
        if expected.shape != m.shape or not bool(((m == 0) == (expected == 0)).all()):
            what = f"a sliding window of {window} tokens" if window is not None else "no sliding window"
            raise ValueError(f"the batch's 4D mask ({name}) is not the block-causal mask with {what} that this "
                             f"model needs; {_FIX}")  # fmt: skip
        _remember(m, window)
