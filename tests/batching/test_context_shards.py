"""A packed row split over cp ranks: positions, document ids and shifted targets computed on the whole
row before the split, the row end padded to a multiple of cp."""

from __future__ import annotations

import pytest
import torch

from padless.batching.context_shards import document_ids_from_positions, shifted_targets, split_row
from padless.layout import IGNORE_INDEX


def test_split_row_shifts_before_the_split_and_pads_the_row_end() -> None:
    ids = torch.arange(1, 7)  # one document of 6 tokens, cp = 4: padded to 8
    shards = [split_row(ids, ids.clone(), torch.arange(6), cp=4, rank=r) for r in range(4)]
    assert [s.targets.tolist() for s in shards] == [[[2, 3]], [[4, 5]], [[6, IGNORE_INDEX]], [[IGNORE_INDEX] * 2]]
    assert shards[3].input_ids.tolist() == [[0, 0]] and shards[3].position_ids.tolist() == [[0, 0]]
    assert shards[0].document_ids.tolist() == [[0, 0, 0, 0, 0, 0, 1, 2]]  # each padding token its own document
    assert {s.num_items for s in shards} == {5} and [s.start for s in shards] == [0, 2, 4, 6]
    with pytest.raises(ValueError, match="rank"):
        split_row(ids, ids, torch.arange(6), cp=2, rank=2)


def test_targets_never_cross_a_document_boundary() -> None:
    pos = torch.tensor([[0, 1, 2, 0, 1, 0]])
    docs = document_ids_from_positions(pos)
    assert docs.tolist() == [[0, 0, 0, 1, 1, 2]]
    labels = torch.tensor([[10, 11, 12, 13, 14, 15]])
    assert shifted_targets(labels, docs).tolist() == [[11, 12, IGNORE_INDEX, 14, IGNORE_INDEX, IGNORE_INDEX]]


def test_shapes_must_agree() -> None:
    with pytest.raises(ValueError, match="same"):
        split_row(torch.zeros(4, dtype=torch.long), torch.zeros(3, dtype=torch.long), torch.arange(4), cp=2, rank=0)
