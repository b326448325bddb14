"""What padless' GRPO and DPO trainers share (padless.integrations.trl_logprobs): a padded row read as its
contiguous tokens, a hole refused; a group that cannot fit one row refused naming the trainer's max_length."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("trl")


def test_a_row_is_its_contiguous_tokens_and_a_hole_is_refused():
    from padless.integrations.trl_logprobs import _span

    assert _span(np.array([0, 0, 1, 1, 1]), "left", "row 0") == 3
    assert _span(np.array([1, 1, 0]), "right", "row 1") == 2
    with pytest.raises(ValueError, match=r"row 2 is not left-padded \(a 0 between its tokens\)"):
        _span(np.array([0, 1, 0, 1]), "left", "row 2")


def test_a_group_longer_than_a_row_is_refused_naming_max_length():
    from padless.integrations.trl_logprobs import _check_group_sizes

    group = {"prompt_ids": [1, 2, 3], "completion_ids": [[4, 5], [6]]}
    _check_group_sizes([group], 6, True, "GRPOTrainer")  # 3 + 2 + 1 tokens, the prompt once
    _check_group_sizes([group], None, False, "GRPOTrainer")  # one row per forward chunk: no bound
    with pytest.raises(
        ValueError,
        match=r"needs 9 tokens in one row \(share_prompt=False\), more than "
        r"DPOTrainer\(max_length=8\)",
    ):
        _check_group_sizes([group], 8, False, "DPOTrainer")
