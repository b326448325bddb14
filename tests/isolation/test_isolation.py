"""Packed logits equal unpacked logits, for every tiny model family and both transformers backends
padless packs for; and the traps of ../shared/ENVIRONMENT.md really are traps (so these checks can
fail)."""

import pytest
import torch

from conftest import make_features
from padless.batching.batch import forward_inputs
from padless.batching.collate import PackingCollator
from padless.models.factory import TINY_FAMILIES, build_model

LENGTHS = [6, 1, 11, 4, 9]


def _max_diff(model, batch, feats):
    """Largest |logit| difference between each sequence alone and its place in one packed row."""
    with torch.no_grad():
        packed = model(**forward_inputs(batch)).logits[0]
        worst, offset = 0.0, 0
        for f in feats:
            n = len(f["input_ids"])
            alone = model(input_ids=torch.tensor([f["input_ids"]]), use_cache=False).logits[0]
            worst = max(worst, (alone - packed[offset : offset + n]).abs().max().item())
            offset += n
    return worst


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("attention", ["mask4d", "position_ids"])
def test_packed_equals_unpacked(family, backend, attention):
    model = build_model(f"tiny-{family}", attn_implementation=backend).eval()
    feats = make_features(LENGTHS, seed=1)
    batch = PackingCollator(model_free=True, attention=attention, pad_to_multiple_of=8)(feats)
    assert _max_diff(model, batch, feats) < 1e-5


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_default_use_cache_contaminates_position_ids_only_rows(family):
    """Why the collator sends use_cache=False: with a cache, transformers skips packed-row detection."""
    model = build_model(f"tiny-{family}").eval()
    feats = make_features(LENGTHS, seed=1)
    batch = PackingCollator(model_free=True, attention="position_ids")(feats)
    assert _max_diff(model, batch, feats) < 1e-5
    assert _max_diff(model, {**batch, "use_cache": True}, feats) > 1e-2


def test_all_ones_2d_mask_contaminates():
    model = build_model("tiny-llama").eval()
    feats = make_features(LENGTHS, seed=1)
    batch = PackingCollator(model_free=True, attention="position_ids")(feats)
    ones = torch.ones_like(batch["input_ids"])
    assert _max_diff(model, {**batch, "attention_mask": ones}, feats) > 1e-2


def test_4d_bool_mask_is_ignored_by_eager():
    """Why padless sends a float additive mask, never a bool one."""
    model = build_model("tiny-llama", attn_implementation="eager").eval()
    feats = make_features(LENGTHS, seed=1)
    batch = PackingCollator(model_free=True, attention="mask4d")(feats)
    bool_mask = batch["attention_mask"] == 0
    assert _max_diff(model, batch, feats) < 1e-5
    assert _max_diff(model, {**batch, "attention_mask": bool_mask}, feats) > 1e-2
