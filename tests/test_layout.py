import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from padless.layout import (
    cu_seqlens_from_lengths,
    document_ids_from_lengths,
    lengths_from_position_ids,
    position_ids_from_lengths,
)


def test_literal_layout():
    assert position_ids_from_lengths([3, 2, 4]).tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert document_ids_from_lengths([3, 2, 4]).tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert cu_seqlens_from_lengths([3, 2, 4]).tolist() == [0, 3, 5, 9]
    assert cu_seqlens_from_lengths([]).tolist() == [0]


@given(st.lists(st.integers(1, 50), max_size=30))
def test_position_ids_round_trip(lengths):
    pos = position_ids_from_lengths(lengths)
    assert pos.size == sum(lengths)
    assert lengths_from_position_ids(pos).tolist() == lengths


@pytest.mark.parametrize("lengths", [[0], [3, -1], [[1, 2]]])
def test_bad_lengths(lengths):
    with pytest.raises(ValueError):
        position_ids_from_lengths(lengths)


def test_position_ids_that_do_not_restart_cleanly():
    with pytest.raises(ValueError, match="start at 0"):
        lengths_from_position_ids([1, 2])
    with pytest.raises(ValueError, match="count up by 1"):
        lengths_from_position_ids([0, 1, 3])
    assert lengths_from_position_ids(np.array([], dtype=np.int64)).size == 0


# ------------------------------------------------------------ the one validator and row builder
from padless.layout import TokenError, append_separator, build_row, check_tokens, mask_document_starts  # noqa: E402


@pytest.mark.parametrize(
    ("ids", "labels", "reason", "match"),
    [
        (None, None, "bad_type", "input_ids is null"),
        ([], None, "empty", "empty sequence"),
        ([1, 2, 600], None, "bad_token", r"token id 600 is outside the vocabulary \[0, 512\) \(input_ids\[2\]\)"),
        ([1, -3], None, "bad_token", "token id -3"),
        ([1, 2**70], None, "bad_token", "far outside any vocabulary"),
        ([1.5, 2.0], None, "bad_type", "integer token ids"),
        (["a", "b"], None, "bad_type", "integer token ids"),
        ([[1, 2]], None, "bad_type", "1-D"),
        ([1, 2], [1], "length_mismatch", "labels has 1 tokens but input_ids has 2"),
        ([1, 2], [-5, 2], "bad_label", r"label -5 \(labels\[0\]\) is neither -100"),
        ([1, 2], [1, 99999], "bad_label", r"label 99999 \(labels\[1\]\)"),
        ([1, 2], [1, None], "bad_type", "integers only"),
    ],
)
def test_check_tokens_refuses_bad_input(ids, labels, reason, match):
    with pytest.raises(TokenError, match=match) as info:
        check_tokens(ids, labels, vocab_size=512, where="feature 3")
    assert info.value.reason == reason
    assert str(info.value).startswith("feature 3")


def test_check_tokens_accepts_ignore_index_and_whole_floats():
    ids, labels = check_tokens([1.0, 2.0, 3.0], [-100, 2, 3], vocab_size=4)
    assert ids.dtype == np.int64 and ids.tolist() == [1, 2, 3] and labels.tolist() == [-100, 2, 3]
    ids, labels = check_tokens(np.array([5, 6], dtype=np.int32))
    assert labels.tolist() == [5, 6] and labels is not ids  # a copy: masking labels never edits the ids


def test_build_row_and_masking():
    seqs = {0: (np.array([10, 11, 12]), np.array([10, -100, 12])), 1: (np.array([20, 21]), np.array([20, 21]))}
    ids, labels, docs = build_row([(1, 0, 2), (0, 1, 2)], seqs.__getitem__)
    assert ids.tolist() == [20, 21, 11, 12] and labels.tolist() == [20, 21, -100, 12] and docs.tolist() == [2, 2]
    assert mask_document_starts(labels, docs).tolist() == [-100, 21, -100, 12]
    with pytest.raises(ValueError, match="too few for the piece"):
        build_row([(1, 1, 2)], seqs.__getitem__)
    with pytest.raises(ValueError, match="at least one piece"):
        build_row([], seqs.__getitem__)


@pytest.mark.parametrize(
    ("labels", "expected"),
    [([5, 6], [5, 6, 0]), ([5, -100], [5, -100, -100]), ([-100, 6], [-100, 6, 0])],
)
def test_separator_is_trained_exactly_after_a_trained_token(labels, expected):
    ids, lab = append_separator(np.array([5, 6]), np.array(labels), 0)
    assert ids.tolist() == [5, 6, 0] and lab.tolist() == expected
    _, never = append_separator(np.array([5, 6]), np.array(labels), 0, trainable=False)
    assert never.tolist()[-1] == -100
    same, _ = append_separator(np.array([5, 0]), np.array(labels), 0)
    assert same.tolist() == [5, 0]  # already ends with it
