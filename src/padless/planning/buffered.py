"""Buffered planning: sequence lengths arriving one by one -> rows, with a bounded buffer (pure numpy).

The planner behind :class:`padless.batching.stream.PackedStream`, with no tokens, so that it can be tested and
measured on a list of ints like the offline planners. Up to ``buffer_size`` sequences wait in a
buffer; when it is full the buffer is planned with best-fit decreasing (:func:`padless.plan_packs`,
``histogram_best_fit``: the histogram engine with its oldest-group-first ties, which the resume
positions of streamed plans are recorded against) and

* a row leaves when it is *full enough* (``>= min_fill * max_length`` tokens);
* if the rows left behind would still hold more than half the buffer, the fullest of them leave too
  (the buffer *must make room*, so every round reads at least ``buffer_size / 2`` new sequences);
* among pieces of equal length, the oldest take the places in the rows that leave; a piece staying
  behind for more than ``max_delay / 2`` sequences moves into a leaving row (into its free space,
  or swapped with the shortest younger piece that makes room); a row still holding a piece read
  more than ``max_delay`` sequences ago leaves whatever its fill. This bounds how far back a resume
  re-reads and how long a sequence waits, without nearly empty rows for the smallest sequences,
  which otherwise keep landing in the plan's under-full tail;
* the rest go back into the buffer, to be planned again with the next sequences; at the end of the
  source everything left is flushed::

      lengths  ->  [ buffer: <= buffer_size pieces ]  --best fit-->  full rows  ->  out
                         ^                                 |
                         +------ under-full rows' pieces ----+

Sequences longer than ``max_length`` follow ``overlong`` as in the planner (``error`` | ``truncate``
| ``split`` | ``drop``), applied as they arrive, and are counted. A row is a tuple of pieces
``(position, start, length)``: ``position`` counts the sequences added from 0, ``start`` is where the
piece begins in its sequence (non-zero only for ``split``).

On lognormal and uniform lengths the rows are within 0.1 point of efficiency of the offline planner
at ``buffer_size=4096`` (``compare_stream_to_offline``; ``benchmarks/stream.py`` prints the figures).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from padless.layout import Piece  # here: (position in the stream, start in the sequence, tokens)
from padless.planning.checks import OVERLONG_DEFAULT, check_choice, check_int, overlong_error
from padless.planning.plan import OVERLONG_POLICIES, OverlongPolicy, PackPlan, PlanStats, plan_packs, validate_lengths


@dataclass(frozen=True)
class StreamOptions:
    """How a stream is packed; a saved state only loads into a stream with equal options."""

    max_length: int
    """Row capacity in tokens."""
    buffer_size: int = 4096
    """Sequences (pieces, with ``overlong="split"``) held before the buffer is planned."""
    overlong: OverlongPolicy = OVERLONG_DEFAULT
    """Policy for a sequence longer than ``max_length``: ``error`` | ``truncate`` | ``split`` | ``drop``."""
    min_fill: float = 0.995
    """A planned row leaves the buffer once it holds at least this share of ``max_length``."""
    max_delay: int | None = None
    """A row holding a sequence read this many sequences ago leaves whatever its fill; bounds how far
    back a resume re-reads. Default ``4 * buffer_size``."""

    def __post_init__(self) -> None:
        for name in ("max_length", "buffer_size"):
            object.__setattr__(self, name, check_int(getattr(self, name), name))  # plain ints: the state is JSON
        check_choice(self.overlong, OVERLONG_POLICIES, "overlong policy")
        if not 0.0 <= self.min_fill <= 1.0:
            raise ValueError(f"min_fill must lie in [0, 1], got {self.min_fill!r}")
        object.__setattr__(self, "min_fill", float(self.min_fill))
        if self.max_delay is None:
            object.__setattr__(self, "max_delay", 4 * self.buffer_size)
        elif self.max_delay < self.buffer_size:
            raise ValueError(f"max_delay ({self.max_delay}) must be >= buffer_size ({self.buffer_size})")
        object.__setattr__(self, "max_delay", int(self.max_delay))


@dataclass
class StreamCounts:
    """Running totals of a stream (restored with its state, so a resumed run reports the whole run)."""

    sequences: int = 0
    """Sequences read, including dropped ones."""
    tokens_in: int = 0
    """Tokens of the sequences read."""
    rows: int = 0
    """Rows yielded."""
    pieces: int = 0
    """Documents in the rows yielded."""
    tokens_out: int = 0
    """Tokens in the rows yielded (``tokens_in`` minus truncated and dropped ones, once all is flushed)."""
    max_per_row: int = 0
    """Most documents in any row."""
    truncated_sequences: int = 0
    truncated_tokens: int = 0
    split_sequences: int = 0
    dropped_sequences: int = 0
    dropped_tokens: int = 0

    def plan_stats(self, max_length: int) -> PlanStats:
        """The offline planner's statistics of the rows yielded so far."""
        return PlanStats.of_rows(
            max_length=max_length,
            num_sequences=self.sequences,
            num_rows=self.rows,
            real_tokens=self.tokens_out,
            pieces=self.pieces,
            max_per_row=self.max_per_row,
            truncated_sequences=self.truncated_sequences,
            truncated_tokens=self.truncated_tokens,
            split_sequences=self.split_sequences,
            dropped_sequences=self.dropped_sequences,
            dropped_tokens=self.dropped_tokens,
        )


class StreamPlanner:
    """Lengths in, rows of pieces out: the buffer and its rules, with no tokens (pure numpy).

    Call :meth:`add` per sequence, take rows with :meth:`pop` while :attr:`pending`, and :meth:`finish`
    at the end of the source. Positions count the sequences added, from 0.
    """

    def __init__(self, options: StreamOptions) -> None:
        self.options = options
        self.consumed = 0
        self.buffer: list[Piece] = []
        self.pending: deque[tuple[Piece, ...]] = deque()
        self.counts = StreamCounts()
        self.rounds = 0
        """Times the buffer was planned (not saved: it only tells a caller that a round happened)."""
        self._full = int(np.ceil(options.min_fill * options.max_length - 1e-9))

    def add(self, length: int) -> tuple[int, int]:
        """Take the next sequence; returns ``(tokens kept, pieces made)`` after the overlong policy
        (``(0, 0)`` if dropped). Plans the buffer when it is full."""
        o, pos, c = self.options, self.consumed, self.counts
        if length < 1:
            raise ValueError(f"sequence {pos} is empty; every sequence needs at least 1 token")
        kept, cap = length, o.max_length
        if length > cap:
            if o.overlong == "error":
                raise overlong_error(pos, length, cap)
            if o.overlong == "drop":
                c.dropped_sequences += 1
                c.dropped_tokens += length
                kept = 0
            elif o.overlong == "truncate":
                c.truncated_sequences += 1
                c.truncated_tokens += length - cap
                kept = cap
            else:
                c.split_sequences += 1
        self.consumed += 1
        c.sequences += 1
        c.tokens_in += length
        made = [(pos, s, min(cap, kept - s)) for s in range(0, kept, cap)]
        self.buffer.extend(made)
        if len(self.buffer) >= o.buffer_size:
            self._plan(final=False)
        return kept, len(made)

    def finish(self) -> None:
        """The source has ended: every buffered piece goes into a row."""
        if self.buffer:
            self._plan(final=True)

    def pop(self) -> tuple[Piece, ...]:
        """The next row (raises ``IndexError`` if none is pending)."""
        row = self.pending.popleft()
        c = self.counts
        c.rows += 1
        c.pieces += len(row)
        c.tokens_out += sum(n for _, _, n in row)
        c.max_per_row = max(c.max_per_row, len(row))
        return row

    def oldest(self) -> int:
        """The lowest position still buffered or pending (``consumed`` if none): where a resume re-reads from."""
        return min([p for p, _, _ in self.buffer] + [p for r in self.pending for p, _, _ in r], default=self.consumed)

    def _plan(self, final: bool) -> None:
        self.rounds += 1
        pos, length = np.array([p[0] for p in self.buffer]), np.array([p[2] for p in self.buffer])
        # Every piece fits (overlong is applied in `add`). The histogram engine makes best-fit
        # decreasing's rows, several times faster on a buffer of thousands; its seed is fixed.
        plan = plan_packs(length, self.options.max_length, strategy="histogram_best_fit")
        index = plan.index
        offsets = plan.row_offsets
        if final:
            emit = np.ones(plan.num_rows, dtype=bool)
        else:
            emit = self._choose(plan.row_lengths, np.diff(offsets))
            index = _oldest_first(plan, emit, pos, length)
            index, offsets = self._rehome_aged(index, offsets, emit, pos, length)
            # Rehoming can empty a row; reduceat gives an empty segment its start element, so empty
            # rows are masked (and the starts clipped, for an empty last row).
            nonempty = offsets[1:] > offsets[:-1]
            oldest = np.minimum.reduceat(pos[index], np.minimum(offsets[:-1], max(index.size - 1, 0)))
            emit |= nonempty & (oldest < self.consumed - self.options.max_delay)
        out = np.zeros(len(self.buffer), dtype=bool)
        for r in np.flatnonzero(emit).tolist():
            members = index[offsets[r] : offsets[r + 1]]
            if members.size:
                out[members] = True
                self.pending.append(tuple(self.buffer[i] for i in members.tolist()))
        self.buffer = [p for p, gone in zip(self.buffer, out.tolist()) if not gone]  # buffer order kept

    def _rehome_aged(
        self, index: np.ndarray, offsets: np.ndarray, emit: np.ndarray, pos: np.ndarray, length: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Give pieces older than ``max_delay / 2`` that stay behind a place in a leaving row, so that they
        rarely need a nearly empty row of their own at ``max_delay`` (the smallest sequences tend to
        sit in the plan's under-full tail). Oldest first, each goes into a leaving row's free space if
        one has room, else swaps with the shortest younger piece of a leaving row that makes room
        (that row loses ``its length - the aged one's`` tokens, usually a few)."""
        row_of = np.repeat(np.arange(emit.size), np.diff(offsets))
        cutoff = self.consumed - self.options.max_delay // 2
        aged = np.flatnonzero(~emit[row_of] & (pos[index] < cutoff))
        if aged.size == 0:
            return index, offsets
        size = length[index]
        free = self.options.max_length - np.bincount(row_of, weights=size, minlength=emit.size).astype(np.int64)
        movable = emit[row_of] & (pos[index] >= cutoff)  # young pieces of leaving rows
        for slot in aged[np.argsort(pos[index[aged]], kind="stable")].tolist():
            s, home = int(size[slot]), int(row_of[slot])
            room = np.flatnonzero(emit & (free >= s))
            if room.size:  # free space: no cost
                r = int(room[np.argmin(free[room])])
                free[r] -= s
                row_of[slot] = r
                continue
            cand = np.flatnonzero(movable & (size >= s - free[row_of]))
            if cand.size:
                other = int(cand[np.lexsort((-pos[index[cand]], size[cand]))[0]])  # shortest, then youngest
                r = int(row_of[other])
                free[r] += int(size[other]) - s
                row_of[slot], row_of[other] = r, home
                movable[other] = False
        order = np.argsort(row_of, kind="stable")
        counts = np.bincount(row_of, minlength=emit.size)
        return index[order], np.concatenate(([0], np.cumsum(counts)))

    def _choose(self, fill: np.ndarray, per_row: np.ndarray) -> np.ndarray:
        """Rows that leave by their shape: full enough; then the fullest others until half the buffer is free."""
        emit = fill >= self._full
        excess = int(per_row[~emit].sum()) - self.options.buffer_size // 2
        if excess > 0:
            rest = np.flatnonzero(~emit)
            rest = rest[np.argsort(-fill[rest], kind="stable")]  # fullest first, ties by row order
            emit[rest[: int(np.searchsorted(np.cumsum(per_row[rest]), excess)) + 1]] = True
        return emit

    def state_dict(self) -> dict[str, Any]:
        """Positions only (see the module docstring)."""
        flat = [p for r in self.pending for p in r]
        return {
            "consumed": self.consumed,
            "buffer": [list(col) for col in zip(*self.buffer)] if self.buffer else [[], [], []],
            "pending": [list(col) for col in zip(*flat)] if flat else [[], [], []],
            "pending_sizes": [len(r) for r in self.pending],
            "counts": asdict(self.counts),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.consumed = int(state["consumed"])
        self.buffer = [tuple(map(int, p)) for p in zip(*state["buffer"])]  # type: ignore[misc]
        flat = [tuple(map(int, p)) for p in zip(*state["pending"])]
        self.pending = deque()
        at = 0
        for n in state["pending_sizes"]:
            self.pending.append(tuple(flat[at : at + n]))  # type: ignore[arg-type]
            at += n
        self.counts = StreamCounts(**state["counts"])


def _oldest_first(plan: PackPlan, emit: np.ndarray, pos: np.ndarray, length: np.ndarray) -> np.ndarray:
    """The plan's rows with equal-length pieces swapped so that the oldest go into the rows that leave.

    Rows keep their shape (the length of each slot), so fills and choices are unchanged; only which of
    several equal-length pieces takes a slot changes. Without this, a piece could keep landing in the
    under-full tail of the plan until ``max_delay`` forces it out in a nearly empty row.
    """
    n = plan.index.size
    slot = np.arange(n)
    sizes = length[plan.index]
    staying = ~emit[np.repeat(np.arange(plan.num_rows), np.diff(plan.row_offsets))]
    slots = np.lexsort((slot, staying, sizes))  # by length, slots of leaving rows first
    items = np.lexsort((slot, pos, length))  # by length, oldest first
    index = np.empty(n, dtype=np.int64)
    index[slots] = items  # both orders hold the same number of each length, so lengths match
    return index


def stream_plan(lengths: Sequence[int] | np.ndarray, max_length: int, **options: Any) -> PackPlan:
    """The rows the stream would yield for these lengths, as a :class:`padless.PackPlan` (row order =
    yield order), so its ``stats`` and ``check`` apply. ``options`` are :class:`StreamOptions` fields."""
    lengths = validate_lengths(lengths)
    opts = StreamOptions(max_length=max_length, **options)
    planner = StreamPlanner(opts)
    rows: list[tuple[Piece, ...]] = []
    for n in lengths.tolist():
        planner.add(n)
        while planner.pending:
            rows.append(planner.pop())
    planner.finish()
    rows.extend(planner.pop() for _ in range(len(planner.pending)))
    pieces = np.array([p for r in rows for p in r], dtype=np.int64).reshape(-1, 3)
    long = np.flatnonzero(lengths > opts.max_length)
    c = planner.counts
    return PackPlan(
        max_length=opts.max_length,
        num_sequences=lengths.size,
        index=pieces[:, 0],
        start=pieces[:, 1],
        length=pieces[:, 2],
        row_offsets=np.concatenate(([0], np.cumsum([len(r) for r in rows], dtype=np.int64))),
        dropped=long if opts.overlong == "drop" else long[:0],
        truncated=long if opts.overlong == "truncate" else long[:0],
        truncated_tokens=c.truncated_tokens,
        dropped_tokens=c.dropped_tokens,
    )


@dataclass(frozen=True)
class StreamComparison:
    """Streaming packing next to the offline planner on the same lengths."""

    stream: PlanStats
    """Statistics of the rows the stream yields."""
    offline: PlanStats
    """Statistics of ``plan_packs`` (best-fit decreasing over all lengths at once)."""
    buffer_size: int
    """The stream's buffer."""

    @property
    def efficiency_gap(self) -> float:
        """``offline.efficiency - stream.efficiency`` (0.01 = one point of padding more)."""
        return self.offline.efficiency - self.stream.efficiency


def compare_stream_to_offline(
    lengths: Sequence[int] | np.ndarray, max_length: int, *, strategy: str = "best_fit_decreasing", **options: Any
) -> StreamComparison:
    """Pack ``lengths`` both ways; ``options`` are :class:`StreamOptions` fields, ``strategy`` the offline one."""
    streamed = stream_plan(lengths, max_length, **options)
    overlong = options.get("overlong", "error")
    offline = plan_packs(lengths, max_length, strategy=strategy, overlong=overlong)  # type: ignore[arg-type]
    return StreamComparison(streamed.stats, offline.stats, StreamOptions(max_length, **options).buffer_size)
