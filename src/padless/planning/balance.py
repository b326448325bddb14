"""Balancing data-parallel work by cost: which rank (and micro-batch) gets which packed row or rollout group.

Every rank of a data-parallel step waits for the slowest one, and equal token counts are not equal
time when attention is quadratic in the document. The cost of a packed row, whose attention is
block-diagonal (each document attends only to itself), is::

    cost(row) = sum over its documents of (a * l + l**2)        l: the document's tokens

``a * l`` is the work linear in tokens (projections, MLP), ``l**2`` the attention's, and ``a`` their
ratio per token (:func:`cost_a_from_config`: ``a = 12 * hidden_size``). With ``hidden_size`` 2048
(``a`` = 24,576), a row of one 4,096-token document costs 1.16x a row of 64 documents of 64 tokens;
with ``hidden_size`` 768, 1.43x. Both rows hold 4,096 tokens, so dealing rows by tokens cannot see it.

``balance`` names what is balanced (:data:`BALANCES`): ``"tokens"`` (token counts) or ``"cost"``
(the cost above). The balancer is Karmarkar-Karp's largest differencing method (:func:`partition`):
every item starts as a state of ``num_parts`` partition sums; the two states of largest spread (max
minus min sum) are merged, the smallest sum of one paired with the largest of the other, until one
state is left. Pairing opposite ends never widens the spread: for ``x`` ascending and ``y``
descending, ``(x_i + y_i) - (x_j + y_j)`` lies between ``-(spread x)`` and ``spread y``. So, by
induction over the merges, the final ``max - min`` is at most the largest initial spread:

* ``equal_size=True`` (every part gets ``floor`` or ``ceil`` of ``n / num_parts`` items; this is how
  packed rows are dealt, at most ``rows_per_batch`` to a rank): the initial states are the blocks of
  ``num_parts`` consecutive items in descending cost, so ``max - min <= max over blocks of
  (largest - smallest cost in the block)``, which is at most the largest cost. Rows of a step have
  consecutive costs (the schedule sorts them), so that gap is small. Against the optimum the
  balanced method's ratio grows with the items per part (4/3 with 3, 19/12 with 4: Michiels et al.,
  "Performance ratios for the differencing method applied to the balanced number partitioning problem").
* ``equal_size=False`` (counts free; rollout groups): single items, so ``max - min <= largest
  cost``; and the largest part is within ``4/3 - 1/(3 * num_parts)`` of the optimal one (Michiels,
  Korst, Aarts, van Leeuwen, "Performance ratios of the Karmarkar-Karp differencing method",
  J. Comb. Optim. 13, 2007), the bound Graham proved for longest-processing-time-first. With
  positive costs and at least ``num_parts`` items no part is empty (a merge keeps
  ``min(num_parts, nonzero_a + nonzero_b)`` nonzero sums).

Two implementations of the same method: :func:`partition` (one problem; a heap, as Karmarkar and Karp
wrote it) and :func:`partition_many` (many equal-sized problems at once, vectorised with numpy over
the problems: every step of an epoch schedule). They break ties the same way and return the same
parts; ``tests/planning/test_balance.py`` holds them equal. Timings: ``benchmarks/balance.py``.

:func:`balance_costs` lays the parts out as ``ranks x micro_batches`` (:class:`Assignment`);
:func:`balance_groups` prices rollout groups (a prompt and its completions, the prompt shared or not)
and balances them, a group never split. Pure numpy, like the rest of :mod:`padless.planning`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from padless.planning.checks import check_choice, check_int
from padless.planning.plan import PackPlan, validate_lengths

Balance = Literal["tokens", "cost"]
BALANCES: tuple[str, ...] = get_args(Balance)
"""What a deal of work to ranks balances: ``"tokens"`` (token counts) or ``"cost"`` (``a * l + l**2``
per document)."""

LINEAR_PER_WIDTH = 12
"""``a = LINEAR_PER_WIDTH * hidden_size``: the linear work per token in units of the attention's
``l**2``. Per layer and token a transformer block's weights cost ``2 * 12 * d**2`` FLOPs (4 ``d x d``
attention projections and an MLP of ``8 d**2`` weights: 2 matrices ``d x 4d``, or a gated MLP's 3
of ``d x 8d/3``); causal attention over a document of ``l`` tokens costs ``4 * d`` FLOPs per
query-key pair (scores and weighted values) over ``l**2 / 2`` pairs, ``2 * d * l**2``. Their ratio per
token is ``24 d**2 / 2 d = 12 d``. The count of layers cancels; so does the backward pass, which costs
twice the forward for both terms when every weight is trained. Left out: the LM head (linear in the
tokens it computes, and which tokens those are depends on the labels, not on lengths) and the
kernels' unequal speed on matmuls and attention; pass ``cost_a`` as a number to count either."""


def cost_a_from_config(config: Any) -> float:
    """``a`` for a model: ``12 * hidden_size`` (:data:`LINEAR_PER_WIDTH`), read from a transformers-style
    config (``hidden_size``, or GPT-2's ``n_embd``, or ``d_model``; a multimodal config's text config)."""
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    for name in ("hidden_size", "n_embd", "d_model"):
        width = getattr(text, name, None)
        if isinstance(width, (int, np.integer)) and not isinstance(width, bool) and width >= 1:
            return float(LINEAR_PER_WIDTH * int(width))
    raise ValueError(
        f"cost_a: {type(config).__name__} has no hidden_size, n_embd or d_model; pass cost_a as a "
        "number (the linear work per token relative to the l**2 attention term, e.g. 12 * width)"
    )


def resolve_cost_a(cost_a: Any) -> float:
    """``cost_a`` as a float: a finite number ``>= 0`` as it is, or a model config through
    :func:`cost_a_from_config`; anything else is a ``ValueError`` naming ``cost_a``."""
    if isinstance(cost_a, bool) or cost_a is None:
        raise ValueError(f"cost_a must be a number >= 0 or a model config, got {cost_a!r}")
    if isinstance(cost_a, (int, float, np.integer, np.floating)):
        if not math.isfinite(cost_a) or cost_a < 0:
            raise ValueError(f"cost_a must be a finite number >= 0, got {cost_a!r}")
        return float(cost_a)
    return cost_a_from_config(cost_a)


def check_balance(balance: object, cost_a: Any) -> float | None:
    """Refuse an unknown ``balance``, ``balance="cost"`` without ``cost_a`` and ``cost_a`` without
    ``balance="cost"`` (it would be ignored); return ``a`` for ``"cost"``, ``None`` for ``"tokens"``."""
    check_choice(balance, BALANCES, "balance")
    if balance == "tokens":
        if cost_a is not None:
            raise ValueError("cost_a is used only with balance='cost'; pass balance='cost' or leave cost_a out")
        return None
    if cost_a is None:
        raise ValueError(
            "balance='cost' needs cost_a: the model's config, or a number such as 12 * hidden_size "
            "(padless.planning.balance.LINEAR_PER_WIDTH)"
        )
    return resolve_cost_a(cost_a)


def document_costs(lengths: np.ndarray, cost_a: float) -> np.ndarray:
    """float64 ``[n]``: ``a * l + l**2`` of each document (a causal document of ``l`` tokens alone)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    return lengths * (cost_a + lengths)


def row_costs(plan: PackPlan, cost_a: Any) -> np.ndarray:
    """float64 ``[num_rows]``: ``sum over the row's documents of (a * l + l**2)``, ``cost_a`` a number or
    a model config (:func:`resolve_cost_a`). Each planned piece is a document of its own (a split
    sequence's pieces attend only within themselves)::

        lengths [5, 3, 6, 2], max_length 8, a = 2:   row 0: 6 + 2 -> (12 + 36) + (4 + 4) = 56
                                                      row 1: 5 + 3 -> (10 + 25) + (6 + 9) = 50
    """
    per_piece = document_costs(plan.length, resolve_cost_a(cost_a))
    if plan.num_rows == 0:
        return np.zeros(0)
    return np.add.reduceat(per_piece, plan.row_offsets[:-1])  # every row holds >= 1 piece


def _groups(prompt_lengths: Any, completion_lengths: Any) -> tuple[np.ndarray, list[np.ndarray]]:
    prompts = validate_lengths(prompt_lengths)
    if len(completion_lengths) != prompts.size:
        raise ValueError(
            f"completion_lengths has {len(completion_lengths)} groups, prompt_lengths {prompts.size}; "
            "give one list of completion lengths per prompt"
        )
    comps = []
    for g, c in enumerate(completion_lengths):
        try:
            arr = validate_lengths(c)
        except ValueError as err:
            raise ValueError(f"completion_lengths[{g}]: {err}") from None
        if arr.size == 0:
            raise ValueError(f"completion_lengths[{g}] is empty; every group needs at least one completion")
        comps.append(arr)
    return prompts, comps


def group_loads(
    prompt_lengths: Sequence[int] | np.ndarray,
    completion_lengths: Sequence[Sequence[int] | np.ndarray],
    *,
    share_prompt: bool,
    cost_a: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, costs)``, int64 and float64 ``[groups]``, of rollout groups (a prompt of ``p`` tokens,
    completions of ``c_j``); ``costs`` is all zeros when ``cost_a`` is ``None``.

    * ``share_prompt=False``: each completion is its own document of ``p + c_j`` tokens.
      tokens ``sum_j (p + c_j)``; cost ``sum_j (a (p + c_j) + (p + c_j)**2)``.
    * ``share_prompt=True`` (:func:`padless.batching.preference.share_prompt`: the prompt once, each
      completion attending to it and itself): tokens ``p + sum_j c_j``; cost
      ``a (p + sum_j c_j) + p**2 + sum_j (2 p c_j + c_j**2)``.
      In the ``l**2`` units of a causal document (twice its ``l**2 / 2`` query-key pairs) the prompt
      has ``p**2 / 2`` pairs and completion ``j`` has ``p c_j + c_j**2 / 2``; one completion gives
      ``(p + c)**2``, the cost of the unshared document.
    """
    prompts, comps = _groups(prompt_lengths, completion_lengths)
    a = None if cost_a is None else resolve_cost_a(cost_a)
    tokens = np.zeros(prompts.size, dtype=np.int64)
    costs = np.zeros(prompts.size)
    for g, (p, c) in enumerate(zip(prompts.tolist(), comps)):
        if share_prompt:
            tokens[g] = p + int(c.sum())
            if a is not None:
                cf = c.astype(np.float64)
                costs[g] = a * tokens[g] + float(p) ** 2 + float((2.0 * p * cf + cf**2).sum())
        else:
            tokens[g] = int((p + c).sum())
            if a is not None:
                costs[g] = float(document_costs(p + c, a).sum())
    return tokens, costs


# ----------------------------------------------------------------------------- Karmarkar-Karp


def _check_costs(costs: Any, ndim: int) -> np.ndarray:
    arr = np.asarray(costs, dtype=np.float64)
    if arr.ndim != ndim:
        raise ValueError(f"costs must be {ndim}-dimensional, got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr.ravel()) | ~(arr.ravel() > 0))
    if bad.size:
        raise ValueError(f"costs must be finite and > 0: flat entry {bad[0]} is {float(arr.ravel()[bad[0]])!r}")
    return arr


def _rank_parts(sums: np.ndarray) -> np.ndarray:
    """Part number of each final partition: by descending sum, ties in position order."""
    out = np.empty(sums.shape, dtype=np.int64)
    np.put_along_axis(out, np.argsort(-sums, axis=-1, kind="stable"), np.arange(sums.shape[-1]), axis=-1)
    return out


def partition(costs: Sequence[float] | np.ndarray, num_parts: int, *, equal_size: bool = False) -> np.ndarray:
    """int64 ``[n]``: the part (``0 .. num_parts - 1``) of each item, by largest differencing (see the module
    docstring for the method and its bound). Parts are numbered by descending cost; every item is in
    exactly one part. ``equal_size``: every part gets ``floor`` or ``ceil`` of ``n / num_parts`` items.

    Deterministic: items are taken in descending cost (ties: lower index first), states of equal
    spread are merged oldest first, partitions of equal sum keep their positions (stable sorts).
    ``n / num_parts`` (``equal_size``) or ``n`` merges, each a few numpy operations on ``num_parts``
    sums. Members are tracked as a forest: a partition is a node, -1 while empty; joining two nonempty
    ones makes a new node, their parent (at most ``n - 1`` joins), so a merge never copies members."""
    arr = _check_costs(costs, 1)
    k = check_int(num_parts, "num_parts", 1)
    n = arr.size
    order = np.argsort(-arr, kind="stable")  # leaf node i: item order[i]
    ordered = arr[order]
    heap: list[tuple[float, int, np.ndarray, np.ndarray]] = []
    if equal_size:
        m = -(-n // k)
        sums_all = np.zeros(m * k)  # zero-cost fillers at the end, one per empty slot
        sums_all[:n] = ordered
        leaves = np.where(np.arange(m * k) < n, np.arange(m * k), -1)
        for j in range(m):
            sums = sums_all[j * k : (j + 1) * k].copy()
            heap.append((-(sums.max() - sums.min()), j, sums, leaves[j * k : (j + 1) * k].copy()))
    else:
        for j in range(n):
            sums, nodes = np.zeros(k), np.full(k, -1)
            sums[0], nodes[0] = ordered[j], j
            heap.append((-(sums.max() - sums.min()), j, sums, nodes))
    heapq.heapify(heap)
    parent = np.full(max(2 * n - 1, 0), -1, dtype=np.int64)  # -1: a root
    next_node, birth = n, len(heap)
    while len(heap) > 1:
        _, _, sa, na = heapq.heappop(heap)
        _, _, sb, nb = heapq.heappop(heap)
        up, down = np.argsort(sa, kind="stable"), np.argsort(-sb, kind="stable")
        sums, x, y = sa[up] + sb[down], na[up], nb[down]
        nodes = np.where(x >= 0, x, y)
        both = np.flatnonzero((x >= 0) & (y >= 0))
        if both.size:
            ids = np.arange(next_node, next_node + both.size)
            parent[x[both]], parent[y[both]], nodes[both] = ids, ids, ids
            next_node += both.size
        heapq.heappush(heap, (-(sums.max() - sums.min()), birth, sums, nodes))
        birth += 1
    out = np.empty(n, dtype=np.int64)
    if n:
        _, _, sums, nodes = heap[0]
        root = np.where(parent >= 0, parent, np.arange(parent.size))
        while True:  # pointer jumping: every node's entry becomes its root
            jumped = root[root]
            if np.array_equal(jumped, root):
                break
            root = jumped
        part_of_root = np.full(parent.size, -1, dtype=np.int64)
        kept = nodes >= 0
        part_of_root[nodes[kept]] = _rank_parts(sums)[kept]
        out[order] = part_of_root[root[:n]]
    return out


def partition_many(costs: np.ndarray, num_parts: int) -> np.ndarray:
    """int64 ``[S, n]``: :func:`partition` with ``equal_size=True`` of each row of ``costs`` (float ``[S, n]``,
    ``S`` independent problems of the same size), vectorised over the problems: the same parts,
    ``n / num_parts - 1`` merges for all problems at once.

    The partitions are tracked as a forest: each merge makes ``num_parts`` new nodes, parents of the
    merged partitions; an item's part is the root above its leaf, found by pointer jumping."""
    arr = _check_costs(costs, 2)
    k = check_int(num_parts, "num_parts", 1)
    s, n = arr.shape
    m = max(1, -(-n // k))  # states per problem
    size = m * k  # items with the zero-cost fillers
    order = np.argsort(-arr, axis=1, kind="stable")
    sums = np.zeros((s, size))
    sums[:, :n] = np.take_along_axis(arr, order, 1)
    sums = sums.reshape(s, m, k)  # sums[p, j, q]: problem p, state j, partition q
    spread = sums.max(2) - sums.min(2)
    birth = np.broadcast_to(np.arange(m), (s, m)).copy()
    alive = np.ones((s, m), dtype=bool)
    nodes = np.broadcast_to(np.arange(size).reshape(m, k), (s, m, k)).copy()  # leaf j*k + q: sorted item j*k + q
    parent = np.broadcast_to(np.arange(size + (m - 1) * k), (s, size + (m - 1) * k)).copy()
    rows = np.arange(s)
    final = np.zeros(s, dtype=np.int64)  # the slot of the last state

    def pick() -> np.ndarray:
        """Per problem, the live state of largest spread (ties: the oldest), as the heap pops it."""
        best = np.where(alive, spread, -np.inf).max(1, keepdims=True)
        return np.argmin(np.where(alive & (spread == best), birth, np.iinfo(np.int64).max), 1)

    for t in range(m - 1):
        a = pick()
        alive[rows, a] = False
        b = pick()
        alive[rows, b] = False
        sa, sb = sums[rows, a], sums[rows, b]  # [s, k]
        up, down = np.argsort(sa, axis=1, kind="stable"), np.argsort(-sb, axis=1, kind="stable")
        merged = np.take_along_axis(sa, up, 1) + np.take_along_axis(sb, down, 1)
        ids = size + t * k + np.arange(k)
        parent[rows[:, None], np.take_along_axis(nodes[rows, a], up, 1)] = ids
        parent[rows[:, None], np.take_along_axis(nodes[rows, b], down, 1)] = ids
        sums[rows, a], nodes[rows, a], birth[rows, a] = merged, ids, m + t  # the merged state takes slot a
        spread[rows, a] = merged.max(1) - merged.min(1)
        alive[rows, a] = True
        final = a
    while True:  # pointer jumping: parent becomes the root in O(log depth) passes
        jumped = np.take_along_axis(parent, parent, 1)
        if np.array_equal(jumped, parent):
            break
        parent = jumped
    position = parent[:, :size] - (size + (m - 2) * k if m > 1 else 0)  # each sorted item's final partition
    if m == 1:
        position = position % k
    part_sorted = np.take_along_axis(_rank_parts(sums[rows, final]), position, 1)
    out = np.empty((s, n), dtype=np.int64)
    np.put_along_axis(out, order, part_sorted[:, :n], 1)
    return out


# ----------------------------------------------------------------------------- ranks x micro-batches


@dataclass(frozen=True)
class Assignment:
    """Which rank and micro-batch trains each item; the same on every rank (a pure function of the costs).

    ``part[i] = rank * micro_batches + micro`` for item ``i``: every item in exactly one part, every
    rank ``micro_batches`` parts, none empty."""

    part: np.ndarray
    """int64 ``[items]``: the flat part of each item."""
    ranks: int
    """Data-parallel ranks."""
    micro_batches: int
    """Micro-batches per rank (the same on every rank)."""
    loads: np.ndarray
    """float64 ``[ranks, micro_batches]``: the balanced measure (tokens or cost) of each part."""

    def items(self, rank: int, micro: int) -> np.ndarray:
        """Indices of the items of ``rank``'s micro-batch ``micro``, ascending."""
        if not (0 <= rank < self.ranks and 0 <= micro < self.micro_batches):
            raise ValueError(
                f"(rank, micro)=({rank}, {micro}) out of range for parts=({self.ranks}, {self.micro_batches})"
            )
        return np.flatnonzero(self.part == rank * self.micro_batches + micro)

    def batches(self) -> list[list[np.ndarray]]:
        """``batches()[rank][micro]``: :meth:`items` of every part."""
        return [[self.items(r, m) for m in range(self.micro_batches)] for r in range(self.ranks)]

    def loads_of(self, values: Sequence[float] | np.ndarray) -> np.ndarray:
        """float64 ``[ranks, micro_batches]``: the sum of ``values`` (one per item) over each part."""
        values = np.asarray(values, dtype=np.float64)
        if values.shape != self.part.shape:
            raise ValueError(f"values must have one entry per item ({self.part.size}), got shape {values.shape}")
        total = np.bincount(self.part, weights=values, minlength=self.ranks * self.micro_batches)
        return total.reshape(self.ranks, self.micro_batches)

    @property
    def max_over_mean(self) -> float:
        """Largest part over the mean part (1.0: perfectly balanced)."""
        return float(self.loads.max() / self.loads.mean())


def _check_parts(parts: object) -> tuple[int, int]:
    if (
        not isinstance(parts, tuple)
        or len(parts) != 2
        or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 1 for x in parts)
    ):
        raise ValueError(f"parts must be (ranks, micro_batches), two integers >= 1 such as (8, 4), got {parts!r}")
    return int(parts[0]), int(parts[1])


def balance_costs(
    costs: Sequence[float] | np.ndarray, parts: tuple[int, int], *, equal_size: bool = False
) -> Assignment:
    """Deal items of ``costs`` (float ``[n]``, each ``> 0``) to ``parts = (ranks, micro_batches)``.

    The items are split into ``ranks * micro_batches`` parts by :func:`partition`, so every part, and
    with it every micro-batch and every rank's total, is close to the mean. The parts, by descending
    cost, fill micro-batch 0 of every rank, then micro-batch 1, ...: a micro-batch's parts are of
    similar cost on all ranks (each micro-batch's collective waits little). Within a micro-batch the
    heaviest part goes to the rank with the least cost so far (ties: the lower rank), so rank totals
    stay even too. ``equal_size``: every part gets ``floor`` or ``ceil`` of ``n / parts`` items."""
    ranks, micro = _check_parts(parts)
    arr = _check_costs(costs, 1)
    if arr.size < ranks * micro:
        raise ValueError(
            f"parts={parts} needs at least {ranks * micro} items, got {arr.size}; lower ranks or micro_batches"
        )
    flat = partition(arr, ranks * micro, equal_size=equal_size)  # part number = rank by descending cost
    sums = np.bincount(flat, weights=arr, minlength=ranks * micro)
    slot = np.empty(ranks * micro, dtype=np.int64)  # part number -> rank * micro + micro-batch
    totals = np.zeros(ranks)
    for mb in range(micro):
        block = np.arange(mb * ranks, (mb + 1) * ranks)  # the parts of micro-batch mb, heaviest first
        to_rank = np.argsort(totals, kind="stable")  # the lightest rank so far takes the heaviest part
        slot[block] = to_rank * micro + mb
        totals[to_rank] += sums[block]
    part = slot[flat]
    loads = np.zeros(ranks * micro)
    loads[slot] = sums
    return Assignment(part=part, ranks=ranks, micro_batches=micro, loads=loads.reshape(ranks, micro))


def balance_groups(
    prompt_lengths: Sequence[int] | np.ndarray,
    completion_lengths: Sequence[Sequence[int] | np.ndarray],
    parts: tuple[int, int],
    *,
    share_prompt: bool,
    balance: Balance = "tokens",
    cost_a: Any = None,
    equal_size: bool = False,
) -> Assignment:
    """Deal rollout groups (``prompt_lengths[g]``, ``completion_lengths[g]``) to ``parts = (ranks,
    micro_batches)``, a group never split, by :func:`balance_costs` on each group's tokens
    (``balance="tokens"``) or cost (``"cost"``, with ``cost_a`` a number or the model's config), as
    :func:`group_loads` prices them with ``share_prompt``. ``equal_size``: every part gets ``floor`` or
    ``ceil`` of ``groups / parts`` groups (a trainer with a fixed number of groups per micro-batch).

    :attr:`Assignment.loads` holds the balanced measure; :meth:`Assignment.loads_of` gives the other.
    """
    a = check_balance(balance, cost_a)
    ranks, micro = _check_parts(parts)
    tokens, costs = group_loads(prompt_lengths, completion_lengths, share_prompt=share_prompt, cost_a=a)
    if tokens.size < ranks * micro:
        raise ValueError(
            f"parts={parts} needs at least {ranks * micro} groups (one per micro-batch of every "
            f"rank), got {tokens.size}; lower ranks or micro_batches"
        )
    return balance_costs(costs if balance == "cost" else tokens, parts, equal_size=equal_size)
