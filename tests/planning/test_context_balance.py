"""The context-parallel balance planner: every token placed once, at most one document cut at each shard
boundary, no padding added, never worse than the given order, and balanced where the lengths allow."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from padless.planning.context_balance import (
    LAYOUTS,
    balance_plan,
    balance_row,
    cut_documents,
    deal_rows,
    imbalance,
    shard_work,
)
from padless.planning.plan import plan_packs


def _work_by_tokens(lengths, row_length: int, cp: int, layout: str = "contiguous") -> np.ndarray:
    """The definition, token by token: position inside the document + 1, padding 1 per token, summed
    over the tokens each rank holds (the attention's own rule, ``shard_index``)."""

    from padless.attention.context_parallel import row_multiple, shard_index

    parts = row_multiple(cp, layout)
    total = -(-row_length // parts) * parts
    per_token = np.ones(total, dtype=np.int64)
    at = 0
    for n in lengths:
        per_token[at : at + n] = np.arange(1, n + 1)
        at += n
    return np.asarray([per_token[shard_index(total, cp, r, layout).numpy()].sum() for r in range(cp)])


rows_of_layouts = st.tuples(st.integers(1, 6), st.sampled_from(LAYOUTS)).flatmap(
    lambda c: st.tuples(st.just(c), st.lists(st.integers(1, 300), min_size=1, max_size=25), st.integers(0, 200))
)


@settings(max_examples=40, deadline=None)
@given(rows_of_layouts)
def test_every_layout_counts_the_work_its_ranks_hold_and_balances_without_loss(case) -> None:
    (cp, layout), lengths, spare = case
    row_length = sum(lengths) + spare
    out = balance_row(lengths, row_length, cp, rounds=5, layout=layout)
    assert sorted(out.order.tolist()) == list(range(len(lengths)))
    ordered = np.asarray(lengths)[out.order]
    assert (cut_documents(ordered, row_length, cp, layout=layout) <= 1).all()  # per chunk boundary
    np.testing.assert_array_equal(out.after, _work_by_tokens(ordered, row_length, cp, layout))
    np.testing.assert_array_equal(out.before, _work_by_tokens(lengths, row_length, cp, layout))
    assert out.after.max() <= out.before.max()


def test_one_document_filling_the_row_is_balanced_by_zigzag_not_by_contiguous_shards() -> None:
    assert imbalance(shard_work([4096], 4096, 4)) > 1.7  # the last shard: 7 / 4 of the mean
    assert imbalance(shard_work([4096], 4096, 4, layout="zigzag")) < 1.001
    assert imbalance(shard_work([4096], 4096, 4, layout="striped")) < 1.001


def test_long_tailed_rows_balance_within_five_percent_striped() -> None:
    """Lognormal trajectories (median 3,000, sigma 1.2) in rows of 32k at cp = 4: documents longer than a
    shard keep contiguous shards above 1.05 in any order; striped chunks with the order searched do not."""
    from padless.planning.lengths import draw_lengths

    lengths = draw_lengths("lognormal", 120, np.random.default_rng(0), (3000.0, 1.2, 32_768))
    plan = plan_packs(lengths, 32_768)
    full = [r for r in range(plan.num_rows) if plan.row_lengths[r] >= 16_384]

    def mean_ratio(balanced, layout):
        return np.mean([imbalance(shard_work(balanced.row(r)[2], 32_768, 4, layout=layout)) for r in full])

    assert mean_ratio(balance_plan(plan, 4), "contiguous") > 1.05
    striped = balance_plan(plan, 4, layout="striped")
    ratios = [
        imbalance(shard_work(striped.row(r)[2], 32_768, 4, layout="striped"))
        for r in range(striped.num_rows)
        if striped.row_lengths[r] >= 16_384
    ]
    assert np.mean(ratios) <= 1.05, ratios


rows = st.integers(1, 6).flatmap(
    lambda cp: st.tuples(
        st.just(cp),
        st.lists(st.integers(1, 300), min_size=1, max_size=25),
        st.integers(0, 200),
    )
)


@settings(max_examples=60, deadline=None)
@given(rows)
def test_balance_row_places_every_token_once_and_cuts_at_most_one_document_per_boundary(case) -> None:
    cp, lengths, spare = case
    row_length = sum(lengths) + spare
    out = balance_row(lengths, row_length, cp, rounds=5)
    assert sorted(out.order.tolist()) == list(range(len(lengths)))  # a permutation: each document once
    ordered = np.asarray(lengths)[out.order]
    assert (cut_documents(ordered, row_length, cp) <= 1).all()
    np.testing.assert_array_equal(out.after, _work_by_tokens(ordered, row_length, cp))
    np.testing.assert_array_equal(out.before, _work_by_tokens(lengths, row_length, cp))
    assert out.after.sum() == out.before.sum()  # no padding added: the work only moves
    assert out.after.max() <= out.before.max()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 500), min_size=1, max_size=60), st.integers(2, 8))
def test_balance_plan_keeps_every_piece_in_rows_that_fit(lengths, cp) -> None:
    plan = plan_packs(lengths, 1024)
    out = balance_plan(plan, cp, rounds=3)
    assert sorted(zip(out.index.tolist(), out.start.tolist())) == sorted(zip(plan.index.tolist(), plan.start.tolist()))
    assert (out.row_lengths <= 1024).all()
    assert out.num_rows <= plan.num_rows + 1


def test_a_row_of_mixed_lengths_balances_to_within_five_percent() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(100, 2000, size=200)
    lengths = lengths[np.cumsum(lengths) <= 131_072]
    lengths = np.append(lengths, 131_072 - lengths.sum())  # a full row
    ordered = np.sort(lengths)  # longest last: the last shard does the most work
    before = imbalance(shard_work(ordered, 131_072, 8))
    after = imbalance(balance_row(ordered, 131_072, 8).after)
    assert before > 1.05 >= after, (before, after)


def test_dealt_rows_mix_lengths_and_fit() -> None:
    lengths = np.asarray([900] * 8 + [100] * 8)
    rows = deal_rows(lengths, 1000, 8)
    assert sorted(np.concatenate(rows).tolist()) == list(range(16))
    assert all(lengths[r].sum() <= 1000 and set(lengths[r]) == {900, 100} for r in rows)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="cp"):
        balance_row([3, 4], 8, 0)
    with pytest.raises(ValueError, match="row_length"):
        shard_work([30, 40], 8, 2)
