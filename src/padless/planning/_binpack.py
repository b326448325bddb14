"""Bin-packing engines behind :func:`padless.planning.plan.plan_packs`: item sizes in, rows out.

Every engine takes ``sizes`` (int64 ``[m]``, each ``1 <= size <= capacity``), the row ``capacity``
and an optional cap on items per row, and returns ``(order, row_offsets)``: ``order`` (int64 ``[m]``)
lists item positions row by row, each row's items in placement order, and row ``r`` holds
``order[row_offsets[r]:row_offsets[r + 1]]``. Rows come in the order they were opened. The
decreasing engines return ``(order, sizes[order], row_offsets)``: they know the sizes in row order
already, and gathering ``m`` scattered sizes would cost as much as planning. ``wrapped``, which cuts
items, returns pieces instead. Engines are pure numpy; validation, overlong handling and the public
plan object live in ``padless.planning.plan``.

The decreasing engines never loop over items in Python. Items of equal size are placed as one run:
in textbook best fit (or first fit), once an item of size ``s`` lands in a row with ``c`` tokens
free, the next item of the same size goes into that same row while it still has room (no other row
has a free capacity in ``[s, c)``), so a row takes ``min(c // s, free slots)`` of them at once. The
run arithmetic therefore reproduces the item-by-item textbook algorithms exactly; the tests hold them
equal to a brute-force item-by-item simulation. Sorting is counting only: the histogram of sizes
(``np.bincount``) gives the runs, and items are grouped by size or by row with O(m) counting sorts
(numpy's radix sort for 16-bit keys, or each item's known place in its row), never a comparison sort.
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


def histogram(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(values, counts)``: the distinct sizes, ascending, and how many items have each. O(m), no sort
    (``np.bincount``) unless the sizes are sparse (a count array would be mostly zeros)."""
    if sizes.size and int(sizes.max()) > 4 * sizes.size + (1 << 16):
        return np.unique(sizes, return_counts=True)
    hist = np.bincount(sizes)
    values = np.flatnonzero(hist)
    return values, hist[values]


def _decreasing(sizes: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int]]]:
    """``(order, sizes[order], runs)`` for the decreasing engines: :func:`decreasing_order`, with the
    sorted sizes and the ``(size, start, stop)`` runs of equal sizes read off the histogram."""
    values, counts = histogram(sizes)
    values, counts = values[::-1], counts[::-1]
    stops = np.cumsum(counts)
    runs = list(zip(values.tolist(), (stops - counts).tolist(), stops.tolist()))
    return decreasing_order(sizes, capacity), np.repeat(values, counts), runs


class _Placements:
    """What a decreasing engine placed, block by block in sorted order, laid out row by row at the end.

    A block is items at consecutive sorted positions given to one row at once; the blocks tile
    positions ``0..m-1`` in order. Recording a block is a list append (per step, no array work), and
    :meth:`layout` is one counting sort: a block's items go to its row's offset plus the items the
    row held before, so every item's destination comes from one ``np.repeat`` and the scatter runs
    nearly in order.
    """

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (rows, held before, took)
        self.pending: list[tuple[int, int, int]] = []  # single-row blocks not yet in `parts`

    def one(self, row: int, before: int, took: int) -> None:
        self.pending.append((row, before, took))

    def many(self, rows: np.ndarray, before: np.ndarray, took: np.ndarray) -> None:
        if self.pending:
            self._flush()
        self.parts.append((rows, before, took))

    def _flush(self) -> None:
        if self.pending:
            rows, before, took = np.array(self.pending, dtype=np.int64).T
            self.parts.append((rows, before, took))
            self.pending = []

    def layout(
        self, order: np.ndarray, sorted_sizes: np.ndarray, row_items: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(order, sizes, row_offsets)`` row by row, given the items per row (``row_items``)."""
        self._flush()
        offsets = np.zeros(row_items.size + 1, dtype=np.int64)
        np.cumsum(row_items, out=offsets[1:])
        if not self.parts:
            return order, sorted_sizes, offsets
        rows, before, took = (np.concatenate(x) for x in zip(*self.parts))
        start = np.cumsum(took) - took  # sorted position of each block's first item
        dest = np.repeat(offsets[rows] + before - start, took)
        dest += np.arange(dest.size, dtype=np.int64)
        by_row = np.empty_like(order)
        by_row[dest] = order
        length = np.empty_like(sorted_sizes)
        length[dest] = sorted_sizes
        return by_row, length, offsets


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
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Longest first; each item goes into the lowest-numbered row it fits (and has a free slot).

    Rows sit in blocks of ``_BLOCK`` with the most free room of each block kept up to date, so a run
    of equal-size items finds the blocks that can take it with one scan over R / _BLOCK maxima, then
    fills rows block by block in row order (taking twice as many blocks each round). Cost: O(m) radix
    sorting plus, per distinct size, O(R / _BLOCK) and O(_BLOCK) per block visited.
    """
    m = sizes.size
    per_row = max_per_row or _NO_CAP
    order, sorted_sizes, runs = _decreasing(sizes, capacity)
    placed = _Placements()
    num_blocks = -(-m // _BLOCK)
    free = np.full(num_blocks * _BLOCK, -1, dtype=np.int64)  # free tokens per row; -1: closed/unopened
    slots = np.zeros(num_blocks * _BLOCK, dtype=np.int64)  # free places per row
    block_free = np.full(num_blocks, -1, dtype=np.int64)  # most free tokens in any row of a block
    free_2d = free.reshape(num_blocks, _BLOCK)  # a view: rows by block
    num_rows = 0

    def place(rows: np.ndarray, took: np.ndarray, pos: int, size: int) -> None:
        placed.many(rows, per_row - slots[rows], took)
        free[rows] -= took * size
        slots[rows] -= took
        free[rows[slots[rows] == 0]] = -1  # no slot left: the row is closed
        touched = np.unique(rows // _BLOCK)
        block_free[touched] = free_2d[touched].max(axis=1)

    for size, pos, stop in runs:
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
    return placed.layout(order, sorted_sizes, per_row - slots[:num_rows])


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
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Longest first; each item goes into the fullest row it fits, ties to the lowest-numbered row.

    Exactly textbook BFD (with a free slot required when ``max_per_row`` is set). Open rows sit in
    buckets indexed by free capacity; a run of equal-size items scans the buckets upwards from its
    size, so the cost is O(m) radix sorting plus O(log R) per bucket visit and O(1) amortised per
    row moved, never a loop over rows per item.
    """
    m = sizes.size
    per_row = max_per_row or _NO_CAP
    order, sorted_sizes, runs = _decreasing(sizes, capacity)
    smallest = int(sorted_sizes[-1]) if m else 1
    placed = _Placements()
    slots = np.empty(m, dtype=np.int64)  # free places per row: per_row minus the items placed
    buckets = _Buckets()
    num_rows = 0
    for size, pos, stop in runs:
        k = stop - pos
        moved: list[tuple[np.ndarray, np.ndarray]] = []  # (rows, new free capacity) to re-bucket
        i = bisect_left(buckets.caps, size)
        while k and i < len(buckets.caps):
            cap = buckets.caps[i]
            rows = buckets.rows(cap)
            if rows.size == 1:  # common with long rows (many distinct capacities): scalar arithmetic
                r = int(rows[0])
                free_slots = int(slots[r])
                q = min(cap // size, free_slots, k)
                placed.one(r, per_row - free_slots, q)
                slots[r] = free_slots - q
                moved.append((rows, np.array([cap - q * size])))
                pos, k = pos + q, k - q
                buckets.keep(i, rows[1:])  # q >= 1: the row always moves on
                continue
            took = _take(np.minimum(cap // size, slots[rows]), k)
            used = rows[: took.size]
            placed.many(used, per_row - slots[used], took)
            slots[used] -= took
            moved.append((used, cap - took * size))
            pos += int(took.sum())
            k = stop - pos
            buckets.keep(i, rows[took.size :])  # rows left here only when k == 0
        if k:
            counts = _open_rows(k, size, capacity, per_row)
            used = np.arange(num_rows, num_rows + counts.size)
            placed.many(used, np.zeros(counts.size, dtype=np.int64), counts)
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
    return placed.layout(order, sorted_sizes, per_row - slots[:num_rows])


def histogram_best_fit(
    sizes: np.ndarray, capacity: int, max_per_row: int | None, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Best-fit decreasing on the length histogram (the idea of Krell et al.'s SPFHP).

    Rows are never handled one by one: a *group* is ``count`` rows with the same contents (a
    pattern of sizes), the same free capacity and the same free slots, and a run of equal sizes moves
    whole groups. Without ``max_per_row`` rows of equal free capacity are interchangeable for best
    fit, so this makes as many rows as :func:`best_fit_decreasing` with the same fills (which sizes
    share a row can differ where rows tie), at a cost of O(D * G) Python steps for D distinct sizes
    and G groups (a few per size), plus :func:`_expand`, O(m) with a small constant. With
    ``max_per_row``, ties between groups of equal capacity go to the oldest group. Rows come out
    grouped by pattern. Returns ``(order, item sizes in that order, row_offsets)``: the sizes come
    from the patterns, so the caller need not gather them.
    """
    values, counts = histogram(sizes)
    groups, patterns = histogram_groups(values, counts, capacity, max_per_row)
    return _expand(groups, patterns, sizes, capacity, values, counts, seed)


def histogram_groups(
    values: np.ndarray, counts: np.ndarray, capacity: int, max_per_row: int | None
) -> tuple[list[list[int]], list[tuple[int, int, int, int]]]:
    """The groups of identical rows that best fit decreasing makes of ``counts[i]`` items of size
    ``values[i]`` (sizes ascending): a function of the histogram alone, so one plan can be made over an
    input whose lengths are never gathered. Returns ``(groups, patterns)``: each group
    ``[rows, free slots, pattern id, serial]`` in the order its rows were opened; each pattern
    ``(parent pattern, run size, run copies, slots a row)``, a tree whose root is pattern 0 (empty).
    """
    per_row = max_per_row or _NO_CAP
    values = np.asarray(values, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    smallest = int(values[0]) if values.size else 1
    patterns: list[tuple[int, int, int, int]] = [(-1, 0, 0, 0)]  # id -> (parent, size, copies, width)
    buckets: dict[int, list[list[int]]] = {}  # free capacity -> groups [rows, slots, pattern, serial]
    caps: list[int] = []
    closed: list[list[int]] = []
    serial = 0

    def grow(pattern: int, size: int, copies: int) -> int:
        """A new pattern: ``pattern`` plus ``copies`` slots of ``size`` (0 is the empty pattern)."""
        patterns.append((pattern, size, copies, patterns[pattern][3] + copies))
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
    return groups, patterns


_BIG_BAND = 256  # items from which a band is copied as a 2D slice: ~ break-even on 1M-10M lengths


def _expand(
    groups: list[list[int]],
    patterns: list[tuple[int, int, int, int]],
    sizes: np.ndarray,
    capacity: int,
    values: np.ndarray,
    counts: np.ndarray,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Groups of identical rows -> (order, sizes in order, row_offsets): a counting sort, no row loop.

    A group of ``c`` rows of pattern ``(s1 x q1, s2 x q2, ...)`` (``k`` slots a row) is a ``c x k``
    block of ``order``, and each run ``s x q`` of the pattern a ``c x q`` column *band* of it. Every
    band is filled from the items of its size, which one stable counting sort (the radix
    :func:`stable_argsort`, O(m)) lays out size by size: the slots of size ``s``, in row order, take
    the items of size ``s`` in index order, cyclically from a seeded start ``rot[s]``, so the seed
    picks which of several equal-length items fills a slot without a permutation of all ``m`` items::

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
    g_rows, g_pattern = np.array(groups, dtype=np.int64).reshape(-1, 4)[:, [0, 2]].T
    g_width = run_end[g_pattern]
    offsets = np.zeros(int(g_rows.sum()) + 1, dtype=np.int64)
    np.cumsum(np.repeat(g_width, g_rows), out=offsets[1:])
    order = np.empty(m, dtype=np.int64)
    length = np.empty(m, dtype=np.int64)
    if m == 0:
        return order, length, offsets
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
    # Bands of one size take consecutive stretches of that size's items, in row order.
    by_size = np.lexsort((base_arr, size_arr))
    cum = np.cumsum(items[by_size])
    slot = np.searchsorted(values, size_arr)  # index of each band's size among the distinct sizes
    first_of_size = np.zeros(values.size, dtype=np.int64)  # items of smaller sizes (start in `sorted_items`)
    np.cumsum(counts[:-1], out=first_of_size[1:])
    cursor = np.empty_like(items)
    cursor[by_size] = cum - items[by_size] - first_of_size[slot[by_size]]  # items of this size before
    rot = np.random.default_rng(seed).integers(0, counts)  # seeded start inside each size's items
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
    return order, length, offsets


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
    return item, lo - starts[item], hi - lo, offsets.astype(np.int64)
