"""Context-parallel balance: the order of a packed row's documents that evens out its shards' attention work.

A row of ``L`` tokens split over ``cp`` ranks in equal contiguous shards gives every rank ``L / cp``
tokens, but not equal work: under causal attention, the token at position ``p`` inside its document
attends to ``p + 1`` keys, so a shard's attention work is::

    work(shard) = sum over its tokens of (position inside the document + 1)

and a shard holding the end of a long document does far more than one holding short documents. The
planner does not pad each document to ``2 x cp`` and zigzag it (Megatron's THD layout); it reorders
the documents of the row. The shards stay equal and contiguous, so each shard boundary cuts at most
one document (the one that straddles it), and no token is added. A document cut by a boundary keeps
its positions: the part after the boundary is the heavy part, counted on the next shard.

The search (:func:`balance_row`): start from the row's order; repeatedly try a batch of candidate
moves, each taking a document that overlaps the heaviest shard and swapping it with, or inserting it
before, another document, all evaluated at once with numpy; keep the best when it lowers the heaviest
shard's work (ties: the sum of squared works). Padding at the row end stays at the end, as its own
document. Deterministic for a ``seed``. Rows whose documents are longer than a shard cannot always
balance: the last shard of a document of ``k`` shards carries about ``(2k - 1)`` times its first's work
whatever the order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from padless.planning.checks import check_int
from padless.planning.plan import PackPlan


def padded_length(row_length: int, cp: int) -> int:
    """The row length rounded up to a multiple of ``cp`` (the row end padded, as the shards need)."""
    return -(-row_length // cp) * cp


def _with_padding(lengths: np.ndarray, row_length: int, cp: int) -> np.ndarray:
    """``[..., n]`` lengths checked to fit the row (the padding after them is not a column)."""
    if lengths.size and np.any(lengths.sum(axis=-1) > padded_length(row_length, cp)):
        raise ValueError(
            f"lengths: the documents hold {int(lengths.sum(-1).max())} tokens, more than row_length {row_length}"
        )
    return lengths


def _works(lengths: np.ndarray, total: int, cp: int) -> np.ndarray:
    """``[..., cp]`` int64 shard works of rows ``[..., n]`` of ``total`` tokens; the padding after the
    documents costs 1 per token (each padding token its own document: ``split_row``'s padding)."""
    bounds = np.arange(cp + 1, dtype=np.int64) * (total // cp)  # [cp + 1]
    ends = np.cumsum(lengths, axis=-1)
    starts = ends - lengths  # [..., n]
    lo = np.clip(bounds[:-1] - starts[..., None], 0, lengths[..., None])  # [..., n, cp] tokens before the shard
    hi = np.clip(bounds[1:] - starts[..., None], 0, lengths[..., None])  # tokens up to its end
    used = ends[..., -1:] if lengths.shape[-1] else np.zeros((*lengths.shape[:-1], 1), dtype=np.int64)
    padding = np.clip(bounds[1:] - np.maximum(bounds[:-1], used), 0, None)  # [..., cp]
    return ((hi * (hi + 1) - lo * (lo + 1)) // 2).sum(axis=-2) + padding


def shard_work(lengths: Sequence[int] | np.ndarray, row_length: int, cp: int) -> np.ndarray:
    """int64 ``[cp]``: each shard's attention work for documents of ``lengths`` laid out in this order
    in a row of ``row_length`` tokens (padded to a multiple of ``cp``; the padding is a document too)."""
    check_int(cp, "cp", minimum=1)
    arr = np.asarray(lengths, dtype=np.int64)
    return _works(_with_padding(arr, row_length, cp), padded_length(row_length, cp), cp)


def cut_documents(lengths: Sequence[int] | np.ndarray, row_length: int, cp: int) -> np.ndarray:
    """int64 ``[cp - 1]``: how many documents each shard boundary cuts (0 or 1 for any order)."""
    ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
    starts = ends - np.asarray(lengths, dtype=np.int64)
    bounds = np.arange(1, cp, dtype=np.int64) * (padded_length(row_length, cp) // cp)
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
) -> RowBalance:
    """Reorder a row's documents so its ``cp`` equal contiguous shards do about equal attention work
    (module docstring). Stops at ``max/mean <= target``, after ``rounds`` batches of ``candidates``
    moves, or after 15 batches without improvement. Never worse than the given order."""
    check_int(cp, "cp", minimum=1)
    check_int(rounds, "rounds", minimum=0)
    check_int(candidates, "candidates", minimum=1)
    arr = np.asarray(lengths, dtype=np.int64)
    if arr.ndim != 1 or (arr.size and arr.min() < 1):
        raise ValueError("lengths must be a 1-D list of positive document lengths")
    total = padded_length(row_length, cp)
    padded = _with_padding(arr, row_length, cp)
    before = _works(padded, total, cp)
    order = np.arange(arr.size, dtype=np.int64)
    work, n = before, arr.size
    if n < 2 or cp == 1:
        return RowBalance(order, before, before)
    greedy = _greedy_order(arr, total, cp)
    greedy_work = _works(arr[greedy], total, cp)
    if (greedy_work.max(), np.square(greedy_work.astype(np.float64)).sum()) < (
        work.max(),
        np.square(work.astype(np.float64)).sum(),
    ):
        order, work = greedy, greedy_work
    rng = np.random.default_rng(seed)
    key = (int(work.max()), float(np.square(work.astype(np.float64)).sum()))
    stale = 0
    for _ in range(rounds):
        if imbalance(work) <= target or stale >= 15:
            break
        trial = _moves(order, arr, total, cp, int(np.argmax(work)), candidates, rng)  # [K, n]
        works = _works(_with_padding(arr[trial], row_length, cp), total, cp)  # [K, cp]
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
    order: np.ndarray, lengths: np.ndarray, total: int, cp: int, heavy: int, k: int, rng: np.random.Generator
) -> np.ndarray:
    """``[k, n]`` orders, each one move from ``order``: a document overlapping shard ``heavy`` swapped
    with, or inserted before, a random other document."""
    n = order.size
    ends = np.cumsum(lengths[order])
    starts = ends - lengths[order]
    width = total // cp
    touching = np.flatnonzero((starts < (heavy + 1) * width) & (ends > heavy * width))
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
    pieces (:func:`deal_rows`; one more row only where a piece fits none), whichever has the lower
    mean ``max/mean`` shard work. ``options`` go to :func:`balance_row`."""
    own = [np.arange(a, b) for a, b in zip(plan.row_offsets[:-1], plan.row_offsets[1:])]
    best: tuple[float, list[np.ndarray]] | None = None
    for rows in (own, deal_rows(plan.length, plan.max_length, max(plan.num_rows, 1))):
        ordered, ratios = [], []
        for row in rows:
            balanced = balance_row(plan.length[row], plan.max_length, cp, **options)  # type: ignore[arg-type]
            ordered.append(row[balanced.order])
            ratios.append(imbalance(balanced.after))
        score = float(np.mean(ratios)) if ratios else 1.0
        if best is None or score < best[0]:
            best = (score, ordered)
    assert best is not None
    order = np.concatenate(best[1]) if best[1] else np.zeros(0, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([r.size for r in best[1]])]).astype(np.int64)
    return replace(
        plan, index=plan.index[order], start=plan.start[order], length=plan.length[order], row_offsets=offsets
    )
