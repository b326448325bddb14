"""Bin-packing engines behind :func:`padless.planning.plan.plan_packs`: item sizes in, rows out.

Every engine takes ``sizes`` (int64 ``[m]``, each ``1 <= size <= capacity``), the row ``capacity``
and an optional cap on items per row, and returns ``(order, row_offsets)``: ``order`` (int64 ``[m]``)
lists item positions row by row, each row's items in placement order, and row ``r`` holds
``order[row_offsets[r]:row_offsets[r + 1]]``. Rows come in the order they were opened. ``wrapped``,
which cuts items, returns pieces instead. Engines are pure numpy; validation, overlong handling and
the public plan object live in ``padless.planning.plan``.

The decreasing engines never loop over items in Python. Items of equal size are placed as one run:
in textbook best fit (or first fit), once an item of size ``s`` lands in a row with ``c`` tokens
free, the next item of the same size goes into that same row while it still has room (no other row
has a free capacity in ``[s, c)``), so a row takes ``min(c // s, free slots)`` of them at once. The
run arithmetic therefore reproduces the item-by-item textbook algorithms exactly; the tests hold them
equal to a brute-force item-by-item simulation.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

import numpy as np

_NO_CAP = np.iinfo(np.int64).max  # "no limit on items per row"


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


def decreasing_order(sizes: np.ndarray, capacity: int) -> np.ndarray:
    """Item positions by size, longest first, ties by position (stable)."""
    return stable_argsort(capacity - sizes, capacity + 1)


def _runs(sorted_sizes: np.ndarray) -> list[tuple[int, int, int]]:
    """``(size, start, stop)`` for each run of equal values in an already sorted array."""
    if sorted_sizes.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(sorted_sizes)) + 1
    starts = np.concatenate(([0], cuts)).tolist()
    stops = np.concatenate((cuts, [sorted_sizes.size])).tolist()
    return [(int(sorted_sizes[a]), a, b) for a, b in zip(starts, stops)]


def _group_rows(order: np.ndarray, row_of: np.ndarray, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Items in placement order + their rows -> (order grouped row by row, row_offsets)."""
    by_row = stable_argsort(row_of, num_rows)
    offsets = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(row_of, minlength=num_rows), out=offsets[1:])
    return order[by_row], offsets


def _take(q: np.ndarray, k: int) -> np.ndarray:
    """Items given to each candidate row when ``k`` items fill rows offering ``q[i]`` places in turn.

    Returns the counts for the rows actually used (a prefix of ``q``; the last may be partial).
    """
    filled = np.cumsum(q)
    used = int(np.searchsorted(filled, k)) + 1  # first row at which k items are all placed
    if used > q.size:
        return q
    took = q[:used].copy()
    took[-1] = k - (int(filled[used - 2]) if used > 1 else 0)
    return took


def _open_rows(k: int, size: int, capacity: int, per_row: int) -> np.ndarray:
    """Counts for the new rows that ``k`` items of one size open: full rows, then a partial one."""
    q = min(capacity // size, per_row)
    counts = np.full(-(-k // q), q, dtype=np.int64)
    counts[-1] = k - q * (counts.size - 1)
    return counts


def next_fit(sizes: np.ndarray, capacity: int, max_per_row: int | None) -> tuple[np.ndarray, np.ndarray]:
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
    return np.arange(m, dtype=np.int64), np.asarray(offsets, dtype=np.int64)


_BLOCK = 256  # rows per block in first fit's two-level index


def first_fit_decreasing(
    sizes: np.ndarray, capacity: int, max_per_row: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Longest first; each item goes into the lowest-numbered row it fits (and has a free slot).

    Rows sit in blocks of ``_BLOCK`` with the most free room of each block kept up to date, so a run
    of equal-size items finds the blocks that can take it with one scan over R / _BLOCK maxima, then
    fills rows block by block in row order (taking twice as many blocks each round). Cost: O(m) radix
    sorting plus, per distinct size, O(R / _BLOCK) and O(_BLOCK) per block visited.
    """
    m = sizes.size
    per_row = max_per_row or _NO_CAP
    order = decreasing_order(sizes, capacity)
    sorted_sizes = sizes[order]
    row_of = np.empty(m, dtype=np.int64)  # row of the item at each sorted position
    num_blocks = -(-m // _BLOCK)
    free = np.full(num_blocks * _BLOCK, -1, dtype=np.int64)  # free tokens per row; -1: closed/unopened
    slots = np.zeros(num_blocks * _BLOCK, dtype=np.int64)  # free places per row
    block_free = np.full(num_blocks, -1, dtype=np.int64)  # most free tokens in any row of a block
    free_2d = free.reshape(num_blocks, _BLOCK)  # a view: rows by block
    num_rows = 0

    def place(rows: np.ndarray, took: np.ndarray, pos: int, size: int) -> None:
        row_of[pos : pos + int(took.sum())] = np.repeat(rows, took)
        free[rows] -= took * size
        slots[rows] -= took
        free[rows[slots[rows] == 0]] = -1  # no slot left: the row is closed
        touched = np.unique(rows // _BLOCK)
        block_free[touched] = free_2d[touched].max(axis=1)

    for size, pos, stop in _runs(sorted_sizes):
        k = stop - pos
        blocks = np.flatnonzero(block_free[: -(-num_rows // _BLOCK)] >= size)
        step = 1
        while k and blocks.size:
            chunk, blocks = blocks[:step], blocks[step:]
            step *= 2
            rows = (chunk[:, None] * _BLOCK + np.arange(_BLOCK)).ravel()
            rows = rows[free[rows] >= size]  # ascending: the first-fit order
            took = _take(np.minimum(free[rows] // size, slots[rows]), k)
            place(rows[: took.size], took, pos, size)
            pos += int(took.sum())
            k = stop - pos
        if k:
            counts = _open_rows(k, size, capacity, per_row)
            rows = np.arange(num_rows, num_rows + counts.size)
            free[rows], slots[rows] = capacity, per_row
            place(rows, counts, pos, size)
            num_rows += counts.size
    return _group_rows(order, row_of, num_rows)


class _Buckets:
    """Open rows indexed by free capacity: ``capacity -> row ids`` plus the sorted capacities in use.

    Each bucket keeps sorted chunks of row ids and merges them only when read, so that moving a
    batch of rows costs O(batch) and ties can go to the lowest-numbered row.
    """

    def __init__(self) -> None:
        self.chunks: dict[int, list[np.ndarray]] = {}
        self.caps: list[int] = []  # sorted capacities with a non-empty bucket

    def push(self, cap: int, rows: np.ndarray) -> None:
        if cap not in self.chunks:
            self.chunks[cap] = []
            insort(self.caps, cap)
        self.chunks[cap].append(rows)

    def rows(self, cap: int) -> np.ndarray:
        chunks = self.chunks[cap]
        if len(chunks) > 1:
            chunks[:] = [np.sort(np.concatenate(chunks))]
        return chunks[0]

    def keep(self, i: int, rows: np.ndarray) -> None:
        """Leave ``rows`` in the bucket at ``caps[i]``; drop the bucket if empty."""
        if rows.size:
            self.chunks[self.caps[i]] = [rows]
        else:
            del self.chunks[self.caps.pop(i)]


def best_fit_decreasing(
    sizes: np.ndarray, capacity: int, max_per_row: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Longest first; each item goes into the fullest row it fits, ties to the lowest-numbered row.

    Exactly textbook BFD (with a free slot required when ``max_per_row`` is set). Open rows sit in
    buckets indexed by free capacity; a run of equal-size items scans the buckets upwards from its
    size, so the cost is O(m) radix sorting plus O(log R) per bucket visit and O(1) amortised per
    row moved, never a loop over rows per item.
    """
    m = sizes.size
    per_row = max_per_row or _NO_CAP
    order = decreasing_order(sizes, capacity)
    sorted_sizes = sizes[order]
    smallest = int(sorted_sizes[-1]) if m else 1
    row_of = np.empty(m, dtype=np.int64)
    slots = np.empty(m, dtype=np.int64)
    buckets = _Buckets()
    num_rows = 0
    for size, pos, stop in _runs(sorted_sizes):
        k = stop - pos
        moved: list[tuple[np.ndarray, np.ndarray]] = []  # (rows, new free capacity) to re-bucket
        i = bisect_left(buckets.caps, size)
        while k and i < len(buckets.caps):
            cap = buckets.caps[i]
            rows = buckets.rows(cap)
            if rows.size == 1:  # common with long rows (many distinct capacities): scalar arithmetic
                r = int(rows[0])
                q = min(cap // size, int(slots[r]), k)
                row_of[pos : pos + q] = r
                slots[r] -= q
                moved.append((rows, np.array([cap - q * size])))
                pos, k = pos + q, k - q
                buckets.keep(i, rows[1:])  # q >= 1: the row always moves on
                continue
            took = _take(np.minimum(cap // size, slots[rows]), k)
            used = rows[: took.size]
            row_of[pos : pos + int(took.sum())] = np.repeat(used, took)
            slots[used] -= took
            moved.append((used, cap - took * size))
            pos += int(took.sum())
            k = stop - pos
            buckets.keep(i, rows[took.size :])  # rows left here only when k == 0
        if k:
            counts = _open_rows(k, size, capacity, per_row)
            used = np.arange(num_rows, num_rows + counts.size)
            row_of[pos:stop] = np.repeat(used, counts)
            slots[used] = per_row - counts
            moved.append((used, capacity - counts * size))
            num_rows += counts.size
        # Re-bucket after the run: every moved row now has less room than `size` (or no slot), so
        # none of them could have taken another item of this run.
        for used, free in moved:
            open_ = (free >= smallest) & (slots[used] > 0)
            used, free = used[open_], free[open_]
            if used.size == 0:
                continue
            if bool((free == free[0]).all()):  # the common case: one destination bucket
                buckets.push(int(free[0]), used)
            else:
                for cap in np.unique(free).tolist():
                    buckets.push(cap, used[free == cap])
    return _group_rows(order, row_of, num_rows)


def histogram_best_fit(
    sizes: np.ndarray, capacity: int, max_per_row: int | None, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Best-fit decreasing on the length histogram (the idea of Krell et al.'s SPFHP).

    Rows are never handled one by one: a *group* is ``count`` rows with the same contents (a
    pattern of sizes), the same free capacity and the same free slots, and a run of equal sizes moves
    whole groups. Without ``max_per_row`` rows of equal free capacity are interchangeable, so this
    makes exactly the rows of :func:`best_fit_decreasing` (same number, same fill), at a cost of
    O(D * G) Python steps for D distinct sizes and G groups (a few per size), plus an O(m) radix
    expansion. With ``max_per_row``, ties between groups of equal capacity go to the oldest group.
    Rows come out grouped by pattern. Which of several sequences of equal length fills a slot of
    that length is drawn at random with ``seed``; the rows' shape does not depend on it.
    """
    m = sizes.size
    per_row = max_per_row or _NO_CAP
    if m and int(sizes.max()) > 4 * m + (1 << 16):  # sparse: a histogram array would be mostly zeros
        values, counts = np.unique(sizes, return_counts=True)
    else:
        hist = np.bincount(sizes)  # O(m + longest), no sort
        values = np.flatnonzero(hist)
        counts = hist[values]
    smallest = int(values[0]) if m else 1
    patterns: list[tuple[int, int, int]] = [(-1, 0, 0)]  # id -> (parent id, size, copies); 0 = empty
    buckets: dict[int, list[list[int]]] = {}  # free capacity -> groups [rows, slots, pattern, serial]
    caps: list[int] = []
    closed: list[list[int]] = []
    serial = 0

    def grow(pattern: int, size: int, copies: int) -> int:
        patterns.append((pattern, size, copies))
        return len(patterns) - 1

    for size, k in zip(values[::-1].tolist(), counts[::-1].tolist()):
        moved: list[tuple[int, list[int]]] = []  # (new free capacity, group)
        i = bisect_left(caps, size)
        while k and i < len(caps):
            cap = caps[i]
            groups = buckets[cap]
            g = 0
            while k and g < len(groups):
                rows, slots, pattern, ser = groups[g]
                q = min(cap // size, slots)
                full = min(rows, k // q)
                if full:
                    moved.append((cap - q * size, [full, slots - q, grow(pattern, size, q), ser]))
                    rows, k = rows - full, k - full * q
                if rows and 0 < k < q:  # one row takes the rest of the run
                    serial += 1
                    moved.append((cap - k * size, [1, slots - k, grow(pattern, size, k), serial]))
                    rows, k = rows - 1, 0
                if rows:
                    groups[g][0] = rows
                    break
                g += 1
            del groups[:g]
            if groups:
                i += 1
            else:
                del buckets[cap]
                caps.pop(i)
        if k:
            q = min(capacity // size, per_row)
            if k // q:
                serial += 1
                moved.append((capacity - q * size, [k // q, per_row - q, grow(0, size, q), serial]))
            if k % q:
                serial += 1
                moved.append((capacity - (k % q) * size, [1, per_row - k % q, grow(0, size, k % q), serial]))
        for free, group in moved:
            if free >= smallest and group[1] > 0:
                if free not in buckets:
                    buckets[free] = []
                    insort(caps, free)
                buckets[free].append(group)
            else:
                closed.append(group)
    groups = sorted(closed + [g for cap in caps for g in buckets[cap]], key=lambda g: g[3])
    return _expand(groups, patterns, sizes, capacity, seed)


def _expand(
    groups: list[list[int]], patterns: list[tuple[int, int, int]], sizes: np.ndarray, capacity: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Groups of identical rows -> (order, row_offsets), filling each slot with an item of its size."""
    used = sorted({g[2] for g in groups})
    flat: list[int] = []  # the slot sizes of every used pattern, back to back
    starts, lens = [], []
    for p in used:  # walk up to the root (no recursion: chains can be long)
        parts = []
        while p:
            p, size, copies = patterns[p]
            parts.append((size, copies))
        starts.append(len(flat))
        for size, copies in reversed(parts):
            flat.extend([size] * copies)
        lens.append(len(flat) - starts[-1])
    slot = {p: i for i, p in enumerate(used)}
    row_pattern = np.repeat(np.array([slot[g[2]] for g in groups], dtype=np.int64),
                            np.array([g[0] for g in groups], dtype=np.int64))  # fmt: skip
    row_len = np.asarray(lens, dtype=np.int64)[row_pattern] if groups else np.zeros(0, dtype=np.int64)
    offsets = np.zeros(row_len.size + 1, dtype=np.int64)
    np.cumsum(row_len, out=offsets[1:])
    within = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], row_len)
    first = np.asarray(starts, dtype=np.int64)[np.repeat(row_pattern, row_len)] if groups else within
    slot_sizes = np.asarray(flat, dtype=np.int64)[first + within] if groups else within
    # The k-th slot of size s (in row order) gets the k-th item of size s in a seeded shuffle.
    shuffle = np.random.default_rng(seed).permutation(sizes.size)
    items_by_size = shuffle[stable_argsort(sizes[shuffle], capacity + 1)]
    order = np.empty(sizes.size, dtype=np.int64)
    order[stable_argsort(slot_sizes, capacity + 1)] = items_by_size
    return order, offsets


def wrapped(sizes: np.ndarray, capacity: int, max_per_row: int | None) -> tuple[np.ndarray, ...]:
    """Concatenate items in order and cut the stream into rows of ``capacity`` tokens.

    Returns ``(item, offset, length, row_offsets)`` per piece: an item cut at a row boundary
    continues as a new piece (a separate document) at the start of the next row. With
    ``max_per_row`` a row also ends after that many pieces, so it may be shorter than capacity.
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
    first = np.searchsorted(bounds, starts, side="right") - 1
    last = np.searchsorted(bounds, ends - 1, side="right") - 1
    pieces = last - first + 1
    item = np.repeat(np.arange(m, dtype=np.int64), pieces)
    row = first[item] + np.arange(item.size) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    row_end = np.append(bounds[1:], total)
    lo = np.maximum(starts[item], bounds[row])
    hi = np.minimum(ends[item], row_end[row])
    offsets = np.searchsorted(row, np.arange(bounds.size + 1))
    return item, lo - starts[item], hi - lo, offsets.astype(np.int64)
