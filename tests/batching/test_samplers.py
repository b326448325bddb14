import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_features
from padless.batching.collate import PackingCollator
from padless.batching.rows import PackedRows
from padless.batching.samplers import LengthGroupedBatchSampler


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=200), st.integers(1, 16), st.integers(0, 5))
def test_length_grouped_batches_cover_every_index_once(lengths, batch_size, seed):
    sampler = LengthGroupedBatchSampler(lengths, batch_size=batch_size, seed=seed, mega_batch_mult=4)
    batches = sampler.batches()
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    assert all(1 <= len(b) <= batch_size for b in batches)
    assert sampler.batches() == batches  # reproducible
    sampler.set_epoch(1)
    if len(lengths) > batch_size * 2:
        assert sorted(i for b in sampler.batches() for i in b) == flat


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=200), st.integers(300, 2000))
def test_token_budget_batches_stay_within_budget(lengths, max_tokens):
    batches = LengthGroupedBatchSampler(lengths, max_tokens=max_tokens, seed=0).batches()
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) * max(lengths[i] for i in b) <= max_tokens for b in batches)


def test_bucketing_pads_less_than_random_batches():
    rng = np.random.default_rng(0)
    lengths = rng.lognormal(4, 1, 2000).astype(int) + 1

    def padded(batches):
        return sum(len(b) * lengths[b].max() for b in map(np.array, batches))

    random = [list(range(i, min(i + 16, 2000))) for i in range(0, 2000, 16)]
    grouped = LengthGroupedBatchSampler(lengths, batch_size=16, seed=0).batches()
    assert padded(grouped) < 0.7 * padded(random)


def test_sampler_bad_input():
    with pytest.raises(ValueError, match="exactly one"):
        LengthGroupedBatchSampler([1, 2])
    with pytest.raises(ValueError, match="smaller than example 1"):
        LengthGroupedBatchSampler([1, 50], max_tokens=10)
    with pytest.raises(ValueError, match="batch_size"):
        LengthGroupedBatchSampler([1, 2], batch_size=0)


def test_packed_rows_feed_the_collator_without_replanning():
    feats = make_features([5, 9, 3, 14, 2, 7, 1], with_labels=True, seed=2)
    rows = PackedRows(feats, max_length=16)
    assert len(rows) == rows.plan.num_rows >= 3
    batch = PackingCollator(
        model_free=True, max_length=16, pad_to_max_length=True, attention="varlen", pad_token_id=-1
    )([rows[r] for r in range(len(rows))])
    assert batch["input_ids"].shape == (len(rows), 16)
    placed = sorted(t for t in batch["input_ids"].reshape(-1).tolist() if t != -1)
    assert placed == sorted(t for f in feats for t in f["input_ids"])
    with pytest.raises(IndexError):
        rows[len(rows)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 20), max_size=60), st.integers(1, 9), st.integers(0, 3))
def test_group_by_length_equals_sorting_each_chunk(lengths, chunk, seed):
    """The one bucketing step (planning.lengths.group_by_length, used by LengthGroupedBatchSampler and
    bucketed_order) against the obvious loop: each chunk sorted longest first, ties in given order."""
    from padless.planning.lengths import group_by_length

    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(lengths.size)
    expected = []
    for s in range(0, order.size, chunk):
        part = order[s : s + chunk].tolist()
        expected += sorted(part, key=lambda i: -lengths[i])  # sorted() is stable
    assert group_by_length(lengths, order, chunk).tolist() == expected
