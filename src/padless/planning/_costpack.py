"""The engines of plans under a second cost per sequence (image patches): best fit decreasing and
next fit under two limits, ``wrapped`` that never cuts a sequence with cost, and
:func:`plan_with_costs`, which :func:`padless.planning.plan.plan_packs` calls when given ``costs`` or
``max_cost``. What each strategy does, and why, is :mod:`padless.planning.costs`' docstring; the
measures of a finished plan (``row_costs``...) live there too, above :mod:`padless.planning.plan`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from padless.planning._binpack import Rows
from padless.planning.checks import check_int, integer_array
from padless.planning.items import PLANNERS, Items


def validate_costs(costs: Sequence[int] | np.ndarray, num_sequences: int) -> np.ndarray:
    """Costs as int64 ``[num_sequences]``, or ``ValueError`` naming the first bad entry."""
    arr = integer_array(costs, "costs", "image patches")
    if arr.size != num_sequences:
        raise ValueError(
            f"costs has {arr.size} entries but lengths has {num_sequences}; "
            "give one cost per sequence (0 for a text-only one)"
        )
    if arr.size and arr.min() < 0:
        i = int(np.flatnonzero(arr < 0)[0])
        raise ValueError(f"costs[{i}] = {int(arr[i])}; a cost (image patches) must be >= 0, 0 for text-only")
    return arr


def _rows(placed: np.ndarray, row_of: list[int], sizes: np.ndarray, num_rows: int) -> Rows:
    """Whole items -> :class:`Rows`: ``placed`` lists the items in placement order, ``row_of`` the row
    each went to (same order); a stable sort by row keeps placement order inside a row."""
    row = np.asarray(row_of, dtype=np.int64)
    item = placed[np.argsort(row, kind="stable")]
    offsets = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=num_rows), out=offsets[1:])
    return Rows(item, np.zeros(item.size, dtype=np.int64), sizes[item], offsets)


def best_fit_decreasing_2d(
    sizes: np.ndarray, costs: np.ndarray, capacity: int, max_cost: int, max_per_row: int | None
) -> Rows:
    """Best fit decreasing under two limits (module docstring): items by dominant share descending
    (ties by index), each into the open row with the fewest free tokens that has room for its
    tokens, its cost and a piece (ties to the lowest-numbered row), else a new row. Rows in opening
    order, items in placement order. Needs ``sizes <= capacity`` and ``costs <= max_cost``.

    The share is compared exactly, as ``max(size * max_cost, cost * capacity)`` in integers.
    """
    m = sizes.size
    if capacity * max_cost < 1 << 62:
        key = np.maximum(sizes * max_cost, costs * capacity)
    else:  # the products could overflow int64; floats only blur near-ties
        key = np.maximum(sizes / capacity, costs / max_cost)
    order = np.lexsort((np.arange(m), -key))
    per_row = max_per_row or m + 1
    free = np.empty(m, dtype=np.int64)  # per open row, by row number: tokens, cost and slots left
    room = np.empty(m, dtype=np.int64)
    slots = np.empty(m, dtype=np.int64)
    big = np.iinfo(np.int64).max
    row_of: list[int] = []  # in placement order
    rows = 0
    for s, c in zip(sizes[order].tolist(), costs[order].tolist()):
        r = -1
        if rows:
            fits = (free[:rows] >= s) & (room[:rows] >= c) & (slots[:rows] > 0)
            r = int(np.argmin(np.where(fits, free[:rows], big)))  # argmin: the lowest row among ties
            r = r if fits[r] else -1
        if r < 0:
            r, rows = rows, rows + 1
            free[r], room[r], slots[r] = capacity, max_cost, per_row
        free[r] -= s
        room[r] -= c
        slots[r] -= 1
        row_of.append(r)
    return _rows(order.astype(np.int64), row_of, sizes, rows)


def next_fit_2d(sizes: np.ndarray, costs: np.ndarray, capacity: int, max_cost: int, max_per_row: int | None) -> Rows:
    """Input order; a new row when the next item misses the row's free tokens, its free cost or a
    free slot. Needs ``sizes <= capacity`` and ``costs <= max_cost``."""
    per_row = max_per_row or sizes.size + 1
    row_of: list[int] = []
    rows, free, room, slots = 0, -1, -1, 0
    for s, c in zip(sizes.tolist(), costs.tolist()):
        if s > free or c > room or slots == 0:
            rows, free, room, slots = rows + 1, capacity, max_cost, per_row
        free, room, slots = free - s, room - c, slots - 1
        row_of.append(rows - 1)
    return _rows(np.arange(sizes.size, dtype=np.int64), row_of, sizes, rows)


def wrapped_2d(
    sizes: np.ndarray, costs: np.ndarray, capacity: int, max_cost: int | None, max_per_row: int | None
) -> Rows:
    """``wrapped`` that never cuts an item with cost > 0 (module docstring): items of cost 0 are cut
    at row ends into pieces, as :func:`padless.planning._binpack.wrapped` does; an item with cost
    opens a new row when it misses the rest of the row (tokens, cost under ``max_cost``, or a slot
    under ``max_per_row``). Needs every item with cost to fit ``capacity`` and ``max_cost``."""
    per_row = max_per_row or sizes.size + 1
    limit = np.iinfo(np.int64).max if max_cost is None else max_cost
    item: list[int] = []
    offset: list[int] = []
    length: list[int] = []
    offsets = [0]
    free, room, slots = 0, 0, 0  # no row open yet
    for i, (s, c) in enumerate(zip(sizes.tolist(), costs.tolist())):
        if c:
            if s > free or c > room or slots == 0:
                if len(item) > offsets[-1]:
                    offsets.append(len(item))
                free, room, slots = capacity, limit, per_row
            item.append(i), offset.append(0), length.append(s)
            free, room, slots = free - s, room - c, slots - 1
            continue
        done = 0
        while done < s:
            if free == 0 or slots == 0:
                if len(item) > offsets[-1]:
                    offsets.append(len(item))
                free, room, slots = capacity, limit, per_row
            take = min(free, s - done)
            item.append(i), offset.append(done), length.append(take)
            done, free, slots = done + take, free - take, slots - 1
    if len(item) > offsets[-1]:
        offsets.append(len(item))
    return Rows(*(np.asarray(a, dtype=np.int64) for a in (item, offset, length, offsets)))


def plan_with_costs(
    lengths: np.ndarray,
    max_length: int,
    costs: Sequence[int] | np.ndarray | None,
    max_cost: int | None,
    strategy: str,
    overlong: str,
    max_per_row: int | None,
    seed: int,
) -> dict:
    """:func:`padless.planning.plan.plan_packs` with ``costs`` (and ``max_cost``), as the module
    docstring says; ``lengths`` and the other arguments are already validated there. Returns the
    :class:`~padless.planning.plan.PackPlan` fields (``plan_packs`` builds the plan)."""
    if costs is None:
        raise ValueError(
            f"max_cost={max_cost!r} needs costs: pass costs=, one non-negative int per sequence (0 for text-only)"
        )
    costs = validate_costs(costs, lengths.size)
    if max_cost is not None:
        max_cost = check_int(max_cost, "max_cost")
        over = np.flatnonzero(costs > max_cost)
        if over.size and overlong != "drop":
            i = int(over[0])
            also = f" (and {over.size - 1} more)" if over.size > 1 else ""
            raise ValueError(
                f"sequence {i} has cost {int(costs[i])}, more than max_cost {max_cost}{also}; its images "
                "cannot be cut: choose overlong='drop' or a larger max_cost"
            )
    if overlong in ("truncate", "split"):
        cut = np.flatnonzero((lengths > max_length) & (costs > 0))
        if cut.size:
            i = int(cut[0])
            also = f" (and {cut.size - 1} more)" if cut.size > 1 else ""
            raise ValueError(
                f"sequence {i} has length {int(lengths[i])}, longer than max_length {max_length}, and cost "
                f"{int(costs[i])}{also}: overlong={overlong!r} would cut its images; choose overlong='drop' "
                "or a larger max_length"
            )
    cost_drop = costs > max_cost if max_cost is not None else np.zeros(lengths.size, dtype=bool)
    keep = np.flatnonzero(~cost_drop)
    items = Items.of(lengths[keep], max_length, overlong, cut=strategy != "wrapped")
    source = keep if items.source is None else keep[items.source]
    item_costs = costs[source]
    if strategy == "wrapped":
        rows = wrapped_2d(items.sizes, item_costs, max_length, max_cost, max_per_row)
    elif max_cost is None:
        rows = PLANNERS[strategy](items.sizes, max_length, max_per_row, seed)
    elif strategy == "next_fit":
        rows = next_fit_2d(items.sizes, item_costs, max_length, max_cost, max_per_row)
    else:  # the decreasing strategies (module docstring)
        rows = best_fit_decreasing_2d(items.sizes, item_costs, max_length, max_cost, max_per_row)
    item, within, length, row_offsets = rows
    start = within if items.offset is None else items.offset[item] + within
    dropped = np.union1d(keep[items.dropped], np.flatnonzero(cost_drop)).astype(np.int64)
    return dict(
        max_length=max_length,
        num_sequences=lengths.size,
        index=source[item],
        start=start,
        length=length,
        row_offsets=row_offsets,
        dropped=dropped,
        truncated=keep[items.truncated],
        truncated_tokens=items.truncated_tokens,
        dropped_tokens=int(lengths[dropped].sum()),
    )
