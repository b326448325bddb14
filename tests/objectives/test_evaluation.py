"""packed_eval_loss: each example's loss from packed rows equals the example run alone; the total
equals the padded token-normalised loss."""

import numpy as np
import pytest
import torch

import padless
from conftest import make_features
from padless.attention.backend import register_padless_attention
from padless.batching.collate import PaddingCollator
from padless.models.factory import build_model
from padless.objectives.evaluation import packed_eval_loss
from padless.objectives.loss import model_loss, step_num_items

LENGTHS = [5, 1, 17, 9, 3, 12, 2, 8, 20, 6, 30]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("backend", ["sdpa", "padless"])
@pytest.mark.parametrize("trained_logits_only", [False, True])
def test_per_example_equals_alone_and_total_equals_padded(family, backend, trained_logits_only):
    if backend == "padless":
        register_padless_attention()
    model = build_model(f"tiny-{family}", attn_implementation=backend).eval()
    feats = make_features(LENGTHS, with_labels=True, seed=21)
    result = packed_eval_loss(model, feats, max_length=32, batch_size=4, trained_logits_only=trained_logits_only)
    with torch.no_grad():
        for i, f in enumerate(feats):
            labels = torch.tensor([f["labels"]])
            if (labels[0, 1:] != -100).sum() == 0:
                assert np.isnan(result.per_example[i]) and result.tokens[i] == 0
                continue
            alone = model(input_ids=torch.tensor([f["input_ids"]]), labels=labels, use_cache=False).loss
            assert abs(result.per_example[i] - alone.item()) <= 1e-5 * alone.item()
        padded = PaddingCollator()(feats)
        total = model_loss(model, padded, step_num_items([padded])).item()
    assert abs(result.total - total) <= 1e-5 * total
    assert result.tokens.sum() == step_num_items([padded]).item()


def test_bad_input():
    model = build_model("tiny-gpt2").eval()
    with pytest.raises(ValueError, match="never cuts an example"):
        packed_eval_loss(model, make_features([40, 3]), max_length=16)
    with pytest.raises(ValueError, match="features is empty"):
        packed_eval_loss(model, [])
    with pytest.raises(ValueError, match="no example has a trained token"):
        packed_eval_loss(model, [{"input_ids": [1, 2], "labels": [-100, -100]}])


def test_exported():
    assert padless.packed_eval_loss is packed_eval_loss
