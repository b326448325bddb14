"""Packed batches for data-parallel training (PyTorch DDP / torchrun): the same plan on every rank.

Every rank calls :func:`schedule_epoch` with the same lengths, seed and epoch and gets the same
:class:`EpochSchedule` without any communication: the sequences are shuffled, packed into rows of
``max_length`` tokens (:func:`padless.plan_packs`), the rows shuffled, then grouped into steps of
``world_size * rows_per_batch`` rows of similar size (so no rank of a step waits on a much fuller
one), the steps shuffled, and each step's rows dealt to the ranks so their token counts are as even
as possible (longest row first, to the rank with the fewest tokens that has room)::

    step 0    rank 0: rows 7, 2      rank 1: rows 4, 9       (rows_per_batch = 2)
    step 1    rank 0: rows 1, 5      rank 1: rows 0, 8
    step 2    rank 0: row 3          rank 1: (empty row)     remainder="empty"

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
re-planning, so a rank trains on exactly its planned rows::

    sampler = DistributedPackedBatchSampler(lengths, max_length=2048, rows_per_batch=4)
    loader = DataLoader(PackedRowView(dataset), batch_sampler=sampler,
                        collate_fn=PackingCollator.for_model(model, max_length=2048))
    for epoch in range(epochs):
        sampler.set_epoch(epoch)          # a new plan each epoch
        ...

Keys carry the row's content, so DataLoader workers need no shared state with the sampler.
"""

from __future__ import annotations

import heapq
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from padless.layout import IGNORE_INDEX
from padless.plan import OVERLONG_POLICIES, STRATEGIES, PackPlan, plan_packs, validate_lengths

Remainder = Literal["empty", "repeat", "drop"]
REMAINDERS: tuple[str, ...] = get_args(Remainder)

RowKey = tuple[tuple[int, int, int], ...]
"""A planned row: its ``(sequence index, start, length)`` pieces in order; ``()`` is an empty row."""

EMPTY_ROW = -1
"""Row id of an empty row in :attr:`EpochSchedule.batches`."""


def world_info() -> tuple[int, int]:
    """``(rank, world_size)`` of this process: from ``torch.distributed`` when it is initialised,
    else from the ``RANK`` and ``WORLD_SIZE`` variables that ``torchrun`` sets, else ``(0, 1)``."""
    dist = sys.modules.get("torch.distributed")  # never imported here: if absent, nothing is initialised
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    values = {}
    for name in ("RANK", "WORLD_SIZE"):
        raw = os.environ.get(name)
        if raw is None:
            continue
        try:
            values[name] = int(raw)
        except ValueError:
            raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None
    rank, world = values.get("RANK", 0), values.get("WORLD_SIZE", 1)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"environment gives RANK={rank}, WORLD_SIZE={world}; need 0 <= RANK < WORLD_SIZE")
    return rank, world


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


def _renumber(plan: PackPlan, perm: np.ndarray) -> PackPlan:
    """``plan`` made over ``lengths[perm]``, with its sequence indices mapped back to ``lengths``'."""
    return PackPlan(
        max_length=plan.max_length, num_sequences=plan.num_sequences, index=perm[plan.index], start=plan.start,
        length=plan.length, row_offsets=plan.row_offsets, dropped=np.sort(perm[plan.dropped]),
        truncated=np.sort(perm[plan.truncated]), truncated_tokens=plan.truncated_tokens,
        dropped_tokens=plan.dropped_tokens,
    )  # fmt: skip


def _check_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_choices(strategy: str, overlong: str, remainder: str) -> None:
    for value, choices, name in ((strategy, STRATEGIES, "strategy"), (overlong, OVERLONG_POLICIES, "overlong"),
                                 (remainder, REMAINDERS, "remainder")):
        if value not in choices:
            raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")


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
    overlong: str = "error",
    remainder: Remainder = "empty",
    max_per_row: int | None = None,
) -> EpochSchedule:
    """Plan one epoch of packed rows and deal them to ``world_size`` ranks, ``rows_per_batch`` rows per
    rank and step. A pure function of its arguments: every rank computes the same schedule.

    ``shuffle`` shuffles the sequences before planning (so equal-length sequences meet different
    partners each epoch), and the rows and steps after; the random stream is seeded with
    ``(seed, epoch)``, so epochs never share a stream with another seed.
    """
    lengths = validate_lengths(lengths)
    world_size = _check_int(world_size, "world_size", 1)
    rows_per_batch = _check_int(rows_per_batch, "rows_per_batch", 1)
    epoch = _check_int(epoch, "epoch", 0)
    max_length = _check_int(max_length, "max_length", 1)
    _check_choices(strategy, overlong, remainder)
    if overlong == "error" and lengths.size and lengths.max() > max_length:
        # raised here, before the shuffle, so the message names the dataset's own index
        i = int(np.argmax(lengths > max_length))
        raise ValueError(f"sequence {i} has length {int(lengths[i])}, longer than max_length {max_length}; "
                         "choose overlong='truncate', 'split' or 'drop'")
    rng = np.random.default_rng((_check_int(seed, "seed", 0), epoch))
    perm = rng.permutation(lengths.size) if shuffle else np.arange(lengths.size)
    plan_seed = int(rng.integers(2**31))  # only histogram_best_fit draws from it
    plan = plan_packs(lengths[perm], max_length, strategy=strategy, overlong=overlong,  # type: ignore[arg-type]
                      max_per_row=max_per_row, seed=plan_seed)
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
            raise ValueError(f"remainder='drop' leaves nothing: {num_rows} rows fill no step of {world_size} ranks x "
                             f"{rows_per_batch} rows; use remainder='empty' or 'repeat'")
        counts = {"dropped_rows": left, "dropped_tokens": int(tokens[order[full * per_step :]].sum())}
        order = order[: full * per_step]
    elif left and remainder == "repeat":
        extra = np.resize(order, per_step - left)  # from the start of the order, cycling if rows are few
        counts = {"repeated_rows": int(extra.size), "repeated_tokens": int(tokens[extra].sum())}
        order = np.concatenate([order, extra])
    # Steps of rows of similar size, so that no rank of a step waits on a fuller one: sort by tokens
    # (stable: rows of equal size, most of a good plan, keep their shuffled order), cut into steps,
    # shuffle the full steps; a partial step (remainder="empty") holds the smallest rows and comes last.
    order = order[np.argsort(-tokens[order], kind="stable")]
    steps = [order[s : s + per_step] for s in range(0, order.size, per_step)]
    num_full = order.size // per_step
    step_order = rng.permutation(num_full) if shuffle else np.arange(num_full)
    steps = [steps[i] for i in step_order] + steps[num_full:]
    batches = [_deal(rows, tokens, world_size) for rows in steps]
    if remainder == "empty":
        counts["empty_rows"] = sum(step[r] == [EMPTY_ROW] for step in batches for r in range(world_size))
    padded = np.concatenate([tokens, [0]])  # EMPTY_ROW (-1) reads the trailing 0
    per_rank = np.array([sum(int(padded[step[r]].sum()) for step in batches) for r in range(world_size)],
                        dtype=np.int64)
    return EpochSchedule(plan=plan, batches=batches, world_size=world_size, remainder=remainder,
                         tokens_per_rank=per_rank, **counts)


@dataclass(eq=False)
class DistributedPackedBatchSampler:
    """A batch sampler of packed rows for one rank of a data-parallel job (see the module docstring).

    Iterating yields one list of row keys per micro-batch: at most ``rows_per_batch`` keys (fewer only
    in the last step with ``remainder="empty"``). Use it as ``DataLoader(PackedRowView(dataset),
    batch_sampler=sampler, collate_fn=PackingCollator(...))`` and call :meth:`set_epoch` every epoch.
    ``len(sampler)`` is the number of micro-batches of the current epoch, the same on every rank.
    """

    lengths: Sequence[int] | np.ndarray
    """Token length of every sequence of the dataset (the same on every rank)."""
    max_length: int
    """Tokens per packed row."""
    rows_per_batch: int
    """Packed rows per micro-batch on each rank."""
    num_replicas: int | None = None
    """World size; ``None``: discovered by :func:`world_info` (torch.distributed, else torchrun's env)."""
    rank: int | None = None
    """This process' rank; ``None``: discovered by :func:`world_info`."""
    seed: int = 0
    """Seed of the shuffles, combined with the epoch; must be the same on every rank."""
    shuffle: bool = True
    """Shuffle sequences before planning, rows and steps after; off: steps follow the plan's row order
    (sorted by size, ties in plan order)."""
    strategy: str = "best_fit_decreasing"
    """Planner strategy (:data:`padless.STRATEGIES`)."""
    overlong: str = "error"
    """Policy for a sequence longer than ``max_length`` (:data:`padless.OVERLONG_POLICIES`)."""
    remainder: Remainder = "empty"
    """What happens to the rows that do not fill a last step (:data:`REMAINDERS`)."""
    max_per_row: int | None = None
    """Cap on documents per row, passed to the planner."""
    epoch: int = 0
    """Current epoch (:meth:`set_epoch`)."""
    _cache: tuple[int, EpochSchedule] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.lengths = validate_lengths(self.lengths)
        _check_int(self.max_length, "max_length", 1)
        _check_int(self.rows_per_batch, "rows_per_batch", 1)
        _check_int(self.seed, "seed", 0)
        _check_choices(self.strategy, self.overlong, self.remainder)
        if self.num_replicas is None or self.rank is None:
            rank, world = world_info()
            self.num_replicas = world if self.num_replicas is None else self.num_replicas
            self.rank = rank if self.rank is None else self.rank
        _check_int(self.num_replicas, "num_replicas", 1)
        if not isinstance(self.rank, (int, np.integer)) or not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas={self.num_replicas}), got {self.rank!r}")

    def set_epoch(self, epoch: int) -> None:
        """Re-plan for ``epoch`` (the next iteration uses it); call with the same epoch on every rank."""
        self.epoch = _check_int(epoch, "epoch", 0)

    def schedule(self) -> EpochSchedule:
        """The current epoch's schedule (computed once per epoch)."""
        if self._cache is None or self._cache[0] != self.epoch:
            assert self.num_replicas is not None  # set in __post_init__
            sched = schedule_epoch(
                self.lengths, self.max_length, world_size=self.num_replicas, rows_per_batch=self.rows_per_batch,
                epoch=self.epoch, seed=self.seed, shuffle=self.shuffle, strategy=self.strategy,
                overlong=self.overlong, remainder=self.remainder, max_per_row=self.max_per_row,
            )  # fmt: skip
            self._cache = (self.epoch, sched)
        return self._cache[1]

    def __iter__(self) -> Iterator[list[RowKey]]:
        sched = self.schedule()
        for step in sched.batches:
            yield [sched.row_key(r) for r in step[self.rank]]  # type: ignore[index]

    def __len__(self) -> int:
        return self.schedule().num_steps


class PackedRowView:
    """A map-style dataset of sequences seen as packed rows: item ``key`` (a :data:`RowKey`) is the
    pre-packed row ``{"input_ids", "labels", "seq_lengths"}`` (int64 numpy) made of those pieces.

    ``dataset[i]`` must give a mapping with ``input_ids`` and optionally ``labels`` (every token is
    trained without them), e.g. a list of dicts, :meth:`padless.TokenizedCorpus.features` or a
    ``datasets.Dataset``. The empty row ``()`` is one ``pad_token_id`` token with no trained label.
    """

    def __init__(self, dataset: Sequence[Mapping[str, Any]] | Any, *, pad_token_id: int = 0) -> None:
        self.dataset = dataset
        self.pad_token_id = pad_token_id

    def __len__(self) -> int:
        """Sequences in the underlying dataset."""
        return len(self.dataset)

    def __getitem__(self, key: RowKey) -> dict[str, np.ndarray]:
        if not isinstance(key, tuple):
            raise ValueError(f"a packed row is read by a row key (a tuple of (sequence, start, length)), got {key!r}")
        if not key:
            return {"input_ids": np.array([self.pad_token_id], dtype=np.int64),
                    "labels": np.array([IGNORE_INDEX], dtype=np.int64), "seq_lengths": np.array([1], dtype=np.int64)}
        ids, labels = [], []
        for index, start, length in key:
            feature = self.dataset[int(index)]
            seq = np.asarray(feature["input_ids"], dtype=np.int64)
            lab = feature.get("labels")
            lab = seq if lab is None else np.asarray(lab, dtype=np.int64)
            piece, piece_labels = seq[start : start + length], lab[start : start + length]
            if piece.size != length or piece_labels.size != length:
                raise ValueError(
                    f"sequence {index} has {seq.size} tokens and {lab.size} labels, too few for the planned "
                    f"piece [{start}, {start + length}); were the lengths given to the sampler this dataset's?"
                )
            ids.append(piece)
            labels.append(piece_labels)
        return {"input_ids": np.concatenate(ids), "labels": np.concatenate(labels),
                "seq_lengths": np.array([n for _, _, n in key], dtype=np.int64)}
