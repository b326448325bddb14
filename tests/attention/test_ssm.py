"""Pure state-space / recurrent models (Mamba, Mamba2, Falcon-Mamba, RWKV, xLSTM: no attention, no
position embeddings, ``position_ids`` only through ``**kwargs``) pack exactly through
``PackingCollator.for_model``: the boundaries the batch is sent (``cu_seq_lens_q/k`` as keywords)
reach the per-document mixers, and the same batch is contaminated once the mixers are disabled."""

from __future__ import annotations

import pytest
import torch
from test_mixers import (
    CONTAMINATED,
    EXACT,
    LENGTHS,
    NO_ATTENTION,
    VOCAB,
    alone_logits,
    assert_packed_grads_equal_alone,
    build,
)

import padless
from conftest import make_features
from padless.attention.mixers import disable_per_document_mixers, enable_per_document_mixers, mixer_refusal
from padless.attention.select import BACKENDS, attention_free
from padless.layout import ROW_PADDING, lengths_from_position_ids

SSM = sorted(NO_ATTENTION)


def _packed(model, batch) -> torch.Tensor:
    with torch.no_grad():  # position_ids as a plain keyword: no packed_documents context
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits


@pytest.mark.parametrize("family", SSM)
def test_for_model_packs_exactly_through_the_boundaries_sent(family):
    model = build(family, None)
    assert mixer_refusal(model) is not None and not attention_free(model)
    with pytest.raises(ValueError, match="takes no position_ids"):  # unpatched: refused as before
        padless.check_exact(model, model.config._attn_implementation)
    collator = padless.PackingCollator.for_model(model, max_length=32)
    assert collator.attention == "varlen" and attention_free(model)
    batch = collator(make_features(LENGTHS, vocab_size=VOCAB, seed=5))
    assert "attention_mask" not in batch and batch["use_cache"] is False  # a 2D mask would read as padding
    assert "cu_seq_lens_q" in batch
    rows = [lengths_from_position_ids(row.numpy()) for row in batch["position_ids"]]
    assert len(rows) > 1 and max(map(len, rows)) > 1  # several rows, documents sharing one
    padless.check_batch(model, batch)
    alone = alone_logits(model, batch)
    # the documents' positions: a row's trailing padding is no document (its scan skips it)
    width = batch["input_ids"].shape[1]
    real = torch.arange(width)[None, :] < (width - batch[ROW_PADDING])[:, None]
    after = (_packed(model, batch) - alone)[real].abs().max().item()
    assert after <= EXACT, f"{family}: packed vs alone {after:.2e}"
    disable_per_document_mixers(model)
    before = (_packed(model, batch) - alone)[real].abs().max().item()
    assert before > CONTAMINATED, f"{family}: the unpatched model is not contaminated ({before:.2e})"
    with pytest.raises(ValueError, match="takes no position_ids"):
        padless.check_batch(model, batch)


@pytest.mark.parametrize("family", SSM)
def test_every_backend_name_is_exact_and_a_bare_config_is_not(family):
    """No attention runs, so ``attn_implementation`` does not matter; a config cannot show its mixers."""
    model = build(family, None)
    enable_per_document_mixers(model)
    for backend in BACKENDS:
        padless.check_exact(model, backend, device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="takes no position_ids"):
        padless.check_exact(model.config, "eager")
    with pytest.raises(ValueError, match="shared-prompt tree needs attention"):
        padless.check_exact(model, "eager", layout="shared_prompt")


def test_packed_gradients_equal_alone_through_the_boundaries_sent():
    model = build("mamba2", None).train()
    collator = padless.PackingCollator.for_model(model, max_length=64)
    batch = collator(make_features(LENGTHS, vocab_size=VOCAB, seed=6))
    assert batch["input_ids"].shape[0] == 1

    inputs = {k: v for k, v in batch.items() if k != "labels"}
    lengths = lengths_from_position_ids(batch["position_ids"][0].numpy()).tolist()
    assert_packed_grads_equal_alone(model, lambda: model(**inputs).logits, batch["input_ids"], lengths)


@pytest.mark.parametrize("family", ["mamba2", "rwkv"])
def test_verify_isolation_runs_once_the_mixers_are_patched(family):
    model = build(family, None)
    report = padless.verify_isolation(model)
    assert not report.passed and all(r.status == "refused" for r in report.results)
    enable_per_document_mixers(model)
    report = padless.verify_isolation(model)
    passed = [r.backend for r in report.results if r.status == "pass"]
    assert report.passed and "eager" in passed, report
    assert all(r.status == "refused" for r in report.results if r.backend.endswith("+shared_prompt"))
