"""Rows bounded by a second budget as well as tokens: the encoder cost (image patches) of each sequence.

A vision-language document's images cost the vision encoder patches that its token count does not
show, so a token-only plan can gather every large image into one row. ``plan_packs(lengths,
max_length, costs=..., max_cost=...)`` (:func:`padless.planning.plan.plan_packs`, which calls
:func:`plan_with_costs` here) takes one non-negative int per sequence (0 for a text-only one) and the
most cost a row may hold::

    lengths [6, 6, 2, 2]   costs [9, 9, 0, 0]   max_length 8, max_cost 10, best_fit_decreasing
    row 0   seq 0 (6, cost 9) + seq 2 (2, cost 0)     8/8 tokens,  9/10 cost
    row 1   seq 1 (6, cost 9) + seq 3 (2, cost 0)     8/8 tokens,  9/10 cost

Strategies under ``max_cost`` (each row holds at most ``max_length`` tokens, ``max_cost`` cost and
``max_per_row`` pieces):

* ``next_fit``: input order; a new row when the next sequence misses any of the three limits.
* ``best_fit_decreasing``, ``first_fit_decreasing`` and ``histogram_best_fit``: the histogram engine
  of :mod:`padless.planning._binpack` groups rows by token pattern, which a second dimension breaks,
  so they all fall back to :func:`best_fit_decreasing_2d` (``seed`` is then unused): sequences by
  dominant share ``max(length / max_length, cost / max_cost)`` descending (ties by index), each into
  the row with the fewest free tokens among those with room for its tokens, its cost and a piece
  (ties to the lowest row). It scans the open rows with numpy once per sequence: O(n * open rows),
  about a second for 20,000 sequences, not the histogram engine's O(n) at millions. While
  ``max_cost`` never binds (``max_cost >= max_length * max(costs)``) it makes the rows of textbook
  best fit decreasing, item for item.
* ``wrapped``: tokens poured in order into rows as before, text-only sequences cut at row ends; a
  sequence with cost > 0 is never cut: when it misses the rest of the row (tokens, cost or a
  piece), the row ends short and it opens the next one (with ``costs`` given, even without
  ``max_cost``). With every cost 0 this is plain ``wrapped``.

A document with images cannot be cut without cutting its images. So a sequence whose cost alone is
over ``max_cost`` is dropped under ``overlong="drop"`` (counted in ``dropped_sequences`` /
``dropped_tokens``) and refused with a ``ValueError`` under every other policy; and a sequence with
cost > 0 longer than ``max_length`` is refused under ``truncate`` and ``split`` (dropped under
``drop``, refused under ``error`` as before). Text-only sequences follow the overlong policy as
usual. With ``costs`` given and ``max_cost=None`` the plan is the plan without costs, unless that
plan would cut a sequence with cost > 0 (then it is refused, or for ``wrapped``, not cut).

A micro-batch of ``k`` rows holds at most ``k * max_cost`` cost: to bound the encoder's work per
step, set ``max_cost`` to the micro-batch budget divided by rows per micro-batch.
:func:`row_costs` and :func:`micro_batch_costs` measure a plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from padless.planning._binpack import Rows
from padless.planning.checks import check_int, integer_array

if TYPE_CHECKING:  # plan.py calls this module: a runtime import back would be a cycle
    from padless.planning.plan import PackPlan


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
    items_of: Callable,
    planners: dict[str, Callable],
) -> dict:
    """:func:`padless.planning.plan.plan_packs` with ``costs`` (and ``max_cost``), as the module
    docstring says; ``lengths`` and the other arguments are already validated there. Returns the
    :class:`PackPlan` fields; ``items_of`` (the overlong policy) and ``planners`` (the token-only
    engines) are plan.py's own, handed in so that this module does not import it back."""
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
    items = items_of(lengths[keep], max_length, overlong, cut=strategy != "wrapped")
    source = keep if items.source is None else keep[items.source]
    item_costs = costs[source]
    if strategy == "wrapped":
        rows = wrapped_2d(items.sizes, item_costs, max_length, max_cost, max_per_row)
    elif max_cost is None:
        rows = planners[strategy](items.sizes, max_length, max_per_row, seed)
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


def row_costs(plan: PackPlan, costs: Sequence[int] | np.ndarray) -> np.ndarray:
    """int64 ``[num_rows]``: the cost each row of ``plan`` holds (the sum over its pieces).

    ``ValueError`` if the plan cuts (splits or truncates) a sequence with cost > 0: its cost would
    belong to no one piece, and its images would be cut.
    """
    costs = validate_costs(costs, plan.num_sequences)
    cut = np.zeros(plan.num_sequences, dtype=bool)
    cut[plan.index[plan.start > 0]] = True
    cut[plan.truncated] = True
    bad = np.flatnonzero(cut & (costs > 0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"the plan cuts sequence {i}, which has cost {int(costs[i])}: its images would be cut")
    if not plan.num_rows:
        return np.zeros(0, dtype=np.int64)
    cum = np.concatenate(([0], np.cumsum(costs[plan.index])))
    return cum[plan.row_offsets[1:]] - cum[plan.row_offsets[:-1]]


def micro_batch_costs(plan: PackPlan, costs: Sequence[int] | np.ndarray, rows_per_batch: int) -> np.ndarray:
    """int64 ``[ceil(num_rows / rows_per_batch)]``: the cost of each run of ``rows_per_batch``
    consecutive rows (the last may be shorter), at most ``rows_per_batch * max_cost`` each."""
    rows_per_batch = check_int(rows_per_batch, "rows_per_batch")
    per_row = row_costs(plan, costs)
    return np.add.reduceat(per_row, np.arange(0, per_row.size, rows_per_batch)) if per_row.size else per_row


def check_costs(
    plan: PackPlan, lengths: Sequence[int] | np.ndarray, costs: Sequence[int] | np.ndarray, max_cost: int | None
) -> None:
    """:meth:`PackPlan.check` plus: no sequence with cost > 0 is cut, and every row holds at most
    ``max_cost`` (when given); else ``ValueError`` naming the row."""
    plan.check(lengths)
    per_row = row_costs(plan, costs)
    if max_cost is not None and per_row.size and int(per_row.max()) > max_cost:
        r = int(np.argmax(per_row))
        raise ValueError(f"row {r} holds cost {int(per_row[r])} > max_cost {max_cost}")
