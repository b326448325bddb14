"""The one definition of padding (padless.planning.padding): literal cases."""

from __future__ import annotations

import numpy as np
import pytest

from padless.planning.padding import padded_tokens, padding_fraction, placed_lengths


def test_padding_fraction_literal():
    assert padding_fraction(3, 4) == pytest.approx(0.25)
    assert padding_fraction(4, 4) == 0.0
    assert padding_fraction(0, 0) is None  # nothing computed: no share
    with pytest.raises(ValueError, match="real_tokens must be in"):
        padding_fraction(5, 4)


def test_padded_tokens_pads_each_batch_to_its_longest():
    lengths = np.array([3, 5, 2, 7, 1])
    assert padded_tokens(lengths, 2) == 5 * 2 + 7 * 2 + 1  # [3, 5] [2, 7] [1]
    assert padded_tokens(lengths, 2, pad_to_multiple_of=4) == 8 * 2 + 8 * 2 + 4
    assert padded_tokens(np.array([], dtype=np.int64), 4) == 0


def test_placed_lengths_follow_one_overlong_policy():
    lengths = np.array([3, 10, 4])
    assert placed_lengths(lengths, 4, "truncate").tolist() == [3, 4, 4]
    assert sorted(placed_lengths(lengths, 4, "split").tolist()) == [2, 3, 4, 4, 4]
    assert placed_lengths(lengths, 4, "drop").tolist() == [3, 4]
