"""The packed batch contract: what every collator returns and every consumer (losses, log-probs,
verification, the guard, evaluation) reads.

- :class:`PackedBatch`: the dict ``model(**batch)`` takes, plus :class:`Placements` as an attribute.
- :class:`Placements`: where every piece of every feature went (parallel numpy arrays), built
  straight from a flat plan's arrays (:meth:`Placements.from_plan`).
- :data:`NOT_FORWARD`, :func:`forward_inputs`: the keys a loss reads that never reach ``forward()``.
- :func:`batch_to`: a batch moved to a device; :func:`device_of` (from :mod:`padless.devices`): a model's device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from padless.attention.host import remember_moved
from padless.devices import device_of  # noqa: F401 (re-exported: a model's device)


@dataclass(frozen=True)
class Placements:
    """Where every piece of every feature of a packed batch went: parallel int64 arrays, one entry per
    piece, in row order (a feature split by ``overlong="split"`` has several pieces; a dropped one
    none). ``feature`` is the index in the list given to the collator; ``start`` where the piece
    begins inside that feature (after validation and separator); ``row`` and ``offset`` where it
    begins in the batch; ``length`` its tokens. Consumers (:mod:`padless.isolation.verify`, per-sequence
    log-probs) read features back from here instead of re-running the planner."""

    feature: np.ndarray
    start: np.ndarray
    row: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    num_features: int
    """Features given to the collator (dropped ones included)."""
    prev_offset: np.ndarray | None = None
    """Per piece, the in-row offset of the token whose logits predict the piece's first token, or -1
    when nothing predicts it (a document start, whose label is masked). ``None``: all -1 (ordinary
    packing). A shared-prompt completion sets the offset of the prompt's last token. The piece's
    later tokens are predicted by the position before them in the same row (the causal shift)."""

    @classmethod
    def from_plan(
        cls, *, index: np.ndarray, start: np.ndarray, length: np.ndarray, row_offsets: np.ndarray, num_features: int
    ) -> Placements:
        """The placements of a flat plan (:class:`padless.PackPlan`'s arrays of the same names): row
        ``r`` holds pieces ``row_offsets[r]:row_offsets[r + 1]``, laid end to end from offset 0::

            index [2, 3, 0, 1]  start [0, 0, 0, 0]  length [6, 2, 5, 3]  row_offsets [0, 2, 4]
            -> row [0, 0, 1, 1]  offset [0, 6, 0, 5]
        """
        index, start, length, row_offsets = (np.asarray(a, dtype=np.int64) for a in (index, start, length, row_offsets))
        counts = np.diff(row_offsets)
        before = np.concatenate([[0], np.cumsum(length)])  # tokens before each piece, over all rows
        offset = before[:-1] - np.repeat(before[row_offsets[:-1]], counts)
        return cls(
            feature=index,
            start=start,
            row=np.repeat(np.arange(counts.size, dtype=np.int64), counts),
            offset=offset,
            length=length,
            num_features=num_features,
        )

    @property
    def num_rows(self) -> int:
        """Rows holding at least one piece (``row.max() + 1``)."""
        return int(self.row[-1]) + 1 if self.row.size else 0

    def row_pieces(self, r: int) -> np.ndarray:
        """``[k, 3]`` ``(feature, start, length)`` of row ``r``'s pieces, in row order (what
        :func:`padless.layout.build_row` takes)."""
        lo, hi = np.searchsorted(self.row, [r, r + 1])
        return np.stack([self.feature[lo:hi], self.start[lo:hi], self.length[lo:hi]], axis=1)

    def prev_offsets(self) -> np.ndarray:
        """:attr:`prev_offset` as an array, -1 filled in when it is ``None``."""
        return np.full(self.feature.size, -1, dtype=np.int64) if self.prev_offset is None else self.prev_offset

    def of_feature(self, i: int) -> list[tuple[int, int, int, int]]:
        """``(start, row, offset, length)`` of each piece of feature ``i``, in the feature's order."""
        sel = np.flatnonzero(self.feature == i)
        sel = sel[np.argsort(self.start[sel], kind="stable")]
        return [(int(self.start[j]), int(self.row[j]), int(self.offset[j]), int(self.length[j])) for j in sel]


class PackedBatch(dict):
    """A packed batch: the dict a model's ``forward()`` takes (``model(**batch)``), plus
    :attr:`placements`, an attribute, so it never reaches ``forward()`` as a keyword. Code that rebuilds
    the dict as ``type(batch)(...)`` (transformers' ``Trainer`` moving it to a device) gets one without
    placements (``None``); :func:`batch_to` keeps them."""

    def __init__(self, data: Mapping[str, Any] = (), placements: Placements | None = None) -> None:
        super().__init__(data)
        self.placements = placements


NOT_FORWARD = ("labels", "loss_weights")
"""Batch keys that padless' loss functions read and that never go to the model's ``forward()``."""


def forward_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``model(**...)`` for a collated batch: every key but :data:`NOT_FORWARD`."""
    return {k: v for k, v in batch.items() if k not in NOT_FORWARD}


def batch_to(batch: Mapping[str, Any], device: Any) -> dict[str, Any]:
    """A collated batch with every tensor moved to ``device`` (python values such as
    ``use_cache`` and ``max_length_q`` pass through; a :class:`PackedBatch` keeps its placements).
    The boundary tensors' host values are remembered (:func:`padless.attention.host.remember_moved`),
    so the padless attention reads them without waiting for the device."""
    move = lambda v: v.to(device, non_blocking=True) if hasattr(v, "to") else v  # noqa: E731
    # a dict value is a 4D mask per layer type (models whose layers differ in sliding window)
    moved = {k: {t: move(m) for t, m in v.items()} if isinstance(v, dict) else move(v) for k, v in batch.items()}
    remember_moved(batch, moved)  # the attention reads the boundaries from the host copies: no device sync
    return type(batch)(moved, batch.placements) if isinstance(batch, PackedBatch) else moved
