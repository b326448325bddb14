"""Batch samplers: which examples (or packed rows) each micro-batch gets.

- :class:`LengthGroupedBatchSampler`: bucketing. Batches of similar lengths (so pad-to-longest wastes
  little), by example count or by a token budget, shuffled and reproducible from a seed and epoch.
- :class:`DistributedPackedBatchSampler`: packed rows for one rank of a data-parallel job, from the
  epoch schedule every rank computes alike (:func:`padless.planning.schedule.schedule_epoch`)::

    sampler = DistributedPackedBatchSampler(lengths, max_length=2048, rows_per_batch=4)
    loader = DataLoader(PackedRowView(dataset), batch_sampler=sampler,
                        collate_fn=PackingCollator.for_model(model, max_length=2048))
    for epoch in range(epochs):
        sampler.set_epoch(epoch)          # a new plan each epoch
        ...

  ``balance="cost", cost_a=model.config`` deals each step's rows so that rank costs (``a * l + l**2``
  per document, :mod:`padless.planning.balance`), not token counts, are even.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from padless.planning.balance import Balance, check_balance
from padless.planning.checks import OVERLONG_DEFAULT, check_int
from padless.planning.lengths import group_by_length
from padless.planning.plan import validate_lengths
from padless.planning.schedule import EpochSchedule, Remainder, RowKey, check_choices, schedule_epoch


@dataclass
class LengthGroupedBatchSampler:
    """Yields lists of indices whose lengths are close, in a shuffled order.

    The indices are shuffled, cut into mega-batches of ``batch_size * mega_batch_mult`` examples,
    sorted by length inside each mega-batch and cut into batches; the batch order is shuffled again.
    With ``max_tokens``, a batch grows while ``len(batch) * longest <= max_tokens`` (its padded size).
    """

    lengths: Sequence[int] | np.ndarray
    """Token length of every example of the dataset."""
    batch_size: int | None = None
    """Examples per batch (give this or ``max_tokens``)."""
    max_tokens: int | None = None
    """Padded tokens per batch (batch size x longest member) instead of a fixed count."""
    mega_batch_mult: int = 50
    """How many batches' worth of examples are sorted together; larger = less padding, less randomness."""
    seed: int = 0
    """Seed of the shuffles; the epoch is added to it (:meth:`set_epoch`)."""
    shuffle: bool = True
    """Shuffle examples and batch order; without it batches follow sorted order within mega-batches."""
    drop_last: bool = False
    """Drop a last batch smaller than ``batch_size``."""
    epoch: int = 0

    def __post_init__(self) -> None:
        self.lengths = np.asarray(self.lengths, dtype=np.int64)
        if (self.batch_size is None) == (self.max_tokens is None):
            raise ValueError("give exactly one of batch_size and max_tokens")
        if self.batch_size is not None:
            check_int(self.batch_size, "batch_size")
        if self.max_tokens is not None:
            check_int(self.max_tokens, "max_tokens")
        check_int(self.mega_batch_mult, "mega_batch_mult")
        if self.max_tokens is not None and self.lengths.size and self.max_tokens < self.lengths.max():
            i = int(np.argmax(self.lengths))
            raise ValueError(
                f"max_tokens={self.max_tokens} is smaller than example {i} ({int(self.lengths[i])} tokens)"
            )

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self) -> list[list[int]]:
        rng = np.random.default_rng(self.seed + self.epoch)
        n = self.lengths.size
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        per_mega = (
            self.batch_size or max(1, int(self.max_tokens // max(1, np.median(self.lengths))))
        ) * self.mega_batch_mult
        grouped = group_by_length(self.lengths, order, per_mega)
        out: list[list[int]] = []
        for s in range(0, n, per_mega):  # a batch never spans two mega-batches
            out.extend(self._cut(grouped[s : s + per_mega]))
        if self.drop_last and self.batch_size and out and len(out[-1]) < self.batch_size:
            out.pop()
        if self.shuffle:
            out = [out[i] for i in rng.permutation(len(out))]
        return out

    def _cut(self, sorted_idx: np.ndarray) -> list[list[int]]:
        if self.batch_size is not None:
            return [sorted_idx[i : i + self.batch_size].tolist() for i in range(0, sorted_idx.size, self.batch_size)]
        batches: list[list[int]] = []
        current: list[int] = []
        longest = 0
        for i in sorted_idx.tolist():
            grown = max(longest, int(self.lengths[i]))
            if current and grown * (len(current) + 1) > self.max_tokens:
                batches.append(current)
                current, grown = [], int(self.lengths[i])
            current.append(i)
            longest = grown
        if current:
            batches.append(current)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches())

    def __len__(self) -> int:
        return len(self.batches())


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


@dataclass(eq=False)
class DistributedPackedBatchSampler:
    """A batch sampler of packed rows for one rank of a data-parallel job (see the module docstring).

    Iterating yields one list of row keys per micro-batch: at most ``rows_per_batch`` keys (fewer only
    in the last step with ``remainder="empty"``). Use it as ``DataLoader(PackedRowView(dataset),
    batch_sampler=sampler, collate_fn=PackingCollator.for_model(model, ...))`` and call :meth:`set_epoch` every epoch.
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
    """Planner strategy (:data:`padless.planning.plan.STRATEGIES`)."""
    overlong: str = OVERLONG_DEFAULT
    """Policy for a sequence longer than ``max_length`` (:data:`padless.planning.plan.OVERLONG_POLICIES`)."""
    remainder: Remainder = "empty"
    """What happens to the rows that do not fill a last step (:data:`REMAINDERS`)."""
    max_per_row: int | None = None
    """Cap on documents per row, passed to the planner."""
    epoch: int = 0
    """Current epoch (:meth:`set_epoch`)."""
    balance: Balance = "tokens"
    """What each step's deal to ranks evens out: row tokens, or row cost (``"cost"``, with ``cost_a``);
    :data:`padless.planning.balance.BALANCES`."""
    cost_a: Any = None
    """``a`` of the row cost ``a * l + l**2`` (``balance="cost"`` only): a number, or the model's config
    (``12 * hidden_size``), read once and kept as the number."""
    costs: Sequence[int] | np.ndarray | None = None
    """A second cost per sequence (its vision-encoder patches: :func:`padless.batching.vision.image_patches`),
    bounded per row by ``max_cost`` (:func:`padless.plan_packs`); None: tokens only."""
    max_cost: int | None = None
    """The most ``costs`` a row may hold (with ``costs``)."""
    _cache: tuple[int, EpochSchedule] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.lengths = validate_lengths(self.lengths)
        check_int(self.max_length, "max_length", 1)
        check_int(self.rows_per_batch, "rows_per_batch", 1)
        check_int(self.seed, "seed", 0)
        check_choices(self.strategy, self.overlong, self.remainder)
        self.cost_a = check_balance(self.balance, self.cost_a)
        if self.num_replicas is None or self.rank is None:
            rank, world = world_info()
            self.num_replicas = world if self.num_replicas is None else self.num_replicas
            self.rank = rank if self.rank is None else self.rank
        check_int(self.num_replicas, "num_replicas", 1)
        if not isinstance(self.rank, (int, np.integer)) or not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas={self.num_replicas}), got {self.rank!r}")

    def set_epoch(self, epoch: int) -> None:
        """Re-plan for ``epoch`` (the next iteration uses it); call with the same epoch on every rank."""
        self.epoch = check_int(epoch, "epoch", 0)

    def schedule(self) -> EpochSchedule:
        """The current epoch's schedule (computed once per epoch)."""
        if self._cache is None or self._cache[0] != self.epoch:
            assert self.num_replicas is not None  # set in __post_init__
            sched = schedule_epoch(
                self.lengths,
                self.max_length,
                world_size=self.num_replicas,
                rows_per_batch=self.rows_per_batch,
                epoch=self.epoch,
                seed=self.seed,
                shuffle=self.shuffle,
                strategy=self.strategy,
                overlong=self.overlong,
                remainder=self.remainder,
                max_per_row=self.max_per_row,
                balance=self.balance,
                cost_a=self.cost_a,
                costs=self.costs,
                max_cost=self.max_cost,
            )
            self._cache = (self.epoch, sched)
        return self._cache[1]

    def __iter__(self) -> Iterator[list[RowKey]]:
        sched = self.schedule()
        for step in sched.batches:
            yield [sched.row_key(r) for r in step[self.rank]]  # type: ignore[index]

    def __len__(self) -> int:
        return self.schedule().num_steps
