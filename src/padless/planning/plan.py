"""Packing planners: sequence lengths -> which sequences share a row (pure numpy, no tokens).

``plan_packs(lengths, max_length)`` returns a :class:`PackPlan`: flat arrays that say, row by row,
which slice of which sequence goes where. Tokens are placed into rows later by the collators, so a
planner can be tested on a list of ints and plans a million sequences in well under a second::

    lengths  [5, 3, 6, 2]   max_length 8, best_fit_decreasing
    row 0    seq 2 (6) + seq 3 (2)     8/8 tokens
    row 1    seq 0 (5) + seq 1 (3)     8/8 tokens

Strategies (``STRATEGIES``; rows in the order they were opened, pieces in a row in placement order):

* ``next_fit``: keeps the input order; opens a new row when the next sequence does not fit.
* ``best_fit_decreasing`` (the default): textbook best fit decreasing, longest first, each sequence
  into the fullest row with room (ties: the lowest-numbered row). Planned on the histogram of lengths
  (Krell et al. 2021, SPFHP): whole groups of identical rows at a time, laid out with counting sorts
  only, O(n) with a small constant, yet the same rows, item for item, as the one-at-a-time algorithm
  (the tests hold it to that reference), ``max_per_row`` included.
* ``histogram_best_fit``: the same engine with ties to the oldest group of rows. Without
  ``max_per_row`` it makes as many rows as ``best_fit_decreasing``, with the same fills (which
  sequences share a row may differ where rows tie on free room); rows come grouped by pattern. The
  only strategy that uses ``seed``: for each length, it rotates which sequence of that length fills
  the first slot of that length (so the seed changes which sequences share a row, not the rows' shape).
* ``first_fit_decreasing``: deprecated (a ``DeprecationWarning``), kept so that code passing it still runs;
  it plans as ``best_fit_decreasing``. First fit earned no place: on the built-in corpora and 1M synthetic
  lengths (rows of 512-4096, with and without ``max_per_row``) it made the same rows as best fit in
  1.2-23x the time of the histogram engine, and on 20,000 small random inputs more rows 22 times,
  fewer never.
* ``wrapped``: concatenates in order and cuts every ``max_length`` tokens; a cut sequence continues
  as a separate document in the next row (``start`` says where each piece begins).

Which to use: the default. Measured in one run (``benchmarks/planners.py``, output in
``docs/bench/planners.txt``; 2 cores shared with other jobs, load average 6-8; rows of 2048, every
plan at most 0.0081% over the lower bound, as many rows as seqpacker's Rust ``obfd``):
``best_fit_decreasing`` plans 1M lognormal lengths (median 60) in 0.063 s (``histogram_best_fit``
0.071 s, seqpacker 0.17 s, TRL's ``bfd`` 22 s), 10M in 0.45 s (0.34 s, 2.3 s) and 16M in 0.68 s
(0.69 s, 3.5 s): 2.6-8.5x as fast as seqpacker at every size, on lognormal and uniform lengths.

Sequences longer than ``max_length`` follow ``overlong`` (``OVERLONG_POLICIES``), applied before any
strategy: ``error`` raises, ``truncate`` keeps the first ``max_length`` tokens, ``split`` cuts into
pieces of at most ``max_length`` (separate documents), ``drop`` leaves the sequence out. Truncated,
split and dropped sequences are counted in :class:`PlanStats`. Every strategy is deterministic.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import InitVar, asdict, dataclass, field
from functools import cached_property
from typing import Literal, get_args

import numpy as np

from padless.planning._costpack import plan_with_costs
from padless.planning.checks import OVERLONG_DEFAULT, check_choice, check_int, integer_array
from padless.planning.items import PLANNERS, Items, empty

Strategy = Literal["next_fit", "first_fit_decreasing", "best_fit_decreasing", "histogram_best_fit", "wrapped"]
OverlongPolicy = Literal["error", "truncate", "split", "drop"]

STRATEGIES: tuple[str, ...] = get_args(Strategy)
OVERLONG_POLICIES: tuple[str, ...] = get_args(OverlongPolicy)

DEPRECATED_STRATEGIES: dict[str, str] = {"first_fit_decreasing": "best_fit_decreasing"}
"""Deprecated strategy name -> the strategy it plans as, the name to pass instead (a ``DeprecationWarning``
says so)."""


@dataclass(frozen=True)
class PlanStats:
    """How well a plan uses its rows, and what the overlong policy cost."""

    num_sequences: int
    """Input sequences, including dropped ones."""
    num_rows: int
    """Rows of ``max_length`` tokens the plan fills."""
    real_tokens: int
    """Tokens placed in rows."""
    capacity_tokens: int
    """``num_rows * max_length``."""
    efficiency: float
    """``real_tokens / capacity_tokens`` (1.0 for an empty plan: nothing is wasted)."""
    padding_fraction: float
    """``1 - efficiency``: the share of row tokens that would be padding."""
    lower_bound: int
    """``ceil(real_tokens / max_length)``: no plan of these pieces can use fewer rows."""
    gap_to_lower_bound: int
    """``num_rows - lower_bound``."""
    relative_gap: float
    """``gap_to_lower_bound / lower_bound`` (0.0 when the bound is 0)."""
    mean_per_row: float
    """Pieces (documents) per row on average."""
    max_per_row: int
    """Most pieces in any row."""
    truncated_sequences: int
    """Sequences cut to ``max_length`` by ``overlong="truncate"``."""
    truncated_tokens: int
    """Tokens those sequences lost."""
    split_sequences: int
    """Sequences placed as more than one piece (``overlong="split"`` or cut by ``wrapped``)."""
    dropped_sequences: int
    """Sequences left out by ``overlong="drop"``."""
    dropped_tokens: int
    """Tokens those sequences had."""

    def as_dict(self) -> dict[str, int | float]:
        return asdict(self)

    @classmethod
    def of_rows(
        cls,
        *,
        max_length: int,
        num_sequences: int,
        num_rows: int,
        real_tokens: int,
        pieces: int,
        max_per_row: int,
        truncated_sequences: int = 0,
        truncated_tokens: int = 0,
        split_sequences: int = 0,
        dropped_sequences: int = 0,
        dropped_tokens: int = 0,
    ) -> PlanStats:
        """The one place the derived figures (capacity, efficiency, lower bound, gaps, documents per
        row) are computed from the counts of a plan's rows; :attr:`PackPlan.stats` and the streaming
        planner's running counts both call it."""
        capacity = num_rows * max_length
        efficiency = real_tokens / capacity if capacity else 1.0
        bound = -(-real_tokens // max_length)
        return cls(
            num_sequences=num_sequences,
            num_rows=num_rows,
            real_tokens=real_tokens,
            capacity_tokens=capacity,
            efficiency=efficiency,
            padding_fraction=1.0 - efficiency,
            lower_bound=bound,
            gap_to_lower_bound=num_rows - bound,
            relative_gap=(num_rows - bound) / bound if bound else 0.0,
            mean_per_row=pieces / num_rows if num_rows else 0.0,
            max_per_row=max_per_row,
            truncated_sequences=truncated_sequences,
            truncated_tokens=truncated_tokens,
            split_sequences=split_sequences,
            dropped_sequences=dropped_sequences,
            dropped_tokens=dropped_tokens,
        )


@dataclass(frozen=True, eq=False)
class PackPlan:
    """Which slice of which sequence goes into which row: flat arrays, one entry per piece.

    A piece is a whole sequence, or a slice of one (``split`` / ``wrapped``), placed as its own
    document. Row ``r`` holds pieces ``row_offsets[r]:row_offsets[r + 1]``. Arrays are read-only.
    """

    max_length: int
    """Row capacity in tokens."""
    num_sequences: int
    """Length of the input lengths list (sequence indices run ``0..num_sequences - 1``)."""
    index: np.ndarray
    """int64 ``[num_pieces]``: source sequence of each piece, grouped row by row."""
    start: np.ndarray
    """int64 ``[num_pieces]``: offset in the source sequence where the piece begins."""
    length: np.ndarray
    """int64 ``[num_pieces]``: tokens the piece takes."""
    row_offsets: np.ndarray
    """int64 ``[num_rows + 1]``: row ``r`` holds pieces ``row_offsets[r]:row_offsets[r + 1]``."""
    dropped: np.ndarray = field(default_factory=empty)
    """int64: indices of sequences left out (``overlong="drop"``), ascending."""
    truncated: np.ndarray = field(default_factory=empty)
    """int64: indices of sequences cut to ``max_length`` (``overlong="truncate"``), ascending."""
    truncated_tokens: int = 0
    """Tokens removed by truncation."""
    dropped_tokens: int = 0
    """Tokens of the dropped sequences."""
    _owned: InitVar[bool] = False
    """For :func:`plan_packs` only: the int64 arrays are its own fresh ones, frozen without a copy
    (at 10M sequences the copies cost as much as planning)."""

    def __post_init__(self, _owned: bool) -> None:
        for name in ("index", "start", "length", "row_offsets", "dropped", "truncated"):
            # a private copy (or plan_packs' own array), then frozen
            value = getattr(self, name)
            arr = np.asarray(value, dtype=np.int64) if _owned else np.array(value, dtype=np.int64)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)

    @property
    def num_rows(self) -> int:
        return self.row_offsets.size - 1

    def row(self, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(index, start, length)`` views of row ``r``'s pieces."""
        if not -self.num_rows <= r < self.num_rows:
            raise IndexError(f"row {r} out of range for a plan of {self.num_rows} rows")
        r %= self.num_rows
        a, b = self.row_offsets[r], self.row_offsets[r + 1]
        return self.index[a:b], self.start[a:b], self.length[a:b]

    def rows(self) -> list[np.ndarray]:
        """Source indices per row (a convenience; the flat arrays are the plan)."""
        return np.split(self.index, self.row_offsets[1:-1]) if self.num_rows else []

    @cached_property
    def row_lengths(self) -> np.ndarray:
        """int64 ``[num_rows]``: tokens used in each row."""
        cum = np.concatenate(([0], np.cumsum(self.length)))
        return cum[self.row_offsets[1:]] - cum[self.row_offsets[:-1]]

    @cached_property
    def stats(self) -> PlanStats:
        """Rows, efficiency, gap to the lower bound and overlong counts (computed once)."""
        rows = self.num_rows
        pieces = np.bincount(self.index, minlength=self.num_sequences) if self.index.size else self.index
        return PlanStats.of_rows(
            max_length=self.max_length,
            num_sequences=self.num_sequences,
            num_rows=rows,
            real_tokens=int(self.length.sum()),
            pieces=int(self.index.size),
            max_per_row=int(np.diff(self.row_offsets).max()) if rows else 0,
            truncated_sequences=int(self.truncated.size),
            truncated_tokens=self.truncated_tokens,
            split_sequences=int((pieces > 1).sum()),
            dropped_sequences=int(self.dropped.size),
            dropped_tokens=self.dropped_tokens,
        )

    def check(self, lengths: Sequence[int] | np.ndarray) -> None:
        """Raise ``ValueError`` unless this plan accounts for every token of ``lengths`` exactly once.

        Every row fits ``max_length``; every sequence is dropped (and absent), or its pieces cover
        ``[0, placed)`` contiguously, where ``placed`` is its length (or ``max_length`` if truncated).
        """
        lengths = validate_lengths(lengths)
        if lengths.size != self.num_sequences:
            raise ValueError(f"plan is for {self.num_sequences} sequences, got {lengths.size} lengths")
        if self.num_rows and int(self.row_lengths.max()) > self.max_length:
            r = int(np.argmax(self.row_lengths))
            raise ValueError(f"row {r} holds {int(self.row_lengths[r])} tokens > max_length {self.max_length}")
        if np.any(np.diff(self.row_offsets) < 1) or self.row_offsets[0] != 0 or self.row_offsets[-1] != self.index.size:
            raise ValueError("row_offsets must rise strictly from 0 to the number of pieces")
        if self.length.size and self.length.min() < 1:
            raise ValueError(f"piece {int(np.argmin(self.length))} is empty")
        placed = lengths.copy()
        placed[self.truncated] = np.minimum(placed[self.truncated], self.max_length)
        placed[self.dropped] = 0
        if (
            int(lengths[self.dropped].sum()) != self.dropped_tokens
            or int((lengths - np.minimum(lengths, self.max_length))[self.truncated].sum()) != self.truncated_tokens
        ):
            raise ValueError("dropped_tokens / truncated_tokens do not match the lengths")
        # Sort pieces by (sequence, start): each sequence's pieces must tile [0, placed) in order.
        order = np.lexsort((self.start, self.index))
        idx, st, ln = self.index[order], self.start[order], self.length[order]
        first = np.ones(idx.size, dtype=bool)
        first[1:] = idx[1:] != idx[:-1]
        expected = np.where(first, 0, np.concatenate(([0], st[:-1] + ln[:-1])))
        if np.any(st != expected):
            bad = int(idx[np.flatnonzero(st != expected)[0]])
            raise ValueError(f"pieces of sequence {bad} do not start at 0 and follow each other")
        covered = np.bincount(idx, weights=ln, minlength=lengths.size).astype(np.int64)
        if np.any(covered != placed):
            bad = int(np.flatnonzero(covered != placed)[0])
            raise ValueError(f"sequence {bad}: plan places {int(covered[bad])} tokens, expected {int(placed[bad])}")

    def save(self, path: str) -> None:
        """Write the flat arrays (and scalars) to an ``.npz`` file, atomically (:mod:`padless.atomic`);
        ``.npz`` is appended to ``path`` if missing, as ``numpy.savez`` does. :meth:`load` reads it back."""
        from padless.atomic import atomic_write

        arrays = dict(
            max_length=self.max_length,
            num_sequences=self.num_sequences,
            index=self.index,
            start=self.start,
            length=self.length,
            row_offsets=self.row_offsets,
            dropped=self.dropped,
            truncated=self.truncated,
            truncated_tokens=self.truncated_tokens,
            dropped_tokens=self.dropped_tokens,
        )
        atomic_write(path if str(path).endswith(".npz") else f"{path}.npz", lambda f: np.savez(f, **arrays))

    @classmethod
    def load(cls, path: str) -> PackPlan:
        with np.load(path, allow_pickle=False) as f:
            scalars = {k: int(f[k]) for k in ("max_length", "num_sequences", "truncated_tokens", "dropped_tokens")}
            arrays = {k: f[k] for k in ("index", "start", "length", "row_offsets", "dropped", "truncated")}
        return cls(**scalars, **arrays)


def validate_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """Lengths as int64 ``[n]``, or ``ValueError`` naming the first bad entry."""
    arr = integer_array(lengths, "lengths")
    if arr.size and arr.min() < 1:
        i = int(np.flatnonzero(arr < 1)[0])
        raise ValueError(f"sequence {i} has length {int(arr[i])}; every sequence needs at least 1 token")
    return arr


def plan_packs(
    lengths: Sequence[int] | np.ndarray,
    max_length: int,
    *,
    strategy: Strategy = "best_fit_decreasing",
    overlong: OverlongPolicy = OVERLONG_DEFAULT,
    max_per_row: int | None = None,
    seed: int = 0,
    costs: Sequence[int] | np.ndarray | None = None,
    max_cost: int | None = None,
) -> PackPlan:
    """Plan rows of ``max_length`` tokens for sequences of the given ``lengths``.

    ``max_per_row`` caps the pieces (documents) per row. ``seed`` only affects
    ``histogram_best_fit`` (which of several equal-length sequences fills a slot, not the rows'
    shape). See the module docstring for the strategies and overlong policies.

    ``costs`` (one non-negative int per sequence, e.g. image patches, 0 for text-only) and
    ``max_cost`` (the most cost a row may hold) add a second limit per row, and refuse to cut a
    sequence with cost > 0: :mod:`padless.planning.costs` says how each strategy honours them. With
    ``costs=None`` the plan is exactly the token-only one.
    """
    lengths = validate_lengths(lengths)
    max_length = check_int(max_length, "max_length")
    check_choice(strategy, STRATEGIES, "strategy")
    if strategy in DEPRECATED_STRATEGIES:
        instead = DEPRECATED_STRATEGIES[strategy]
        message = f"strategy {strategy!r} is deprecated: it plans as {instead!r}; pass strategy={instead!r}"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
    check_choice(overlong, OVERLONG_POLICIES, "overlong policy")
    if max_per_row is not None:
        max_per_row = check_int(max_per_row, "max_per_row")
    if costs is not None or max_cost is not None:
        fields = plan_with_costs(lengths, max_length, costs, max_cost, strategy, overlong, max_per_row, seed)
        return PackPlan(**fields, _owned=True)  # every array is the engines' or plan_with_costs' own
    items = Items.of(lengths, max_length, overlong, cut=strategy != "wrapped")
    item, within, length, row_offsets = PLANNERS[strategy](items.sizes, max_length, max_per_row, seed)
    index = item if items.source is None else items.source[item]
    start = within if items.offset is None else items.offset[item] + within
    return PackPlan(
        max_length=max_length,
        num_sequences=lengths.size,
        index=index,
        start=start,
        length=length,
        row_offsets=row_offsets,
        dropped=items.dropped,
        truncated=items.truncated,
        truncated_tokens=items.truncated_tokens,
        dropped_tokens=items.dropped_tokens,
        _owned=True,  # every array above was made here or by a planner, none is the caller's
    )
