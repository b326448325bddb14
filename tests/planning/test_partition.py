"""The optimal length partition against brute force over every partition of a small sorted list."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from padless.planning.partition import optimal_length_partition


def _cost(n, m):  # a fixed overhead per group plus the padded work, as the bucketing baseline prices it
    return 40.0 + np.asarray(n, dtype=float) * m


def _brute_force(lengths: list[int]) -> float:
    """The cheapest split of the sorted lengths into contiguous groups (every cut set tried)."""
    s = sorted(lengths)
    best = float("inf")
    for k in range(len(s)):
        for cuts in itertools.combinations(range(1, len(s)), k):
            bounds = [0, *cuts, len(s)]
            best = min(best, sum(float(_cost(b - a, s[b - 1])) for a, b in itertools.pairwise(bounds)))
    return best


def _price(lengths: np.ndarray, groups: list[np.ndarray]) -> float:
    return sum(float(_cost(g.size, lengths[g].max())) for g in groups)


def test_literal_case() -> None:
    lengths = np.array([5, 100, 6, 98, 7])
    groups = optimal_length_partition(lengths, _cost)
    assert [sorted(lengths[g].tolist()) for g in groups] == [[5, 6, 7], [98, 100]]


@given(st.lists(st.integers(1, 64), min_size=1, max_size=9))
def test_equals_brute_force_and_places_every_index_once(lengths: list[int]) -> None:
    arr = np.array(lengths)
    groups = optimal_length_partition(arr, _cost)
    assert sorted(np.concatenate(groups).tolist()) == list(range(len(lengths)))
    assert _price(arr, groups) == pytest.approx(_brute_force(lengths))
    maxima = [int(arr[g].max()) for g in groups]
    assert maxima == sorted(maxima)


def test_empty_and_bad_shape() -> None:
    assert optimal_length_partition(np.array([], dtype=np.int64), _cost) == []
    with pytest.raises(ValueError, match="1-D"):
        optimal_length_partition(np.ones((2, 2)), _cost)
