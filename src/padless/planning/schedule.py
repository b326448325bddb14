"""The per-epoch schedule of packed rows for data-parallel training: the same plan on every rank.

Every rank calls :func:`schedule_epoch` with the same lengths, seed and epoch and gets the same
:class:`EpochSchedule` without any communication: the sequences are shuffled, packed into rows of
``max_length`` tokens (:func:`padless.plan_packs`), the rows shuffled, then grouped into steps of
``world_size * rows_per_batch`` rows of similar size (so no rank of a step waits on a much fuller
one), the steps shuffled, and each step's rows dealt to the ranks so their token counts are as even
as possible (longest row first, to the rank with the fewest tokens that has room)::

    step 0    rank 0: rows 7, 2      rank 1: rows 4, 9       (rows_per_batch = 2)
    step 1    rank 0: rows 1, 5      rank 1: rows 0, 8
    step 2    rank 0: row 3          rank 1: (empty row)     remainder="empty"

``balance`` (:data:`padless.planning.balance.BALANCES`) says what the steps and the deal even out:

* ``tokens`` (default): as above, by row tokens.
* ``cost``: by row cost, ``sum over the row's documents of (a * l + l**2)``
  (:func:`padless.planning.balance.row_costs`; ``a`` from ``cost_a``, a number or the model's config):
  a row of one long document costs more than a row of the same tokens in short ones, since
  attention is quadratic in the document. Rows are sorted by cost and cut into steps, and each
  step's rows are split into ``world_size`` parts of ``rows_per_batch`` rows by Karmarkar-Karp's
  largest differencing (:func:`padless.planning.balance.partition_many`, all steps at once), which
  bounds each step's ``max - min`` rank cost by the widest cost gap among ``world_size`` rows of
  consecutive cost. Part ``p`` of the ``s``-th step goes to rank ``(p + s) % world_size``, so every
  rank takes a step's heaviest part equally often and the epoch's rank totals stay even.

Every rank runs the same number of steps, so no rank waits forever in a collective. The rows that do
not fill a last step follow ``remainder`` (:data:`REMAINDERS`), and :class:`EpochSchedule` counts them:

* ``empty`` (default): the last step keeps only the leftover rows, dealt as evenly as possible; a rank
  left without one gets an *empty row* (one pad token, nothing trained, zero loss). Every row is
  trained exactly once per epoch; the cost is one near-free micro-batch on some ranks.
* ``repeat``: the last step is filled up with rows from the start of the epoch's order, as
  ``torch.utils.data.DistributedSampler`` does; those rows are trained twice in the epoch.
* ``drop``: the leftover rows are not trained this epoch (different ones each epoch when shuffled).

:class:`DistributedPackedBatchSampler` yields, for its rank, one list of *row keys* per micro-batch:
a row key is a tuple of ``(sequence, start, length)`` pieces (``()`` is the empty row). A
:class:`PackedRowView` over the dataset turns a key into a pre-packed row feature (``input_ids``,
``labels``, ``seq_lengths``) that :class:`padless.PackingCollator` places as it is, without
re-planning, so a rank trains on exactly its planned rows (both live in :mod:`padless.batching`).
Keys carry the row's content, so DataLoader workers need no shared state with the sampler.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from padless.planning.balance import Balance, check_balance, partition_many, row_costs
from padless.planning.checks import OVERLONG_DEFAULT, check_choice, check_int, overlong_error
from padless.planning.plan import OVERLONG_POLICIES, STRATEGIES, PackPlan, plan_packs, validate_lengths

Remainder = Literal["empty", "repeat", "drop"]
REMAINDERS: tuple[str, ...] = get_args(Remainder)

RowKey = tuple[tuple[int, int, int], ...]
"""A planned row: its ``(sequence index, start, length)`` pieces in order; ``()`` is an empty row."""

EMPTY_ROW = -1
"""Row id of an empty row in :attr:`EpochSchedule.batches`."""


@dataclass(frozen=True)
class EpochSchedule:
    """One epoch's rows and which rank trains which row at which step (identical on every rank)."""

    plan: PackPlan
    """The epoch's rows; sequence indices are the dataset's own."""
    batches: list[list[list[int]]]
    """``batches[step][rank]``: row ids of that rank's micro-batch (:data:`EMPTY_ROW` for an empty row)."""
    world_size: int
    """Ranks the rows are dealt to."""
    remainder: str
    """How the rows left over by the last full step were handled (:data:`REMAINDERS`)."""
    repeated_rows: int = 0
    """Rows trained a second time to fill the last step (``remainder="repeat"``)."""
    repeated_tokens: int = 0
    """Tokens of those rows."""
    dropped_rows: int = 0
    """Rows not trained this epoch (``remainder="drop"``)."""
    dropped_tokens: int = 0
    """Tokens of those rows."""
    empty_rows: int = 0
    """Empty rows given to ranks left without a row in the last step (``remainder="empty"``)."""
    tokens_per_rank: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """int64 ``[world_size]``: row tokens each rank trains on over the epoch (repeats included)."""
    balance: str = "tokens"
    """What the steps and the deal to ranks even out (:data:`padless.planning.balance.BALANCES`)."""
    cost_a: float | None = None
    """``a`` of the row cost ``a * l + l**2`` with ``balance="cost"``; ``None`` with ``"tokens"``."""

    @property
    def num_steps(self) -> int:
        """Micro-batches every rank runs this epoch."""
        return len(self.batches)

    def row_key(self, row: int) -> RowKey:
        """The pieces of row ``row`` (``()`` for :data:`EMPTY_ROW`)."""
        if row == EMPTY_ROW:
            return ()
        index, start, length = self.plan.row(row)
        return tuple(zip(index.tolist(), start.tolist(), length.tolist()))

    def step_loads(self, row_values: Sequence[float] | np.ndarray) -> np.ndarray:
        """``[num_steps, world_size]``: the sum of ``row_values`` (one per row of :attr:`plan`: its tokens,
        its :func:`~padless.planning.balance.row_costs`) over each rank's rows at each step; an empty
        row adds 0."""
        values = np.asarray(row_values)
        if values.shape != (self.plan.num_rows,):
            raise ValueError(f"row_values must have one entry per row ({self.plan.num_rows}), got shape {values.shape}")
        padded = np.concatenate([values, np.zeros(1, dtype=values.dtype)])  # EMPTY_ROW (-1) reads the 0
        return np.array([[padded[rows].sum() for rows in step] for step in self.batches])

    def rank_batches(self, rank: int) -> list[list[RowKey]]:
        """Row keys of every micro-batch of ``rank``, in order."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range for world_size {self.world_size}")
        return [[self.row_key(r) for r in step[rank]] for step in self.batches]


def _deal(rows: np.ndarray, tokens: np.ndarray, world_size: int) -> list[list[int]]:
    """Deal ``rows`` to ``world_size`` ranks, at most ``ceil(len / world_size)`` each: longest row first,
    to the rank with the fewest tokens so far that has room (ties: the lower rank). A rank that gets no
    row (fewer rows than ranks) gets an empty row."""
    capacity = -(-rows.size // world_size)
    heap = [(0, r) for r in range(world_size)]  # (tokens so far, rank); full ranks are not pushed back
    out: list[list[int]] = [[] for _ in range(world_size)]
    for row in rows[np.argsort(-tokens[rows], kind="stable")].tolist():
        load, rank = heapq.heappop(heap)
        out[rank].append(row)
        if len(out[rank]) < capacity:
            heapq.heappush(heap, (load + int(tokens[row]), rank))
    return [rows_of_rank or [EMPTY_ROW] for rows_of_rank in out]


def _deal_by_cost(steps: list[np.ndarray], costs: np.ndarray, world_size: int) -> list[list[list[int]]]:
    """Deal each step's rows (in descending cost) to ``world_size`` ranks by largest differencing with
    equal counts (at most ``ceil(len / world_size)`` rows a rank); part ``p`` of the ``s``-th step to
    rank ``(p + s) % world_size``. A rank left without a row gets an empty row."""
    out: list[list[list[int]]] = []
    start = 0
    while start < len(steps):  # runs of steps of one size: the full steps, then a partial last one
        stop = start
        while stop < len(steps) and steps[stop].size == steps[start].size:
            stop += 1
        rows = np.stack(steps[start:stop])  # [steps, rows of a step]
        rank = (partition_many(costs[rows], world_size) + np.arange(start, stop)[:, None]) % world_size
        # one stable sort by (step, rank) for all steps: each rank's rows keep their descending cost
        key = (np.arange(stop - start)[:, None] * world_size + rank).ravel()
        flat = rows.ravel()[np.argsort(key, kind="stable")]
        if rows.shape[1] % world_size == 0:  # full steps: equal counts means rows_per_batch rows each
            out += flat.reshape(stop - start, world_size, -1).tolist()
        else:
            ends = np.cumsum(np.bincount(key, minlength=(stop - start) * world_size)).tolist()
            parts = [flat[b:e].tolist() or [EMPTY_ROW] for b, e in zip([0, *ends[:-1]], ends)]
            out += [parts[i : i + world_size] for i in range(0, len(parts), world_size)]
        start = stop
    return out


def _renumber(plan: PackPlan, perm: np.ndarray) -> PackPlan:
    """``plan`` made over ``lengths[perm]``, with its sequence indices mapped back to ``lengths``'."""
    return PackPlan(
        max_length=plan.max_length,
        num_sequences=plan.num_sequences,
        index=perm[plan.index],
        start=plan.start,
        length=plan.length,
        row_offsets=plan.row_offsets,
        dropped=np.sort(perm[plan.dropped]),
        truncated=np.sort(perm[plan.truncated]),
        truncated_tokens=plan.truncated_tokens,
        dropped_tokens=plan.dropped_tokens,
    )


def check_choices(strategy: str, overlong: str, remainder: str) -> None:
    """Refuse an unknown ``strategy``, ``overlong`` policy or ``remainder`` (before any planning)."""
    check_choice(strategy, STRATEGIES, "strategy")
    check_choice(overlong, OVERLONG_POLICIES, "overlong policy")
    check_choice(remainder, REMAINDERS, "remainder")


def schedule_epoch(
    lengths: Sequence[int] | np.ndarray,
    max_length: int,
    *,
    world_size: int,
    rows_per_batch: int,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    strategy: str = "best_fit_decreasing",
    overlong: str = OVERLONG_DEFAULT,
    remainder: Remainder = "empty",
    max_per_row: int | None = None,
    balance: Balance = "tokens",
    cost_a: Any = None,
    costs: Sequence[int] | np.ndarray | None = None,
    max_cost: int | None = None,
) -> EpochSchedule:
    """Plan one epoch of packed rows and deal them to ``world_size`` ranks, ``rows_per_batch`` rows per
    rank and step. A pure function of its arguments: every rank computes the same schedule.

    ``shuffle`` shuffles the sequences before planning (so equal-length sequences meet different
    partners each epoch), and the rows and steps after; the random stream is seeded with
    ``(seed, epoch)``, so epochs never share a stream with another seed. ``balance`` evens out row
    tokens (``"tokens"``) or row costs (``"cost"``, with ``cost_a``: a number or the model's config);
    see the module docstring. ``costs``/``max_cost``: a second limit per row (one cost per sequence,
    e.g. its image patches; :func:`padless.plan_packs`), so that one row does not collect every large image.
    """
    lengths = validate_lengths(lengths)
    if costs is not None and len(costs) != lengths.size:
        raise ValueError(f"costs has {len(costs)} entries for {lengths.size} sequences; give one per sequence")
    world_size = check_int(world_size, "world_size", 1)
    rows_per_batch = check_int(rows_per_batch, "rows_per_batch", 1)
    epoch = check_int(epoch, "epoch", 0)
    max_length = check_int(max_length, "max_length", 1)
    check_choices(strategy, overlong, remainder)
    a = check_balance(balance, cost_a)
    if overlong == "error" and lengths.size and lengths.max() > max_length:
        # raised here, before the shuffle, so the message names the dataset's own index
        i = int(np.argmax(lengths > max_length))
        raise overlong_error(i, int(lengths[i]), max_length, more=int((lengths > max_length).sum()) - 1)
    rng = np.random.default_rng((check_int(seed, "seed", 0), epoch))
    perm = rng.permutation(lengths.size) if shuffle else np.arange(lengths.size)
    plan_seed = int(rng.integers(2**31))  # only histogram_best_fit draws from it
    plan = plan_packs(
        lengths[perm],
        max_length,
        strategy=strategy,
        overlong=overlong,  # type: ignore[arg-type]
        max_per_row=max_per_row,
        seed=plan_seed,
        costs=None if costs is None else np.asarray(costs)[perm],
        max_cost=max_cost,
    )
    plan = _renumber(plan, perm)
    num_rows = plan.num_rows
    if num_rows == 0:
        raise ValueError("no rows to train on: the dataset is empty or every sequence was dropped by overlong")
    tokens = plan.row_lengths
    order = rng.permutation(num_rows) if shuffle else np.arange(num_rows)
    per_step = world_size * rows_per_batch
    full, left = divmod(num_rows, per_step)
    counts: dict[str, int] = {}
    if left and remainder == "drop":
        if full == 0:
            raise ValueError(
                f"remainder='drop' leaves nothing: {num_rows} rows fill no step of {world_size} ranks x "
                f"{rows_per_batch} rows; use remainder='empty' or 'repeat'"
            )
        counts = {"dropped_rows": left, "dropped_tokens": int(tokens[order[full * per_step :]].sum())}
        order = order[: full * per_step]
    elif left and remainder == "repeat":
        extra = np.resize(order, per_step - left)  # from the start of the order, cycling if rows are few
        counts = {"repeated_rows": int(extra.size), "repeated_tokens": int(tokens[extra].sum())}
        order = np.concatenate([order, extra])
    # Steps of rows of similar size, so that no rank of a step waits on a fuller one: sort by tokens
    # or cost (stable: rows of equal size, most of a good plan, keep their shuffled order), cut into
    # steps, shuffle the full steps; a partial step (remainder="empty") holds the smallest rows, last.
    size = tokens if a is None else row_costs(plan, a)
    order = order[np.argsort(-size[order], kind="stable")]
    steps = [order[s : s + per_step] for s in range(0, order.size, per_step)]
    num_full = order.size // per_step
    step_order = rng.permutation(num_full) if shuffle else np.arange(num_full)
    steps = [steps[i] for i in step_order] + steps[num_full:]
    if a is None:
        batches = [_deal(rows, tokens, world_size) for rows in steps]
    else:
        batches = _deal_by_cost(steps, size, world_size)
    if remainder == "empty":
        counts["empty_rows"] = sum(step[r] == [EMPTY_ROW] for step in batches for r in range(world_size))
    padded = np.concatenate([tokens, [0]])  # EMPTY_ROW (-1) reads the trailing 0
    per_rank = np.array(
        [sum(int(padded[step[r]].sum()) for step in batches) for r in range(world_size)], dtype=np.int64
    )
    return EpochSchedule(
        plan=plan,
        batches=batches,
        world_size=world_size,
        remainder=remainder,
        tokens_per_rank=per_rank,
        balance=balance,
        cost_a=a,
        **counts,
    )
