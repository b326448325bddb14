"""What the engines pack: the overlong policy applied to sequence lengths, and the token-only engine
of each strategy.

:func:`padless.planning.plan.plan_packs` and the plans under a second cost
(:mod:`padless.planning.costs`) both start here, so the overlong policy is applied in one place::

    lengths [3, 11, 4]   max_length 8
    overlong="truncate"  items [3, 8, 4]            truncated [1], 3 tokens lost
    overlong="drop"      items [3, 4]               source [0, 2], dropped [1]
    overlong="split"     items [3, 8, 3, 4]         source [0, 1, 1, 2], offset [0, 0, 8, 0]

``PLANNERS`` maps each strategy name (``padless.planning.plan.STRATEGIES``, in that order) to its
engine in :mod:`padless.planning._binpack`, under one signature.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from padless.planning import _binpack
from padless.planning.checks import overlong_error

# planner(sizes, capacity, max_per_row, seed) -> Rows(item, offset inside the item, length, row_offsets)
Planner = Callable[[np.ndarray, int, "int | None", int], _binpack.Rows]


def _unseeded(engine: Callable[[np.ndarray, int, "int | None"], _binpack.Rows]) -> Planner:
    """An engine that takes no seed, as a planner (the seed is not used)."""
    return lambda sizes, capacity, max_per_row, seed: engine(sizes, capacity, max_per_row)


PLANNERS: dict[str, Planner] = {
    "next_fit": _unseeded(_binpack.next_fit),
    "first_fit_decreasing": _unseeded(_binpack.best_fit_decreasing),  # deprecated: plan.DEPRECATED_STRATEGIES
    "best_fit_decreasing": _unseeded(_binpack.best_fit_decreasing),
    "histogram_best_fit": _binpack.histogram_best_fit,
    "wrapped": _unseeded(_binpack.wrapped),
}
"""Strategy name -> its token-only engine."""


def empty() -> np.ndarray:
    """int64 ``[0]``."""
    return np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Items:
    """What the planners pack once the overlong policy has been applied: whole or partial sequences."""

    sizes: np.ndarray
    """int64 ``[m]``: tokens per item, each ``<= max_length`` (unless ``cut`` was False)."""
    source: np.ndarray | None
    """int64 ``[m]``: source sequence of each item; None when item ``i`` is sequence ``i``."""
    offset: np.ndarray | None
    """int64 ``[m]``: where each item starts in its sequence; None when all start at 0."""
    truncated: np.ndarray
    """int64: sequences cut to ``max_length``, ascending."""
    dropped: np.ndarray
    """int64: sequences left out, ascending."""
    truncated_tokens: int = 0
    dropped_tokens: int = 0

    @classmethod
    def of(cls, lengths: np.ndarray, max_length: int, overlong: str, *, cut: bool) -> Items:
        """Apply ``overlong`` to sequences over ``max_length``; ``cut=False`` leaves ``split`` to the
        strategy (``wrapped`` cuts every sequence at row boundaries anyway)."""
        long = np.flatnonzero(lengths > max_length)
        if long.size == 0 or (overlong == "split" and not cut):
            return cls(lengths, None, None, empty(), empty())
        if overlong == "error":
            i = int(long[0])
            raise overlong_error(i, int(lengths[i]), max_length, more=long.size - 1)
        if overlong == "truncate":
            lost = int((lengths[long] - max_length).sum())
            return cls(np.minimum(lengths, max_length), None, None, long, empty(), truncated_tokens=lost)
        if overlong == "drop":
            keep = np.flatnonzero(lengths <= max_length)
            return cls(lengths[keep], keep, None, empty(), long, dropped_tokens=int(lengths[long].sum()))
        # split: a sequence of length l becomes ceil(l / max_length) consecutive pieces
        pieces = -(-lengths // max_length)
        source = np.repeat(np.arange(lengths.size, dtype=np.int64), pieces)
        offset = (np.arange(source.size) - np.repeat(np.cumsum(pieces) - pieces, pieces)) * max_length
        return cls(np.minimum(lengths[source] - offset, max_length), source, offset, empty(), empty())
