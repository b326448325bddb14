"""Where the documents of a packed forward lie, seen from a layer inside it
(padless.attention.mixer_documents): each source, the padding rule, and refusals."""

from __future__ import annotations

import pytest
import torch

from padless.attention import mixer_documents
from padless.attention.backend import packed_documents
from padless.attention.mixer_documents import Documents, layer_documents

HIDDEN = torch.zeros(2, 6, 3)  # [B, L, H]
RESTARTS = torch.tensor([[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 0, 1]])
EXPECTED = [0, 3, 6, 10, 12]


def offsets(found: Documents) -> list[int] | None:
    return None if found.cu_seqlens is None else found.cu_seqlens.tolist()


def test_position_ids_among_the_layer_arguments_are_inferred():
    found = layer_documents(HIDDEN, {"position_ids": RESTARTS})
    assert offsets(found) == EXPECTED and not found.explicit


def test_cu_seq_lens_among_the_layer_arguments_are_sent():
    cu = torch.tensor(EXPECTED, dtype=torch.int32)
    found = layer_documents(HIDDEN, {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu})
    assert found.cu_seqlens is cu and found.explicit


@pytest.mark.parametrize("kind", ["position_ids", "cu_seqlens"])
def test_packed_documents_context_is_sent(kind):
    given = {"position_ids": RESTARTS} if kind == "position_ids" else {"cu_seqlens": torch.tensor(EXPECTED)}
    with packed_documents(**given):
        found = layer_documents(HIDDEN, {})
    assert offsets(found) == EXPECTED and found.explicit


def test_model_positions_count_only_without_a_padding_mask():
    token = mixer_documents._MODEL_POSITIONS.set((RESTARTS, False))
    try:
        assert offsets(layer_documents(HIDDEN, {})) == EXPECTED
    finally:
        mixer_documents._MODEL_POSITIONS.reset(token)
    token = mixer_documents._MODEL_POSITIONS.set((RESTARTS, True))  # a left-padded batch, say
    try:
        assert layer_documents(HIDDEN, {}) == Documents(None, False)
    finally:
        mixer_documents._MODEL_POSITIONS.reset(token)


def test_a_row_of_one_document_is_not_packed():
    assert layer_documents(HIDDEN, {"position_ids": torch.arange(6).expand(2, -1)}).cu_seqlens is None
    assert layer_documents(HIDDEN, {}) == Documents(None, False)


def test_multi_axis_rotary_positions_read_the_text_axis():
    found = layer_documents(HIDDEN, {"position_ids": RESTARTS[None].expand(4, -1, -1)})  # [4, B, L], Qwen3.5
    assert offsets(found) == EXPECTED


def test_positions_of_another_length_are_refused():
    with pytest.raises(ValueError, match="cover 5 tokens but a token-mixing layer got 6"):
        layer_documents(HIDDEN, {"position_ids": RESTARTS[:, :5]})


def test_boundaries_of_another_size_are_refused():
    cu = torch.tensor([0, 3, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match="cover 9 tokens but the layer got 2 x 6"):
        layer_documents(HIDDEN, {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu})


def test_a_document_across_rows_is_refused():
    cu = torch.tensor([0, 2, 12], dtype=torch.int32)  # as many documents as rows, the second over both rows
    with pytest.raises(ValueError, match="across the end of a row"):
        layer_documents(HIDDEN, {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu})
