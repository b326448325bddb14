"""Where the documents of a packed forward lie, seen from a layer inside it
(padless.attention.mixer_documents): the boundaries sent, a peer's positions (only without padding or a
cache), nothing from the model's own 3-D positions, and refusals."""

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


def forward_given(**given):
    """What the model-forward hook records for a forward given ``given``."""
    return mixer_documents._MODEL_FORWARD.set(mixer_documents._Forward(**given))


def test_position_ids_among_the_layer_arguments_are_not_read():
    """A layer's own position ids are not a source: only boundaries sent are (or a peer's batch given
    to the model)."""
    assert layer_documents(HIDDEN, {"position_ids": RESTARTS}) == Documents(None, False)


def test_cu_seq_lens_among_the_layer_arguments_are_sent():
    cu = torch.tensor(EXPECTED, dtype=torch.int32)
    found = layer_documents(HIDDEN, {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu})
    assert found.cu_seqlens is cu and found.explicit


def test_cu_seq_lens_given_to_the_model_are_sent():
    cu = torch.tensor(EXPECTED, dtype=torch.int32)
    token = forward_given(cu_seqlens=cu, position_ids=RESTARTS[None].expand(4, -1, -1))
    try:
        found = layer_documents(HIDDEN, {})
    finally:
        mixer_documents._MODEL_FORWARD.reset(token)
    assert found.cu_seqlens is cu and found.explicit


@pytest.mark.parametrize("kind", ["position_ids", "cu_seqlens"])
def test_packed_documents_context_is_sent(kind):
    given = {"position_ids": RESTARTS} if kind == "position_ids" else {"cu_seqlens": torch.tensor(EXPECTED)}
    with packed_documents(**given):
        found = layer_documents(HIDDEN, {})
    assert offsets(found) == EXPECTED and found.explicit


@pytest.mark.parametrize(
    ("given", "read"),
    [
        ({}, True),  # a peer's batch: [B, L] positions alone
        ({"padded": True}, False),  # a left-padded batch restarts positions too
        ({"cached": True}, False),  # transformers reads no documents with a cache either
    ],
)
def test_a_peers_positions_count_only_without_a_padding_mask_or_cache(given, read):
    before = mixer_documents.inferred_forwards()
    token = forward_given(position_ids=RESTARTS, **given)
    try:
        found = layer_documents(HIDDEN, {})
    finally:
        mixer_documents._MODEL_FORWARD.reset(token)
    assert found == (Documents(found.cu_seqlens, False) if read else Documents(None, False))
    assert (offsets(found) == EXPECTED) is read
    assert mixer_documents.inferred_forwards() == before + read  # counted, for the trainers to say


def test_multi_axis_rotary_positions_mark_no_documents():
    """The model's own 3-D rope positions (Qwen3.5 with images) do not step by 1 across image tokens:
    never read as documents."""
    token = forward_given(position_ids=RESTARTS[None].expand(3, -1, -1))
    try:
        assert layer_documents(HIDDEN, {}) == Documents(None, False)
    finally:
        mixer_documents._MODEL_FORWARD.reset(token)


def test_a_row_of_one_document_is_not_packed():
    token = forward_given(position_ids=torch.arange(6).expand(2, -1))
    try:
        assert layer_documents(HIDDEN, {}).cu_seqlens is None
    finally:
        mixer_documents._MODEL_FORWARD.reset(token)
    assert layer_documents(HIDDEN, {}) == Documents(None, False)


def test_positions_of_another_length_are_the_models_own_forward():
    token = forward_given(position_ids=RESTARTS[:, :5])  # a cached or chunked forward of a peer's row
    try:
        assert layer_documents(HIDDEN, {}) == Documents(None, False)
    finally:
        mixer_documents._MODEL_FORWARD.reset(token)
    with packed_documents(position_ids=RESTARTS[:, :5]), pytest.raises(ValueError, match="cover 5 tokens"):
        layer_documents(HIDDEN, {})


def test_boundaries_of_another_size_are_refused():
    cu = torch.tensor([0, 3, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match="cover 9 tokens but the layer got 2 x 6"):
        layer_documents(HIDDEN, {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu})


def test_a_document_across_rows_is_refused():
    cu = torch.tensor([0, 2, 12], dtype=torch.int32)  # as many documents as rows, the second over both rows
    with pytest.raises(ValueError, match="across the end of a row"):
        layer_documents(HIDDEN, {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu})


def test_one_document_per_row_with_its_boundaries_sent_runs_the_scans() -> None:
    """A packed batch whose rows each hold one document still sends ``cu_seq_lens``; the mixer layer then
    runs padless' scans (its own torch code refuses boundary kwargs without a CUDA kernel package)."""
    import transformers as T

    import padless

    padless.register_padless_attention()
    config = T.Qwen3_5TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], head_dim=8,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
    )  # fmt: skip
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(config, attn_implementation="padless").eval()
    batch = padless.PackingCollator.for_model(model, max_length=32)([{"input_ids": list(range(1, 20))}])
    assert batch["cu_seq_lens_q"].tolist() == [0, 19]
    with torch.no_grad():
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        alone = model(input_ids=batch["input_ids"], use_cache=False).logits
    assert (packed - alone).abs().max() < 1e-5
