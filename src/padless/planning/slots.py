"""One plan over a whole input from its length histogram, and the rule that places each sequence.

A cluster packing (``padless pack``, :mod:`padless.export.parquet`) never gathers the lengths: every
logical shard of the input sends a histogram (``counts[L]``: sequences of length ``L``, a few KiB),
the driver adds them up and plans from the sum, and every shard then places its own sequences::

    shard 0  lengths [5, 3, 5]       counts    L=3: 1+1   L=5: 2+0   (shard 0 + shard 1)
    shard 1  lengths [3]             the plan: rows of slots, e.g. row 0 = [5, 3], row 1 = [5, 3]
    rule     the k-th sequence of length L in input order takes the k-th slot of length L (in row order)
             shard 1's first 3 is the 2nd 3 of the input (shard 0 holds one): row 1, after the 5

The plan is best fit decreasing run on the histogram (:func:`padless.planning._binpack.histogram_groups`,
the engine of ``histogram_best_fit``): as many rows as item-by-item best fit decreasing, with the same
fills. It is held as *bands*: a group of ``rows`` identical rows whose pattern has a run of
``copies`` slots of one ``size`` at token offset ``start`` in each row. A band is a ``rows x copies``
block of slots; the slots of one size are numbered band by band in row order, row by row inside a
band. The plan is a function of the merged histogram only, and a shard's placement of the histograms
of the shards before it, so the rows are the same however the input is cut and whoever runs a shard.

:func:`reference_placement` is the slow, obvious version (sort every sequence by length, enumerate
every slot); the tests hold :meth:`SlotPlan.place` equal to it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from padless.planning import _binpack
from padless.planning.checks import check_int
from padless.planning.plan import PlanStats


@dataclass(frozen=True, eq=False)
class SlotPlan:
    """Rows of slots planned from a length histogram; bands sorted by (size, first row)."""

    max_length: int
    """Tokens per row."""
    counts: np.ndarray
    """``[max_length + 1]`` int64: the merged histogram the plan was made from (``counts[0] == 0``)."""
    group_rows: np.ndarray
    """``[G]`` int64: rows of each group of identical rows, groups in row order."""
    group_fill: np.ndarray
    """``[G]`` int64: tokens in each row of the group."""
    group_pieces: np.ndarray
    """``[G]`` int64: sequences in each row of the group."""
    band_size: np.ndarray
    """``[B]`` int64: the length of the band's slots."""
    band_rows: np.ndarray
    """``[B]`` int64: rows of the band (its group's rows)."""
    band_copies: np.ndarray
    """``[B]`` int64: slots of the band in each row."""
    band_row0: np.ndarray
    """``[B]`` int64: the band's first row."""
    band_start: np.ndarray
    """``[B]`` int64: token offset of the band's first slot in a row."""
    band_slot0: np.ndarray
    """``[B + 1]`` int64: global number of the band's first slot (slots numbered size by size, bands in
    order); the last entry is the number of slots."""
    size_slot0: np.ndarray
    """``[max_length + 2]`` int64: global number of the first slot of each size."""

    @property
    def num_rows(self) -> int:
        return int(self.group_rows.sum())

    @property
    def num_sequences(self) -> int:
        return int(self.counts.sum())

    @property
    def tokens(self) -> int:
        return int((self.group_rows * self.group_fill).sum())

    def row_fills(self, begin: int, end: int) -> np.ndarray:
        """``[end - begin]`` int64: tokens in rows ``begin .. end - 1`` (without a row-sized array)."""
        first = np.concatenate(([0], np.cumsum(self.group_rows)))
        lo = int(np.searchsorted(first, begin, side="right")) - 1
        hi = int(np.searchsorted(first, end, side="left"))
        rows = np.clip(first[lo + 1 : hi + 1], begin, end) - np.clip(first[lo:hi], begin, end)
        return np.repeat(self.group_fill[lo:hi], rows)

    def stats(self, **overlong: int) -> PlanStats:
        """The plan's :class:`padless.planning.plan.PlanStats`; ``overlong`` adds the counts of what the
        overlong policy did before planning (``num_sequences`` counts input sequences then)."""
        num_sequences = overlong.pop("num_sequences", self.num_sequences)
        return PlanStats.of_rows(
            max_length=self.max_length,
            num_sequences=num_sequences,
            num_rows=self.num_rows,
            real_tokens=self.tokens,
            pieces=self.num_sequences,
            max_per_row=int(self.group_pieces.max()) if self.group_pieces.size else 0,
            **overlong,
        )

    def digest(self) -> str:
        """A hash of the plan (what a rerun compares before it trusts finished shards)."""
        h = hashlib.blake2b(digest_size=16)
        h.update(str(self.max_length).encode())
        for a in (
            self.counts,
            self.group_rows,
            self.group_fill,
            self.band_size,
            self.band_copies,
            self.band_row0,
            self.band_start,
        ):
            h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
        return h.hexdigest()

    def place(self, lengths: np.ndarray, before: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(row, token offset in the row)`` of each sequence of one shard.

        ``lengths``: the shard's sequence lengths in input order (each in ``1..max_length``);
        ``before``: ``[max_length + 1]`` counts of each length in the shards before it. The k-th
        sequence of length L of the input takes the k-th slot of length L.
        """
        lengths = np.asarray(lengths, dtype=np.int64)
        before = np.asarray(before, dtype=np.int64)
        if lengths.size and (int(lengths.min()) < 1 or int(lengths.max()) > self.max_length):
            raise ValueError(f"lengths must lie in [1, {self.max_length}]")
        order = _binpack.stable_argsort(lengths, self.max_length + 1)  # by length, ties in input order
        own = np.bincount(lengths, minlength=self.max_length + 1)
        if ((before + own) > self.counts).any():
            size = int(np.flatnonzero((before + own) > self.counts)[0])
            raise ValueError(
                f"the shard's sequences of length {size} are not in the plan's histogram "
                "(the plan was made from other shards)"
            )
        first = np.concatenate(([0], np.cumsum(own)))  # where each length starts in `order`
        sorted_len = lengths[order]
        rank = np.arange(lengths.size, dtype=np.int64) - first[sorted_len]
        slot = np.empty(lengths.size, dtype=np.int64)
        slot[order] = self.size_slot0[sorted_len] + before[sorted_len] + rank
        band = np.searchsorted(self.band_slot0, slot, side="right") - 1
        t = slot - self.band_slot0[band]
        copies = self.band_copies[band]
        r, c = np.divmod(t, copies)
        return self.band_row0[band] + r, self.band_start[band] + c * self.band_size[band]


def by_row(rows: np.ndarray, num_rows: int) -> np.ndarray:
    """Stable order of ``rows`` (a counting sort: O(n)), so a writer finds a row range by binary search."""
    return _binpack.stable_argsort(np.asarray(rows, dtype=np.int64), max(num_rows, 1))


def plan_histogram(counts: np.ndarray, max_length: int) -> SlotPlan:
    """Best fit decreasing over ``counts[L]`` sequences of each length ``L`` (``[max_length + 1]``,
    ``counts[0]`` must be 0: an empty sequence has no slot)."""
    max_length = check_int(max_length, "max_length")
    counts = np.asarray(counts, dtype=np.int64)
    if counts.shape != (max_length + 1,):
        raise ValueError(f"counts must have max_length + 1 = {max_length + 1} entries, got shape {counts.shape}")
    if counts[0] or (counts < 0).any():
        raise ValueError("counts[0] must be 0 and no count negative (empty sequences have no slot)")
    values = np.flatnonzero(counts)
    groups, patterns = _binpack.histogram_groups(values, counts[values], max_length, None, row_order=False)
    parent, size, copies, _ = (
        np.array(patterns, dtype=np.int64).reshape(-1, 4).T if patterns else np.zeros((4, 0), dtype=np.int64)
    )
    # token offset where each pattern's last run ends (a pattern is its parent plus one run)
    tok_end = np.zeros(len(patterns), dtype=np.int64)
    pieces = np.zeros(len(patterns), dtype=np.int64)
    for p in range(1, len(patterns)):  # parents come before children
        tok_end[p] = tok_end[parent[p]] + size[p] * copies[p]
        pieces[p] = pieces[parent[p]] + copies[p]
    g = np.array(groups, dtype=np.int64).reshape(-1, 4)
    g_rows, g_pattern = g[:, 1], g[:, 3]  # groups: [key, rows, free slots, pattern], in row order
    g_row0 = np.cumsum(g_rows) - g_rows
    bands = []  # (size, rows, copies, row0, start) for every run on every group's pattern path
    for rows, node, row0 in zip(g_rows.tolist(), g_pattern.tolist(), g_row0.tolist()):
        while node > 0:
            bands.append(
                (int(size[node]), rows, int(copies[node]), row0, int(tok_end[node] - size[node] * copies[node]))
            )
            node = int(parent[node])
    b = np.array(bands, dtype=np.int64).reshape(-1, 5)
    b = b[np.lexsort((b[:, 3], b[:, 0]))]
    items = b[:, 1] * b[:, 2]
    slot0 = np.concatenate(([0], np.cumsum(items)))
    size_slot0 = np.concatenate(([0], np.cumsum(counts)))  # [max_length + 2]
    plan = SlotPlan(
        max_length=max_length,
        counts=counts,
        group_rows=g_rows,
        group_fill=tok_end[g_pattern],
        group_pieces=pieces[g_pattern],
        band_size=b[:, 0],
        band_rows=b[:, 1],
        band_copies=b[:, 2],
        band_row0=b[:, 3],
        band_start=b[:, 4],
        band_slot0=slot0,
        size_slot0=size_slot0,
    )
    per_size = np.bincount(b[:, 0], weights=items, minlength=max_length + 1).astype(np.int64)
    if not np.array_equal(per_size, counts):  # the engine's promise: one slot per sequence
        raise AssertionError("the histogram plan's slots do not match the histogram")
    return plan


def merge_histograms(histograms: list[np.ndarray], max_length: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(total, before)``: the sum of the shards' histograms, and for each shard the counts of the
    shards before it (its prefix sum), which :meth:`SlotPlan.place` takes."""
    total = np.zeros(max_length + 1, dtype=np.int64)
    before = []
    for h in histograms:
        before.append(total.copy())
        total += np.asarray(h, dtype=np.int64)
    return total, before


def reference_placement(lengths: np.ndarray, plan: SlotPlan) -> tuple[np.ndarray, np.ndarray]:
    """The slow reference of :meth:`SlotPlan.place` for a whole input: list every slot of every row
    explicitly, then hand the slots of each length out in order to that length's sequences in input
    order. O(slots) Python steps: for tests."""
    slots: dict[int, list[tuple[int, int]]] = {}
    for s, rows, copies, row0, start in zip(
        plan.band_size.tolist(),
        plan.band_rows.tolist(),
        plan.band_copies.tolist(),
        plan.band_row0.tolist(),
        plan.band_start.tolist(),
    ):
        for r in range(rows):
            for c in range(copies):
                slots.setdefault(s, []).append((row0 + r, start + c * s))
    taken: dict[int, int] = {}
    row, offset = [], []
    for n in np.asarray(lengths).tolist():
        k = taken.get(n, 0)
        taken[n] = k + 1
        row.append(slots[n][k][0])
        offset.append(slots[n][k][1])
    return np.array(row, dtype=np.int64), np.array(offset, dtype=np.int64)
