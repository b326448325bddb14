"""Placements built straight from a flat plan's arrays: a literal case, the slow per-row reference on
random plans, and the packing collator's rows read back through them."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from padless.batching.batch import Placements
from padless.batching.collate import PackingCollator
from padless.planning.plan import DEPRECATED_STRATEGIES, STRATEGIES, plan_packs

CURRENT_STRATEGIES = tuple(s for s in STRATEGIES if s not in DEPRECATED_STRATEGIES)  # no deprecated name


def _reference(plan):
    """Slow reference: walk each row, offsets running from 0."""
    feature, start, row, offset, length = [], [], [], [], []
    for r in range(plan.num_rows):
        at = 0
        for i, s, n in zip(*(a.tolist() for a in plan.row(r))):
            feature.append(i), start.append(s), row.append(r), offset.append(at), length.append(n)
            at += n
    return feature, start, row, offset, length


def _of(plan):
    return Placements.from_plan(
        index=plan.index,
        start=plan.start,
        length=plan.length,
        row_offsets=plan.row_offsets,
        num_features=plan.num_sequences,
    )


def test_from_plan_literal():
    pl = Placements.from_plan(
        index=[2, 3, 0, 1, 1], start=[0, 0, 0, 0, 4], length=[6, 2, 5, 4, 3], row_offsets=[0, 2, 4, 5], num_features=4
    )
    assert pl.feature.tolist() == [2, 3, 0, 1, 1]
    assert pl.start.tolist() == [0, 0, 0, 0, 4]
    assert pl.row.tolist() == [0, 0, 1, 1, 2]
    assert pl.offset.tolist() == [0, 6, 0, 5, 0]
    assert pl.length.tolist() == [6, 2, 5, 4, 3]
    assert pl.num_rows == 3 and pl.num_features == 4
    assert pl.row_pieces(1).tolist() == [[0, 0, 5], [1, 0, 4]]
    assert pl.of_feature(1) == [(0, 1, 5, 4), (4, 2, 0, 3)]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=60),
    max_length=st.integers(8, 48),
    strategy=st.sampled_from(CURRENT_STRATEGIES),
)
def test_from_plan_equals_the_per_row_reference(lengths, max_length, strategy):
    plan = plan_packs(lengths, max_length, strategy=strategy, overlong="split")
    pl = _of(plan)
    assert [a.tolist() for a in (pl.feature, pl.start, pl.row, pl.offset, pl.length)] == [
        list(a) for a in _reference(plan)
    ]
    assert pl.num_rows == plan.num_rows
    assert all(int(pl.row_pieces(r)[:, 2].sum()) <= max_length for r in range(pl.num_rows))


def test_packing_collator_places_the_plan():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 12, 30)
    feats = [{"input_ids": (np.arange(n) + 100 * i) % 997} for i, n in enumerate(lengths)]
    batch = PackingCollator(model_free=True, max_length=16, overlong="split")(feats)
    pl, want = batch.placements, _of(plan_packs(lengths, 16))
    assert [a.tolist() for a in (pl.feature, pl.start, pl.row, pl.offset, pl.length)] == [
        a.tolist() for a in (want.feature, want.start, want.row, want.offset, want.length)
    ]
    for f, s, r, o, n in zip(pl.feature, pl.start, pl.row, pl.offset, pl.length):  # every token where it says
        assert batch["input_ids"][r, o : o + n].tolist() == feats[f]["input_ids"][s : s + n].tolist()
