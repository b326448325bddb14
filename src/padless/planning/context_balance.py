"""Context-parallel balance: the order of a packed row's documents that evens out its shards' attention work.

A row of ``L`` tokens split over ``cp`` ranks in equal contiguous shards gives every rank ``L / cp``
tokens, but not equal work: under causal attention, the token at position ``p`` inside its document
attends to ``p + 1`` keys, so a shard's attention work is::

    work(shard) = sum over its tokens of (position inside the document + 1)

and a shard holding the end of a long document does far more than one holding short documents. The
planner does not pad each document to ``2 x cp`` and zigzag it (Megatron's THD layout); it reorders
the documents of the row and deals the row's equal chunks to the ranks by a layout (:data:`LAYOUTS`):
contiguous shards, zigzag (a long document's cheap head and expensive tail on the same ranks) or
striped (several zigzag rounds: every rank holds pieces from all along the row). Every rank still holds
``L / cp`` tokens, each chunk boundary cuts at most one document (the one that straddles it), and no
token is added but the row-end padding the chunks need. A document cut by a boundary keeps its
positions: the part after the boundary is the heavy part, counted on the rank that holds it.

The search (:func:`balance_row`): start from the row's order (or a greedy fill for contiguous shards,
longest first otherwise); repeatedly try a batch of candidate moves, each taking a document that
overlaps the heaviest rank's chunks and swapping it with, or inserting it before, another document, all
evaluated at once with numpy; keep the best when it lowers the heaviest rank's work (ties: the sum of
squared works). Padding at the row end stays at the end, as its own document. Deterministic for a
``seed``. In contiguous shards a document longer than a shard cannot balance (the last shard of a
document of ``k`` shards carries about ``2k - 1`` times its first's work whatever the order); zigzag and
striped chunks spread it (benchmarks/context_parallel_balance.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from padless.planning.checks import check_int
from padless.planning.plan import PackPlan

LAYOUTS = ("contiguous", "zigzag", "striped")
"""How a row is dealt to the cp ranks (the rule :func:`chunk_ranks` gives and
:func:`padless.attention.context_parallel.shard_index` applies): ``contiguous``, ``cp`` equal shards;
``zigzag``, ``2 cp`` equal chunks, rank ``r`` holding chunks ``r`` and ``2 cp - 1 - r``; ``striped``,
:data:`STRIPES` such rounds (``2 STRIPES cp`` chunks dealt in snake order: ``0 .. cp - 1``, then
``cp - 1 .. 0``, and again), so every rank holds pieces from all along the row."""

STRIPES = 4
"""Zigzag rounds of the ``striped`` layout: ``2 x 4`` chunks per rank."""


def chunk_ranks(cp: int, layout: str) -> np.ndarray:
    """int64 ``[parts]``: the rank holding each of the row's equal chunks, in row order (``cp`` parts
    for ``contiguous``, ``2 cp`` for ``zigzag``, ``2 STRIPES cp`` for ``striped``)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if layout == "contiguous":
        return np.arange(cp, dtype=np.int64)
    rounds = 1 if layout == "zigzag" else STRIPES
    chunk = np.arange(2 * rounds * cp, dtype=np.int64)
    block, seat = chunk // cp, chunk % cp
    return np.where(block % 2 == 0, seat, cp - 1 - seat)


def _parts(cp: int, layout: str) -> int:
    return int(chunk_ranks(cp, layout).size)


def padded_length(row_length: int, cp: int, layout: str = "contiguous") -> int:
    """The row length rounded up to a multiple of ``cp`` (``2 cp`` under zigzag): the row end padded, as
    the shards need."""
    parts = _parts(cp, layout)
    return -(-row_length // parts) * parts


def _with_padding(lengths: np.ndarray, row_length: int, cp: int, layout: str = "contiguous") -> np.ndarray:
    """``[..., n]`` lengths checked to fit the row (the padding after them is not a column)."""
    if lengths.size and np.any(lengths.sum(axis=-1) > padded_length(row_length, cp, layout)):
        raise ValueError(
            f"lengths: the documents hold {int(lengths.sum(-1).max())} tokens, more than row_length {row_length}"
        )
    return lengths


def _works(lengths: np.ndarray, total: int, cp: int, layout: str = "contiguous") -> np.ndarray:
    """``[..., cp]`` int64 shard works of rows ``[..., n]`` of ``total`` tokens; the padding after the
    documents costs 1 per token (each padding token its own document: ``split_row``'s padding). Under
    zigzag a shard's work is its two chunks'."""
    ranks = chunk_ranks(cp, layout)
    chunks = _part_works(lengths, total, ranks.size)  # [..., parts]
    if layout == "contiguous":
        return chunks
    return chunks @ np.eye(cp, dtype=np.int64)[ranks]  # [..., cp]: each rank's chunks summed


def _part_works(lengths: np.ndarray, total: int, cp: int) -> np.ndarray:
    """``[..., cp]`` works of ``cp`` equal contiguous parts of rows ``[..., n]`` of ``total`` tokens."""
    bounds = np.arange(cp + 1, dtype=np.int64) * (total // cp)  # [cp + 1]
    ends = np.cumsum(lengths, axis=-1)
    starts = ends - lengths  # [..., n]
    lo = np.clip(bounds[:-1] - starts[..., None], 0, lengths[..., None])  # [..., n, cp] tokens before the shard
    hi = np.clip(bounds[1:] - starts[..., None], 0, lengths[..., None])  # tokens up to its end
    used = ends[..., -1:] if lengths.shape[-1] else np.zeros((*lengths.shape[:-1], 1), dtype=np.int64)
    padding = np.clip(bounds[1:] - np.maximum(bounds[:-1], used), 0, None)  # [..., cp]
    return ((hi * (hi + 1) - lo * (lo + 1)) // 2).sum(axis=-2) + padding


def shard_work(
    lengths: Sequence[int] | np.ndarray, row_length: int, cp: int, *, layout: str = "contiguous"
) -> np.ndarray:
    """int64 ``[cp]``: each shard's attention work for documents of ``lengths`` laid out in this order
    in a row of ``row_length`` tokens (padded to a multiple of ``cp``, ``2 cp`` under zigzag; the padding
    is a document too)."""
    check_int(cp, "cp", minimum=1)
    arr = np.asarray(lengths, dtype=np.int64)
    return _works(_with_padding(arr, row_length, cp, layout), padded_length(row_length, cp, layout), cp, layout)


def cut_documents(
    lengths: Sequence[int] | np.ndarray, row_length: int, cp: int, *, layout: str = "contiguous"
) -> np.ndarray:
    """int64 ``[parts - 1]``: how many documents each boundary between shards (chunks under zigzag:
    ``2 cp - 1`` of them) cuts (0 or 1 for any order)."""
    parts = _parts(cp, layout)
    ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
    starts = ends - np.asarray(lengths, dtype=np.int64)
    bounds = np.arange(1, parts, dtype=np.int64) * (padded_length(row_length, cp, layout) // parts)
    return ((starts[None, :] < bounds[:, None]) & (ends[None, :] > bounds[:, None])).sum(axis=1)


def imbalance(work: np.ndarray) -> float:
    """``max / mean`` of shard works: a cp step's time over a perfectly balanced one."""
    mean = float(np.mean(work))
    return float(np.max(work)) / mean if mean > 0 else 1.0


@dataclass(frozen=True)
class RowBalance:
    """A row's documents reordered for ``cp`` shards."""

    order: np.ndarray
    """int64 ``[n]``: the documents' new order (indices into the given lengths)."""
    before: np.ndarray
    """int64 ``[cp]``: shard works in the given order."""
    after: np.ndarray
    """int64 ``[cp]``: shard works in :attr:`order`."""


def balance_row(
    lengths: Sequence[int] | np.ndarray,
    row_length: int,
    cp: int,
    *,
    target: float = 1.01,
    rounds: int = 60,
    candidates: int = 32,
    seed: int = 0,
    layout: str = "contiguous",
) -> RowBalance:
    """Reorder a row's documents so its ``cp`` equal shards (``layout``: :data:`LAYOUTS`) do about equal
    attention work (module docstring). Stops at ``max/mean <= target``, after ``rounds`` batches of
    ``candidates`` moves, or after 15 batches without improvement. Never worse than the given order."""
    check_int(cp, "cp", minimum=1)
    check_int(rounds, "rounds", minimum=0)
    check_int(candidates, "candidates", minimum=1)
    arr = np.asarray(lengths, dtype=np.int64)
    if arr.ndim != 1 or (arr.size and arr.min() < 1):
        raise ValueError("lengths must be a 1-D list of positive document lengths")
    total = padded_length(row_length, cp, layout)
    padded = _with_padding(arr, row_length, cp, layout)
    before = _works(padded, total, cp, layout)
    order = np.arange(arr.size, dtype=np.int64)
    work, n = before, arr.size
    if n < 2 or cp == 1:
        return RowBalance(order, before, before)
    # starts: contiguous, the greedy fill; zigzag, longest first (a long document's head and tail then
    # fall in the first chunks and their mirrors, rank by rank)
    start = _greedy_order(arr, total, cp) if layout == "contiguous" else np.argsort(-arr, kind="stable")
    start_work = _works(arr[start], total, cp, layout)
    if (start_work.max(), np.square(start_work.astype(np.float64)).sum()) < (
        work.max(),
        np.square(work.astype(np.float64)).sum(),
    ):
        order, work = start, start_work
    rng = np.random.default_rng(seed)
    key = (int(work.max()), float(np.square(work.astype(np.float64)).sum()))
    stale = 0
    for _ in range(rounds):
        if imbalance(work) <= target or stale >= 15:
            break
        trial = _moves(order, arr, total, cp, int(np.argmax(work)), candidates, rng, layout)  # [K, n]
        works = _works(_with_padding(arr[trial], row_length, cp, layout), total, cp, layout)  # [K, cp]
        maxes, squares = works.max(axis=1), np.square(works.astype(np.float64)).sum(axis=1)
        best = int(np.lexsort((squares, maxes))[0])
        if (int(maxes[best]), float(squares[best])) < key:
            order, work, key, stale = trial[best], works[best], (int(maxes[best]), float(squares[best])), 0
        else:
            stale += 1
    return RowBalance(order, before, work)


def _greedy_order(lengths: np.ndarray, total: int, cp: int) -> np.ndarray:
    """Documents placed one after another, each time the one (longest among ties) that keeps the shards
    it completes closest to the mean work, and the shard it ends in closest to its share of the mean
    (the mean times the share of the shard's tokens filled)."""
    width = total // cp
    target = _works(lengths, total, cp).sum() / cp
    left = list(np.argsort(-lengths, kind="stable"))  # remaining documents, longest first
    order: list[int] = []
    works = np.zeros(cp, dtype=np.float64)
    at = 0
    shards = np.arange(cp)
    while left:
        cand = lengths[left]  # [K]
        lo = np.clip(shards * width - at, 0, cand[:, None])  # [K, cp]
        hi = np.clip((shards + 1) * width - at, 0, cand[:, None])
        trial = works + (hi * (hi + 1) - lo * (lo + 1)) / 2  # [K, cp]
        done = shards[None, :] < ((at + cand) // width)[:, None]  # shards the document completes
        current = np.minimum((at + cand) // width, cp - 1)  # the shard it ends in
        score = np.where(done, np.abs(trial - target), 0.0).sum(axis=1)
        filled = np.minimum(at + cand - current * width, width) / width  # share of the current shard filled
        score += np.abs(trial[np.arange(cand.size), current] - target * filled)
        pick = int(np.argmin(score))  # first minimum: the longest such document
        order.append(int(left.pop(pick)))
        works = trial[pick]
        at += int(cand[pick])
    return np.asarray(order, dtype=np.int64)


def _moves(
    order: np.ndarray,
    lengths: np.ndarray,
    total: int,
    cp: int,
    heavy: int,
    k: int,
    rng: np.random.Generator,
    layout: str = "contiguous",
) -> np.ndarray:
    """``[k, n]`` orders, each one move from ``order``: a document overlapping shard ``heavy`` (either of
    its chunks under zigzag) swapped with, or inserted before, a random other document."""
    n = order.size
    ends = np.cumsum(lengths[order])
    starts = ends - lengths[order]
    ranks = chunk_ranks(cp, layout)
    width = total // ranks.size
    mine = np.flatnonzero(ranks == heavy)
    touching = np.flatnonzero(np.any([(starts < (p + 1) * width) & (ends > p * width) for p in mine], axis=0))
    if touching.size == 0:  # only padding in the heaviest shard
        touching = np.arange(n)
    picks = rng.choice(touching, size=k)
    others = rng.integers(0, n, size=k)
    out = np.repeat(order[None, :], k, axis=0)
    for row, (i, j, swap) in enumerate(zip(picks, others, rng.random(k) < 0.5)):
        if swap:
            out[row, [i, j]] = out[row, [j, i]]
        else:
            item = out[row, i]
            rest = np.delete(out[row], i)
            out[row] = np.insert(rest, j if j <= i else j - 1, item)
    return out


def deal_rows(lengths: np.ndarray, row_length: int, rows: int) -> list[np.ndarray]:
    """Pieces of ``lengths`` dealt to rows of ``row_length`` tokens so every row holds a mix of long and
    short ones (a best-fit-decreasing row holds pieces of about one length, which no order balances):
    longest first, in snake order over ``rows`` rows; a piece that does not fit its turn's row goes to
    the row with the least room that holds it, else a new row. Returns each row's piece indices."""
    order = np.argsort(-lengths, kind="stable")
    room = np.full(rows, row_length, dtype=np.int64)
    held: list[list[int]] = [[] for _ in range(rows)]
    for turn, piece in enumerate(order):
        size = int(lengths[piece])
        lap, seat = divmod(turn, rows)
        r = seat if lap % 2 == 0 else rows - 1 - seat
        if room[r] < size:
            fits = np.flatnonzero(room >= size)
            if fits.size == 0:
                room = np.append(room, row_length)
                held.append([])
                fits = np.asarray([room.size - 1])
            r = int(fits[np.argmin(room[fits])])
        room[r] -= size
        held[r].append(int(piece))
    return [np.asarray(h, dtype=np.int64) for h in held if h]


def balance_plan(plan: PackPlan, cp: int, **options: object) -> PackPlan:
    """``plan`` reordered for ``cp`` shards of ``plan.max_length / cp`` tokens: every row's pieces
    ordered by :func:`balance_row`, in the plan's own rows or in rows dealt to mix long and short
    pieces (:func:`deal_rows`; one more row only where a piece fits none), whichever takes less time:
    the sum over rows of the slowest shard's work. ``options`` go to :func:`balance_row` (``layout``
    among them)."""
    own = [np.arange(a, b) for a, b in zip(plan.row_offsets[:-1], plan.row_offsets[1:])]
    best: tuple[float, list[np.ndarray]] | None = None
    for rows in (own, deal_rows(plan.length, plan.max_length, max(plan.num_rows, 1))):
        ordered, slowest = [], 0
        for row in rows:
            balanced = balance_row(plan.length[row], plan.max_length, cp, **options)  # type: ignore[arg-type]
            ordered.append(row[balanced.order])
            slowest += int(balanced.after.max())
        score = float(slowest)  # the epoch's attention time: each row waits for its slowest shard
        if best is None or score < best[0]:
            best = (score, ordered)
    assert best is not None
    order = np.concatenate(best[1]) if best[1] else np.zeros(0, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([r.size for r in best[1]])]).astype(np.int64)
    return replace(
        plan, index=plan.index[order], start=plan.start[order], length=plan.length[order], row_offsets=offsets
    )
