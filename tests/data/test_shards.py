"""What every reader of ``padless pack`` shares (padless.data.shards): the flat token check equals the
one validator applied sequence by sequence, shards cut by the data, one kind of record per input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from padless.data.inputs import RecordsInput
from padless.data.shards import INT32_IDS, check_flat, cut_records, encode_shard
from padless.layout import TokenError, check_tokens

VOCAB = 10
# values around every edge of the rule: negative, -100, inside, at and past the vocabulary
VALUES = st.sampled_from([-101, -100, -1, 0, 1, 9, 10, 11])


def reference(seqs, labels):
    """The one validator, sequence by sequence: the flat arrays, or the first refusal's message."""
    out_ids, out_labels = [], []
    for i, ids in enumerate(seqs):
        try:
            lab = None if labels is None else np.asarray(labels[i], dtype=np.int64)
            x, y = check_tokens(np.asarray(ids, dtype=np.int64), lab, vocab_size=VOCAB, where=f"seq {i}")
        except TokenError as err:
            return str(err)
        out_ids.append(x)
        out_labels.append(y)
    return np.concatenate(out_ids), None if labels is None else np.concatenate(out_labels)


def flat(seqs):
    offsets = np.concatenate(([0], np.cumsum([len(s) for s in seqs]))).astype(np.int64)
    return np.asarray([v for s in seqs for v in s], dtype=np.int64), offsets


@settings(max_examples=300)
@given(
    st.lists(st.lists(VALUES, min_size=0, max_size=4), min_size=1, max_size=5),
    st.one_of(st.none(), st.integers(0, 2**16)),
    st.booleans(),
)
def test_the_flat_check_is_the_validator_sequence_by_sequence(seqs, label_seed, short_label):
    """Same arrays when every sequence passes; else the message of the first refused sequence."""
    labels = None
    if label_seed is not None:
        rng = np.random.default_rng(label_seed)
        labels = [[int(v) for v in rng.choice([-100, -5, 0, 3, 9, 10], len(s))] for s in seqs]
        if short_label and labels[-1]:
            labels[-1] = labels[-1][:-1]  # one sequence's labels one shorter than its ids
    ids, offsets = flat(seqs)
    lab, lab_offsets = flat(labels) if labels is not None else (None, None)
    want = reference(seqs, labels)
    if isinstance(want, str):
        with pytest.raises(TokenError) as err:
            check_flat(ids, offsets, lab, lab_offsets, vocab_size=VOCAB, name=lambda i: f"seq {i}")
        assert str(err.value) == want
    else:
        got_ids, got_labels = check_flat(ids, offsets, lab, lab_offsets, vocab_size=VOCAB, name=lambda i: f"seq {i}")
        assert np.array_equal(got_ids, want[0]) and got_ids.dtype == np.int64
        assert (got_labels is None) == (labels is None)
        if labels is not None:
            assert np.array_equal(got_labels, want[1])


@pytest.mark.parametrize(
    ("values", "match"),
    [
        (np.array([1.0, 2.0, 3.0, 4.5]), r"seq 1: input_ids must be integer token ids, got dtype float64"),
        (np.array([1.0, 2.0, 3.0, np.nan]), r"seq 1: input_ids must be integer token ids"),  # a null inside a list
        (np.array([True, False, True, True]), r"seq 0: input_ids must be integer token ids, got dtype bool"),
        (np.array([1, 2, 3, 2**40]), r"seq 1: token id 1099511627776 is outside the vocabulary \[0, 2147483648\)"),
    ],
)
def test_the_flat_check_refuses_what_a_cast_would_hide(values, match):
    """Whole floats are ids (as from a JSON reader); a fraction, a NaN (Arrow's null inside a list),
    booleans and an id past int32 without a vocabulary are refused, never cast."""
    with pytest.raises(TokenError, match=match):
        check_flat(values, np.array([0, 2, 4]), vocab_size=None, name=lambda i: f"seq {i}")
    ids, _ = check_flat(np.array([1.0, 2.0, 3.0]), np.array([0, 2, 3]), vocab_size=None, name=str)
    assert ids.tolist() == [1, 2, 3] and INT32_IDS == 2**31


@pytest.mark.parametrize("rows", [1, 3, 7, 10, 11])
def test_records_are_cut_by_position_and_named_by_their_numbers(rows):
    numbers = [2, 3, 5, 8, 9, 10, 11, 13, 14, 20]  # a CSV's lines: multi-line cells skip numbers
    shards = cut_records(10, rows, numbers)
    assert [(s.begin, s.end) for s in shards] == [(b, min(b + rows, 10)) for b in range(0, 10, rows)]
    assert [s.first_row for s in shards] == [numbers[s.begin] for s in shards]
    assert [s.first_row for s in cut_records(10, rows)] == [s.begin + 1 for s in shards]
    assert [s.index for s in shards] == list(range(len(shards)))
    with pytest.raises(ValueError, match="rows must be >= 1, got 0"):
        cut_records(10, 0)


def test_encoded_ids_keep_their_labels_and_refuse_what_int32_cannot_hold():
    src = RecordsInput(name="mem", key={}, kind="input_ids", records=[])
    toks = encode_shard(src, [4, 9], [{"input_ids": [5, 6], "labels": [-100, 6]}, {"input_ids": [7]}])
    assert toks.ids.tolist() == [5, 6, 7] and toks.labels.tolist() == [-100, 6, 7]
    assert toks.offsets.tolist() == [0, 2, 3] and toks.rows.tolist() == [4, 9]
    assert encode_shard(src, [1], [{"input_ids": [5, 6]}]).labels is None  # every label its id
    past_int32 = r"mem, record 2: token id 2147483648 is outside the vocabulary \[0, 2147483648\)"
    with pytest.raises(ValueError, match=past_int32):  # stored as int32: refused, not wrapped
        encode_shard(src, [1, 2], [{"input_ids": [1]}, {"input_ids": [2**31]}])


def test_a_record_of_another_kind_is_named_with_both_kinds():
    src = RecordsInput(name="mem", key={}, kind="input_ids", records=[])
    with pytest.raises(ValueError, match="mem, line 7 has 'text', but the input's first record has 'input_ids'"):
        encode_shard(
            RecordsInput(name="mem", key={}, kind="input_ids", unit="line", records=[]),
            [3, 7],
            [{"input_ids": [1]}, {"text": "a"}],
        )
    with pytest.raises(ValueError, match="mem, record 1 is a list, not an object with fields"):
        encode_shard(src, [1], [[1, 2]])
