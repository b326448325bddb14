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
