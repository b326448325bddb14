"""A packed row split over cp ranks: positions, document ids and shifted targets computed on the whole
row before the split, the row end padded to a multiple of cp."""

from __future__ import annotations

import pytest
import torch

from padless.batching.context_shards import document_ids_from_positions, shifted_targets, split_row
from padless.layout import IGNORE_INDEX


def test_split_row_shifts_before_the_split_and_pads_the_row_end() -> None:
    ids = torch.arange(1, 8)  # one document of 7 tokens, cp = 2: padded to 8
    shard0 = split_row(ids, ids.clone(), torch.arange(7), cp=2, rank=0)
    shard1 = split_row(ids, ids.clone(), torch.arange(7), cp=2, rank=1)
    assert shard0.targets.tolist() == [[2, 3, 4, 5]]  # the last target (5) lives on rank 1's first token
    assert shard1.targets.tolist() == [[6, 7, IGNORE_INDEX, IGNORE_INDEX]]
    assert shard1.input_ids.tolist() == [[5, 6, 7, 0]] and shard1.position_ids.tolist() == [[4, 5, 6, 0]]
    assert shard0.num_items == shard1.num_items == 6
    with pytest.raises(ValueError, match="rank"):
        split_row(ids, ids, torch.arange(7), cp=2, rank=2)


def test_targets_never_cross_a_document_boundary() -> None:
    pos = torch.tensor([[0, 1, 2, 0, 1, 0]])
    docs = document_ids_from_positions(pos)
    assert docs.tolist() == [[0, 0, 0, 1, 1, 2]]
    labels = torch.tensor([[10, 11, 12, 13, 14, 15]])
    assert shifted_targets(labels, docs).tolist() == [[11, 12, IGNORE_INDEX, 14, IGNORE_INDEX, IGNORE_INDEX]]


def test_shapes_must_agree() -> None:
    with pytest.raises(ValueError, match="same"):
        split_row(torch.zeros(4, dtype=torch.long), torch.zeros(3, dtype=torch.long), torch.arange(4), cp=2, rank=0)
