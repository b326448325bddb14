"""Bin-packing engines behind :func:`padless.planning.plan.plan_packs`: item sizes in, rows out.

Every engine takes ``sizes`` (int64 ``[m]``, each ``1 <= size <= capacity``), the row ``capacity``
and an optional cap on items per row, and returns one shape, :class:`Rows`: per piece, its item, the
offset in the item where it starts, its length, and ``row_offsets`` (row ``r`` holds pieces
``row_offsets[r]:row_offsets[r + 1]``). Only ``wrapped`` cuts items; the others place each item whole
as one piece. Rows come in the order they were opened (``histogram_best_fit``: grouped by pattern), a
row's pieces in placement order. Engines are pure numpy; validation, overlong handling and the public
plan object live in ``padless.planning.plan``.

Best fit decreasing is run on the histogram of sizes (the idea of Krell et al.'s SPFHP), never item by
item and never row by row, yet it makes exactly the rows of textbook best fit decreasing (longest
first; each item into the fullest row it fits, with a free slot under ``max_per_row``; ties to the
lowest-numbered row). Two facts make that possible:

* A run of equal sizes moves whole rows. Once an item of size ``s`` lands in a row with ``c`` tokens
  free, no other row has a free capacity in ``[s, c)``, so the next item of that size goes into the
  same row while it has room: a row takes ``min(c // s, free slots)`` of the run at once.
* Rows opened together with the same contents stay a *group*: a contiguous range of row numbers with
  the same pattern of sizes, free capacity and free slots. A run takes rows from the front of a group
  (its lowest-numbered rows), so groups stay contiguous, and keeping each capacity's groups ordered by
  first row gives textbook best fit's tie-break. The cost is O(D * G) Python steps for D distinct
  sizes and G groups (a few per size), then :func:`_expand`, O(m) counting sorts with a small constant.

``histogram_best_fit`` is the same engine with ties to the oldest group and a seeded choice among equal
sizes. The tests hold the engines to a one-item-at-a-time simulation (``tests/planning/reference.py``):
best fit item for item, the histogram's rows and fills.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import NamedTuple

import numpy as np

_NO_CAP = np.iinfo(np.int64).max  # "no limit on items per row"


class Rows(NamedTuple):
    """What every engine returns: int64 arrays, one entry per piece, grouped row by row."""

    item: np.ndarray
    """``[p]``: the item (position in ``sizes``) each piece comes from."""
    offset: np.ndarray
    """``[p]``: where the piece starts inside its item (0 unless ``wrapped`` cut it)."""
    length: np.ndarray
    """``[p]``: tokens in the piece."""
    row_offsets: np.ndarray
    """``[rows + 1]``: row ``r`` holds pieces ``row_offsets[r]:row_offsets[r + 1]``."""


def _whole(order: np.ndarray, length: np.ndarray, row_offsets: np.ndarray) -> Rows:
    """Rows of whole items: every piece starts at offset 0."""
    return Rows(order, np.zeros(order.size, dtype=np.int64), length, row_offsets)


def stable_argsort(keys: np.ndarray, bound: int) -> np.ndarray:
    """Stable argsort of non-negative int keys ``< bound``; O(n) radix passes when keys are small.

    numpy sorts 16-bit integers with a radix sort, about 8x faster than its merge sort on int64, so
    keys below 2**32 are sorted in two 16-bit least-significant-digit passes.
    """
    if bound <= 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    if bound <= 1 << 32:
        low = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
        high = np.argsort((keys[low] >> 16).astype(np.uint16), kind="stable")
        return low[high]
    return np.argsort(keys, kind="stable")


def histogram(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(values, counts)``: the distinct sizes, ascending, and how many items have each. O(m), no sort
    (``np.bincount``) unless the sizes are sparse (a count array would be mostly zeros)."""
    if sizes.size and int(sizes.max()) > 4 * sizes.size + (1 << 16):
        return np.unique(sizes, return_counts=True)
    hist = np.bincount(sizes)
    values = np.flatnonzero(hist)
    return values, hist[values]


def next_fit(sizes: np.ndarray, capacity: int, max_per_row: int | None) -> Rows:
    """Order-preserving greedy: fill the open row, start a new one when the next item does not fit.

    O(m) for the prefix sums plus O(rows log m): each row's end is found by bisection.
    """
    m = sizes.size
    per_row = max_per_row or _NO_CAP
    ends = np.cumsum(sizes).tolist()  # ends[j] = tokens in items 0..j
    offsets = [0]
    i, used = 0, 0
    while i < m:
        j = bisect_right(ends, used + capacity, lo=i)  # items i..j-1 fit; j > i as sizes <= capacity
        j = min(j, i + per_row)
        offsets.append(j)
        used, i = ends[j - 1], j
    # a copy of the sizes: the plan freezes its arrays, and `sizes` may be the caller's own array
    return _whole(np.arange(m, dtype=np.int64), sizes.copy(), np.asarray(offsets, dtype=np.int64))


def best_fit_decreasing(sizes: np.ndarray, capacity: int, max_per_row: int | None) -> Rows:
    """Textbook best fit decreasing: longest first (ties by position), each item into the fullest row
    it fits (and has a free slot), ties to the lowest-numbered row; rows in opening order.

    Planned on the histogram (:func:`histogram_groups`); equal-size items are handed out in the order
    the item-by-item algorithm places them, so the rows are the textbook ones item for item.
    """
    values, counts = histogram(sizes)
    groups, patterns = histogram_groups(values, counts, capacity, max_per_row, row_order=True)
    return _expand(groups, patterns, sizes, capacity, values, counts, None)


def histogram_best_fit(sizes: np.ndarray, capacity: int, max_per_row: int | None, seed: int) -> Rows:
    """Best fit decreasing with ties to the oldest group (``histogram_groups(row_order=False)``): without
    ``max_per_row`` as many rows as :func:`best_fit_decreasing`, with the same fills, rows grouped by
    pattern. The items of one size are dealt to that size's slots in row order, cyclically from a
    seeded start: ``seed`` picks which of several equal-size items share a row, never the rows' shape.
    """
    values, counts = histogram(sizes)
    groups, patterns = histogram_groups(values, counts, capacity, max_per_row, row_order=False)
    return _expand(groups, patterns, sizes, capacity, values, counts, seed)


def histogram_groups(
    values: np.ndarray, counts: np.ndarray, capacity: int, max_per_row: int | None, *, row_order: bool
) -> tuple[list[list[int]], list[tuple[int, int, int, int]]]:
    """The groups of identical rows that best fit decreasing makes of ``counts[i]`` items of size
    ``values[i]`` (sizes ascending): a function of the histogram alone, so one plan can be made over an
    input whose lengths are never gathered. Returns ``(groups, patterns)``: each group
    ``[key, rows, free slots, pattern id]``, ordered by key; each pattern ``(parent pattern, run size,
    run copies, slots a row)``, a tree whose root is pattern 0 (empty). Patterns of one size are
    numbered in the order best fit filled them.

    ``row_order=True`` is textbook best fit: rows of equal free room are taken lowest-numbered first,
    and a group's key is its first row, so the groups tile the rows in opening order. With
    ``row_order=False`` they are taken oldest group first and the key is a serial number that the rows
    a group gives away keep, so rows come grouped by pattern: the plans ``histogram_best_fit`` and
    :mod:`padless.planning.slots` have always made. Rows of equal free room are interchangeable when
    ``max_per_row`` is None, so both give the same number of rows with the same fills.
    """
    per_row = max_per_row or _NO_CAP
    values = np.asarray(values, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    smallest = int(values[0]) if values.size else 1
    patterns: list[tuple[int, int, int, int]] = [(-1, 0, 0, 0)]  # id -> (parent, size, copies, width)
    buckets: dict[int, list[list[int]]] = {}  # free capacity -> open groups, in the order they are taken
    caps: list[int] = []  # sorted capacities with a non-empty bucket
    closed: list[list[int]] = []  # groups that can take nothing more (no room for the smallest, or no slot)
    num_rows = serial = 0

    def grow(pattern: int, size: int, copies: int) -> int:
        """A new pattern: ``pattern`` plus ``copies`` slots of ``size`` (0 is the empty pattern)."""
        patterns.append((pattern, size, copies, patterns[pattern][3] + copies))
        return len(patterns) - 1

    for size, k in zip(values[::-1].tolist(), counts[::-1].tolist()):
        moved: list[tuple[int, list[int]]] = []  # (new free capacity, group)
        i = bisect_left(caps, size)  # the fullest rows that fit come first
        while k and i < len(caps):
            cap = caps[i]
            groups = buckets[cap]
            g = 0
            while k and g < len(groups):
                key, rows, slots, pattern = groups[g]
                q = min(cap // size, slots)
                full = min(rows, k // q)
                if full:  # the group's first `full` rows take q each
                    moved.append((cap - q * size, [key, full, slots - q, grow(pattern, size, q)]))
                    rows, k = rows - full, k - full * q
                    key += full if row_order else 0  # the rows left start after those
                if rows and 0 < k < q:  # the next row takes the rest of the run
                    serial += 1
                    moved.append((cap - k * size, [key if row_order else serial, 1, slots - k, grow(pattern, size, k)]))
                    rows, k = rows - 1, 0
                    key += 1 if row_order else 0
                if rows:  # k is 0: the group's other rows stay where they are
                    groups[g][:2] = key, rows
                    break
                g += 1
            del groups[:g]
            if groups:
                i += 1
            else:
                del buckets[cap]
                caps.pop(i)
        if k:  # new rows: full ones, then one with the rest
            q = min(capacity // size, per_row)
            full, rest = divmod(k, q)
            for rows, copies in ((full, q), (int(rest > 0), rest)):
                if rows:
                    serial += 1
                    moved.append(
                        (
                            capacity - copies * size,
                            [num_rows if row_order else serial, rows, per_row - copies, grow(0, size, copies)],
                        )
                    )
                    num_rows += rows
        # Re-bucket after the run: every moved row now has less room than `size` (or no slot), so
        # none of them could have taken another item of this run.
        for free, group in moved:
            if free >= smallest and group[2] > 0:
                if free not in buckets:
                    buckets[free] = []
                    insort(caps, free)
                if row_order:
                    insort(buckets[free], group)  # by first row (unique): the bucket stays in row order
                else:
                    buckets[free].append(group)
            else:
                closed.append(group)
    return sorted(closed + [g for cap in caps for g in buckets[cap]], key=lambda g: g[0]), patterns


_BIG_BAND = 256  # items from which a band is copied as a 2D slice: ~ break-even on 1M-10M lengths


def _expand(
    groups: list[list[int]],
    patterns: list[tuple[int, int, int, int]],
    sizes: np.ndarray,
    capacity: int,
    values: np.ndarray,
    counts: np.ndarray,
    seed: int | None,
) -> Rows:
    """Groups of identical rows -> :class:`Rows`: a counting sort, no row loop.

    A group of ``c`` rows of pattern ``(s1 x q1, s2 x q2, ...)`` (``k`` slots a row) is a ``c x k``
    block of ``item``, and each run ``s x q`` of the pattern a ``c x q`` column *band* of it. Every
    band is filled from the items of its size, which one stable counting sort (the radix
    :func:`stable_argsort`, O(m)) lays out size by size, in index order. The slots of a size take
    those items in turn, band by band and row by row inside a band; the bands of a size come in the
    order best fit filled them (``seed=None``: textbook, item for item), or in row order with a seeded
    start ``rot[s]`` among the items of size ``s`` (``seed``: the histogram rule)::

        a group: c = 3 rows of pattern (7 x 1, 2 x 2)
          row 0 | a | p  q |     band 7 x 1 <- the next 3 items of size 7: a b c
          row 1 | b | r  s |     band 2 x 2 <- the next 6 items of size 2: p q r s t u
          row 2 | c | t  u |

    Bands of at least ``_BIG_BAND`` items are copied as 2D slices (a strided copy, a few
    microseconds of Python per band, so at most ``m / _BIG_BAND`` of them); smaller ones are placed
    all together by computed positions (a dozen array operations per item). Both are O(m).
    """
    m = sizes.size
    # parent pattern, run size, run copies, slots a row; per pattern id (a tree: a pattern is its
    # parent plus one run, so a group's bands are the runs on the path from its pattern to the root)
    parent, run_size, run_copies, run_end = np.array(patterns, dtype=np.int64).reshape(-1, 4).T
    g_rows, g_pattern = np.array(groups, dtype=np.int64).reshape(-1, 4)[:, [1, 3]].T
    g_width = run_end[g_pattern]
    offsets = np.zeros(int(g_rows.sum()) + 1, dtype=np.int64)
    np.cumsum(np.repeat(g_width, g_rows), out=offsets[1:])
    order = np.empty(m, dtype=np.int64)
    length = np.empty(m, dtype=np.int64)
    if m == 0:
        return _whole(order, length, offsets)
    g_base = np.cumsum(g_rows * g_width) - g_rows * g_width  # first slot of each group's block
    band_group, band_pattern = [], []
    group, node = np.arange(g_rows.size), g_pattern
    while group.size:  # one level of every group's pattern path at a time (depth = runs per row)
        band_group.append(group)
        band_pattern.append(node)
        node = parent[node]
        group, node = group[node > 0], node[node > 0]
    bg, bp = np.concatenate(band_group), np.concatenate(band_pattern)
    size_arr, copies, col = run_size[bp], run_copies[bp], run_end[bp] - run_copies[bp]
    rows_arr, width, base_arr = g_rows[bg], g_width[bg], g_base[bg]
    items = rows_arr * copies  # items per band
    if seed is None:  # fill order: a pattern's rows were filled in row order when it was made
        by_size = np.lexsort((base_arr, bp, size_arr))
        rot = np.zeros(values.size, dtype=np.int64)
    else:
        by_size = np.lexsort((base_arr, size_arr))
        rot = np.random.default_rng(seed).integers(0, counts)  # seeded start inside each size's items
    cum = np.cumsum(items[by_size])
    slot = np.searchsorted(values, size_arr)  # index of each band's size among the distinct sizes
    first_of_size = np.zeros(values.size, dtype=np.int64)  # items of smaller sizes (start in `sorted_items`)
    np.cumsum(counts[:-1], out=first_of_size[1:])
    cursor = np.empty_like(items)
    cursor[by_size] = cum - items[by_size] - first_of_size[slot[by_size]]  # items of this size before
    start = (cursor + rot[slot]) % counts[slot]  # where the band starts among its size's items
    sorted_items = stable_argsort(sizes, capacity + 1)  # items by size, ascending; ties by index
    for b in np.flatnonzero(items >= _BIG_BAND).tolist():
        n, a, s = int(items[b]), int(start[b]), int(slot[b])
        lo, hi = int(first_of_size[s]), int(first_of_size[s]) + int(counts[s])
        src = sorted_items[lo + a : min(lo + a + n, hi)]
        if src.size < n:  # the band wraps around to the size's first items
            src = np.concatenate((src, sorted_items[lo : lo + n - src.size]))
        r, w, c0, q = int(rows_arr[b]), int(width[b]), int(col[b]), int(copies[b])
        block = slice(int(base_arr[b]), int(base_arr[b]) + r * w)
        order[block].reshape(r, w)[:, c0 : c0 + q] = src.reshape(r, q)
        length[block].reshape(r, w)[:, c0 : c0 + q] = int(size_arr[b])
    small = np.flatnonzero(items < _BIG_BAND)
    if small.size:
        n = items[small]
        band = np.repeat(small, n)  # the band of each of their slots
        t = np.arange(band.size, dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)  # slot within band
        r = t // copies[band]
        pos = base_arr[band] + r * width[band] + col[band] + (t - r * copies[band])
        s = slot[band]
        order[pos] = sorted_items[first_of_size[s] + (start[band] + t) % counts[s]]
        length[pos] = size_arr[band]
    return _whole(order, length, offsets)


def wrapped(sizes: np.ndarray, capacity: int, max_per_row: int | None) -> Rows:
    """Concatenate items in order and cut the stream into rows of ``capacity`` tokens.

    An item cut at a row boundary continues as a new piece (a separate document) at the start of the
    next row. With ``max_per_row`` a row also ends after that many pieces, so it may be shorter than
    capacity.
    """
    m = sizes.size
    ends = np.cumsum(sizes)
    starts = ends - sizes
    total = int(ends[-1]) if m else 0
    if max_per_row is None:
        bounds = np.arange(0, total, capacity, dtype=np.int64)  # token where each row starts
    else:
        ends_list, bounds_list, t, i = ends.tolist(), [], 0, 0
        while t < total:
            bounds_list.append(t)
            last = min(i + max_per_row, m) - 1  # the row can hold pieces of items i..last
            t = min(t + capacity, ends_list[last])
            i = bisect_right(ends_list, t, lo=i)
        bounds = np.asarray(bounds_list, dtype=np.int64)
    if max_per_row is None:  # rows start every `capacity` tokens: a division finds an item's rows
        first, last = starts // capacity, (ends - 1) // capacity
    else:
        first = np.searchsorted(bounds, starts, side="right") - 1
        last = np.searchsorted(bounds, ends - 1, side="right") - 1
    pieces = last - first + 1
    item = np.repeat(np.arange(m, dtype=np.int64), pieces)
    row = first[item] + np.arange(item.size) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    row_end = np.append(bounds[1:], total)
    lo = np.maximum(starts[item], bounds[row])
    hi = np.minimum(ends[item], row_end[row])
    offsets = np.searchsorted(row, np.arange(bounds.size + 1))
    return Rows(item, lo - starts[item], hi - lo, offsets.astype(np.int64))
