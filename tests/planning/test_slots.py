"""One plan from merged histograms; the deterministic placement held equal to its slow reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from padless.planning.plan import plan_packs
from padless.planning.slots import by_row, merge_histograms, plan_histogram, reference_placement

FAST = settings(max_examples=60, deadline=None)


def counts_of(lengths, max_length):
    return np.bincount(np.asarray(lengths, dtype=np.int64), minlength=max_length + 1)


def place_in_shards(plan, lengths, cuts):
    """Each shard placed on its own from the prefix sums of the histograms before it."""
    pieces = [np.asarray(lengths[a:b]) for a, b in zip(cuts, cuts[1:])]
    total, before = merge_histograms([counts_of(p, plan.max_length) for p in pieces], plan.max_length)
    assert np.array_equal(total, plan.counts)
    placed = [plan.place(p, b) for p, b in zip(pieces, before)]
    return np.concatenate([r for r, _ in placed]), np.concatenate([o for _, o in placed])


def test_a_literal_case():
    """Lengths [5, 3, 5, 3], rows of 8: two rows [5, 3]; the first 5 and the first 3 share row 0."""
    plan = plan_histogram(counts_of([5, 3, 5, 3], 8), 8)
    assert plan.num_rows == 2 and plan.row_fills(0, 2).tolist() == [8, 8]
    rows, offsets = plan.place(np.array([5, 3, 5, 3]), np.zeros(9, dtype=np.int64))
    assert rows.tolist() == [0, 0, 1, 1] and offsets.tolist() == [0, 5, 0, 5]
    # the same input cut in two: the second shard's 5 is the input's second 5
    rows2, offsets2 = place_in_shards(plan, [5, 3, 5, 3], [0, 1, 4])
    assert rows2.tolist() == rows.tolist() and offsets2.tolist() == offsets.tolist()


@FAST
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=300), max_length=st.integers(40, 90), data=st.data())
def test_placement_equals_the_reference_for_any_cut(lengths, max_length, data):
    lengths = np.array(lengths)
    plan = plan_histogram(counts_of(lengths, max_length), max_length)
    cuts = sorted({0, len(lengths), *data.draw(st.lists(st.integers(0, len(lengths)), max_size=6))})
    rows, offsets = place_in_shards(plan, lengths, cuts)
    ref_rows, ref_offsets = reference_placement(lengths, plan)
    assert np.array_equal(rows, ref_rows) and np.array_equal(offsets, ref_offsets)
    # every slot taken once: no two sequences overlap, and each row is filled exactly to its fill
    end = offsets + lengths
    assert (end <= max_length).all()
    order = np.lexsort((offsets, rows))
    same_row = rows[order][1:] == rows[order][:-1]
    assert (offsets[order][1:][same_row] == end[order][:-1][same_row]).all()  # packed from 0, no gaps
    fill = np.bincount(rows, weights=lengths, minlength=plan.num_rows).astype(np.int64)
    assert np.array_equal(fill, plan.row_fills(0, plan.num_rows))


@FAST
@given(lengths=st.lists(st.integers(1, 64), min_size=1, max_size=400), max_length=st.integers(64, 128))
def test_as_many_rows_with_the_same_fills_as_item_by_item_best_fit(lengths, max_length):
    plan = plan_histogram(counts_of(lengths, max_length), max_length)
    bfd = plan_packs(lengths, max_length, strategy="best_fit_decreasing")
    assert plan.num_rows == bfd.stats.num_rows
    assert sorted(plan.row_fills(0, plan.num_rows).tolist()) == sorted(bfd.row_lengths.tolist())
    stats = plan.stats()
    assert stats.num_rows == bfd.stats.num_rows and stats.real_tokens == sum(lengths)


def test_within_five_hundredths_of_a_percent_of_the_lower_bound_on_a_million_lengths():
    from padless.planning.lengths import draw_lengths

    lengths = np.minimum(draw_lengths("lognormal", 1_000_000, np.random.default_rng(0), ()), 1024)
    plan = plan_histogram(counts_of(lengths, 1024), 1024)
    assert plan.stats().relative_gap <= 0.0005
    assert plan.tokens == int(lengths.sum())


def test_row_fills_of_any_range_and_the_digest():
    lengths = np.random.default_rng(1).integers(1, 100, 2000)
    plan = plan_histogram(counts_of(lengths, 128), 128)
    every = plan.row_fills(0, plan.num_rows)
    for a, b in [(0, 1), (3, 17), (plan.num_rows - 5, plan.num_rows), (10, 10)]:
        assert np.array_equal(plan.row_fills(a, b), every[a:b])
    assert plan.digest() == plan_histogram(counts_of(lengths, 128), 128).digest()
    assert plan.digest() != plan_histogram(counts_of(lengths[1:], 128), 128).digest()
    rows = np.array([3, 1, 3, 0, 1])
    assert by_row(rows, 4).tolist() == [3, 1, 4, 0, 2]  # stable


def test_bad_histograms_and_shards_are_refused():
    with pytest.raises(ValueError, match="counts\\[0\\] must be 0"):
        plan_histogram(np.array([1, 2, 0]), 2)
    with pytest.raises(ValueError, match="max_length \\+ 1 = 3 entries"):
        plan_histogram(np.array([0, 2]), 2)
    plan = plan_histogram(counts_of([2, 2], 4), 4)
    with pytest.raises(ValueError, match="not in the plan's histogram"):
        plan.place(np.array([2, 2, 2]), np.zeros(5, dtype=np.int64))
    with pytest.raises(ValueError, match="lengths must lie in"):
        plan.place(np.array([5]), np.zeros(5, dtype=np.int64))
    empty = plan_histogram(np.zeros(5, dtype=np.int64), 4)
    assert empty.num_rows == 0 and empty.place(np.zeros(0, dtype=np.int64), np.zeros(5, dtype=np.int64))[0].size == 0
