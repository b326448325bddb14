import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from padless.attention.masks import additive_block_causal_mask, block_causal_mask


def test_block_causal_mask_literal():
    expected = np.array(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [0, 0, 0, 1, 0, 0],
            [0, 0, 0, 1, 1, 0],
            [0, 0, 0, 0, 0, 1],
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(block_causal_mask([3, 2, 1]), expected)


def _slow_reference(lengths):
    """Element by element, straight from the definition."""
    doc = [d for d, n in enumerate(lengths) for _ in range(n)]
    t = len(doc)
    return np.array([[doc[i] == doc[j] and j <= i for j in range(t)] for i in range(t)], dtype=bool)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=5), min_size=1, max_size=3),
    st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_additive_mask_matches_reference(rows, dtype):
    width = max(sum(r) for r in rows)
    rows = [r + ([width - sum(r)] if sum(r) < width else []) for r in rows]  # pad docs fill each row
    mask = additive_block_causal_mask(rows, dtype=dtype)
    assert mask.shape == (len(rows), 1, width, width) and mask.dtype == dtype
    for b, r in enumerate(rows):
        allowed = mask[b, 0] == 0
        np.testing.assert_array_equal(allowed.numpy(), _slow_reference(r))
        assert (mask[b, 0][~allowed] == torch.finfo(dtype).min).all()
        assert allowed.any(dim=-1).all()  # no fully masked query row


def test_additive_mask_rows_must_match():
    with pytest.raises(ValueError, match="same number of tokens"):
        additive_block_causal_mask([[2, 1], [2]])
