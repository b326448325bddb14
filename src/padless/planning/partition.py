"""Optimal partition of sequences into length groups padded to their longest (pure numpy).

Used twice: the grouped-SDPA attention kernel cuts a packed row's documents into buckets
(:func:`padless.attention.varlen.bucket_documents`), and the bucketing baseline of the benchmark
cuts a step's examples into micro-batches (:func:`padless.bench.strategies.bucket_partition`).
Both price a group of ``n`` sequences padded to length ``m`` as ``group_cost(n, m)``; in an optimal
partition each group is a contiguous run of the length-sorted list (swapping a short member of a
longer group with a long member of a shorter one never costs more), so a dynamic programme over the
cut points of that list is exact.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

GroupCost = Callable[[np.ndarray, float], np.ndarray]
"""``group_cost(n, m)``: the price of groups of ``n`` sequences (an array) padded to length ``m``.
Must grow with ``n`` at fixed ``m`` for the optimum to be contiguous in the sorted order."""


def optimal_length_partition(lengths: np.ndarray, group_cost: GroupCost) -> list[np.ndarray]:
    """Indices of each group, groups in ascending length, members sorted by length (longest last).

    O(k^2) in the number ``k`` of distinct lengths, vectorised over the cut position: equal lengths
    never need to be split, so the dynamic programme runs over distinct lengths."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {lengths.shape}")
    if lengths.size == 0:
        return []
    order = np.argsort(lengths, kind="stable")
    uniq, counts = np.unique(lengths[order], return_counts=True)
    before = np.concatenate([[0], np.cumsum(counts)])  # sequences shorter than uniq[j]
    best = np.zeros(uniq.size + 1)  # best[j]: cheapest partition of the sequences shorter than uniq[j]
    cut = np.zeros(uniq.size + 1, dtype=np.int64)
    for j in range(1, uniq.size + 1):
        # the last group holds the sequences of lengths uniq[i:j], padded to uniq[j-1]
        total = best[:j] + group_cost(before[j] - before[:j], float(uniq[j - 1]))
        cut[j] = int(np.argmin(total))
        best[j] = total[cut[j]]
    bounds = []
    j = uniq.size
    while j > 0:
        bounds.append((before[cut[j]], before[j]))
        j = cut[j]
    return [order[a:b] for a, b in reversed(bounds)]
