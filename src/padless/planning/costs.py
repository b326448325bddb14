"""Rows bounded by a second budget as well as tokens: the encoder cost (image patches) of each sequence.

A vision-language document's images cost the vision encoder patches that its token count does not
show, so a token-only plan can gather every large image into one row. ``plan_packs(lengths,
max_length, costs=..., max_cost=...)`` (:func:`padless.planning.plan.plan_packs`, which calls
:func:`plan_with_costs`, run by :mod:`padless.planning._costpack`) takes one non-negative int per
sequence (0 for a text-only one) and the most cost a row may hold::

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

from collections.abc import Sequence

import numpy as np

from padless.planning._costpack import (  # noqa: F401 (re-exported: the engines' home is _costpack)
    best_fit_decreasing_2d,
    next_fit_2d,
    plan_with_costs,
    validate_costs,
    wrapped_2d,
)
from padless.planning.checks import check_int
from padless.planning.plan import PackPlan


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
