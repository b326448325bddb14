"""Batch samplers and pre-planned packed rows.

- :class:`LengthGroupedBatchSampler`: bucketing. Batches of similar lengths (so pad-to-longest wastes
  little), by example count or by a token budget, shuffled and reproducible from a seed and epoch.
- :class:`PackedRows`: a dataset whose items are whole packed rows, planned once over the whole
  dataset (a fixed token budget per row). Each item is a feature with ``input_ids``, ``labels`` and
  ``seq_lengths`` (the documents of the row), which :class:`padless.PackingCollator` places as they
  are, without re-planning.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class LengthGroupedBatchSampler:
    """Yields lists of indices whose lengths are close, in a shuffled order.

    The indices are shuffled, cut into mega-batches of ``batch_size * mega_batch_mult`` examples,
    sorted by length inside each mega-batch and cut into batches; the batch order is shuffled again.
    With ``max_tokens``, a batch grows while ``len(batch) * longest <= max_tokens`` (its padded size).
    """

    lengths: Sequence[int] | np.ndarray
    """Token length of every example of the dataset."""
    batch_size: int | None = None
    """Examples per batch (give this or ``max_tokens``)."""
    max_tokens: int | None = None
    """Padded tokens per batch (batch size x longest member) instead of a fixed count."""
    mega_batch_mult: int = 50
    """How many batches' worth of examples are sorted together; larger = less padding, less randomness."""
    seed: int = 0
    """Seed of the shuffles; the epoch is added to it (:meth:`set_epoch`)."""
    shuffle: bool = True
    """Shuffle examples and batch order; without it batches follow sorted order within mega-batches."""
    drop_last: bool = False
    """Drop a last batch smaller than ``batch_size``."""
    epoch: int = 0

    def __post_init__(self) -> None:
        self.lengths = np.asarray(self.lengths, dtype=np.int64)
        if (self.batch_size is None) == (self.max_tokens is None):
            raise ValueError("give exactly one of batch_size and max_tokens")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.max_tokens is not None and self.lengths.size and self.max_tokens < self.lengths.max():
            i = int(np.argmax(self.lengths))
            raise ValueError(f"max_tokens={self.max_tokens} is smaller than example {i} ({int(self.lengths[i])} tokens)")

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self) -> list[list[int]]:
        rng = np.random.default_rng(self.seed + self.epoch)
        n = self.lengths.size
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        per_mega = (self.batch_size or max(1, int(self.max_tokens // max(1, np.median(self.lengths))))) * self.mega_batch_mult
        out: list[list[int]] = []
        for s in range(0, n, per_mega):
            mega = order[s : s + per_mega]
            mega = mega[np.argsort(-self.lengths[mega], kind="stable")]
            out.extend(self._cut(mega))
        if self.drop_last and self.batch_size and out and len(out[-1]) < self.batch_size:
            out.pop()
        if self.shuffle:
            out = [out[i] for i in rng.permutation(len(out))]
        return out

    def _cut(self, sorted_idx: np.ndarray) -> list[list[int]]:
        if self.batch_size is not None:
            return [sorted_idx[i : i + self.batch_size].tolist() for i in range(0, sorted_idx.size, self.batch_size)]
        batches: list[list[int]] = []
        current: list[int] = []
        longest = 0
        for i in sorted_idx.tolist():
            grown = max(longest, int(self.lengths[i]))
            if current and grown * (len(current) + 1) > self.max_tokens:
                batches.append(current)
                current, grown = [], int(self.lengths[i])
            current.append(i)
            longest = grown
        if current:
            batches.append(current)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches())

    def __len__(self) -> int:
        return len(self.batches())


class PackedRows:
    """A map-style dataset of packed rows planned once over ``features``.

    Item ``r`` is ``{"input_ids", "labels", "seq_lengths"}``: the documents of row ``r``
    concatenated, and their lengths. :attr:`plan` keeps the statistics (truncated/dropped counts).
    """

    def __init__(
        self,
        features: Sequence[Mapping[str, Any]],
        max_length: int,
        *,
        strategy: str = "best_fit_decreasing",
        overlong: str = "error",
        seed: int = 0,
    ) -> None:
        from padless.collate import FeatureSpec
        from padless.distributed import PackedRowView
        from padless.plan import plan_packs

        self.sequences = FeatureSpec().prepare(features)
        self.plan = plan_packs(self.sequences.lengths, max_length, strategy=strategy, overlong=overlong, seed=seed)
        validated = [{"input_ids": i, "labels": l} for i, l in zip(self.sequences.input_ids, self.sequences.labels)]
        self._rows = PackedRowView(validated)  # assembles a row from its (sequence, start, length) pieces

    def __len__(self) -> int:
        return self.plan.num_rows

    def __getitem__(self, r: int) -> dict[str, Any]:
        if not 0 <= r < len(self):
            raise IndexError(f"row {r} out of range [0, {len(self)})")
        index, start, length = self.plan.row(r)
        return self._rows[tuple(zip(index.tolist(), start.tolist(), length.tolist()))]
