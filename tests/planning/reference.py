"""Slow, obviously-correct planners: one item (or one token piece) at a time, in plain Python.

The engines in ``padless.planning._binpack`` never loop over items; the tests hold them equal to these.
"""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np


def ref_next_fit(sizes: list[int], cap: int, per_row: int | None) -> list[list[int]]:
    rows: list[list[int]] = []
    for i, s in enumerate(sizes):
        if rows and sum(sizes[j] for j in rows[-1]) + s <= cap and (per_row is None or len(rows[-1]) < per_row):
            rows[-1].append(i)
        else:
            rows.append([i])
    return rows


def ref_best_fit_decreasing(sizes: list[int], cap: int, per_row: int | None) -> list[list[int]]:
    """Textbook best fit decreasing, one item at a time: longest first (ties by index), into the
    fullest row it fits that has a free slot (ties to the lowest-numbered row), else a new row.

    The open rows sit in one sorted list of ``(free tokens, row)``, so the row an item goes to is the
    first entry with ``free >= size``: O(log rows) to find, fast enough for tens of thousands of items.
    """
    rows: list[list[int]] = []
    open_rows: list[tuple[int, int]] = []  # (free tokens, row) of every row with a free slot, sorted
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        j = bisect_left(open_rows, (sizes[i], -1))
        if j < len(open_rows):
            free, r = open_rows.pop(j)
        else:
            free, r = cap, len(rows)
            rows.append([])
        rows[r].append(i)
        if per_row is None or len(rows[r]) < per_row:
            insort(open_rows, (free - sizes[i], r))
    return rows


def ref_wrapped(sizes: list[int], cap: int, per_row: int | None) -> list[list[tuple[int, int, int]]]:
    """Pour the token stream into rows one piece at a time."""
    rows: list[list[tuple[int, int, int]]] = [[]]
    room = cap
    for i, s in enumerate(sizes):
        done = 0
        while done < s:
            if room == 0 or (per_row is not None and len(rows[-1]) == per_row):
                rows.append([])
                room = cap
            take = min(room, s - done)
            rows[-1].append((i, done, take))
            done, room = done + take, room - take
    return rows if sizes else []


def ref_histogram_items(sizes: list[int], slot_sizes: list[int], seed: int) -> list[int]:
    """Which item fills each slot of histogram_best_fit's rows (slot sizes in row order): slot by
    slot, the k-th slot of size s takes the k-th item of size s (in index order) counted cyclically
    from a seeded start, default_rng(seed).integers(0, count) over the distinct sizes, ascending."""
    values = sorted(set(sizes))
    items = {s: [i for i, x in enumerate(sizes) if x == s] for s in values}
    starts = np.random.default_rng(seed).integers(0, [len(items[s]) for s in values]).tolist() if values else []
    start = dict(zip(values, starts))
    taken = dict.fromkeys(values, 0)
    out = []
    for s in slot_sizes:
        out.append(items[s][(start[s] + taken[s]) % len(items[s])])
        taken[s] += 1
    return out


def optimum(sizes: list[int], cap: int) -> int:
    """Fewest bins, by exhaustive search (items placed longest first into an existing or a new bin)."""
    items = sorted(sizes, reverse=True)
    best = len(items)

    def place(k: int, bins: list[int]) -> None:
        nonlocal best
        if len(bins) >= best:
            return
        if k == len(items):
            best = len(bins)
            return
        for b in range(len(bins)):
            if bins[b] + items[k] <= cap and bins[b] not in bins[:b]:  # equal loads are symmetric
                bins[b] += items[k]
                place(k + 1, bins)
                bins[b] -= items[k]
        place(k + 1, [*bins, items[k]])

    place(0, [])
    return best if items else 0
