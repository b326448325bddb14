"""A model padless has touched runs its own code where no packed documents are sent: after
``PackingCollator.for_model`` (which patches a hybrid's token mixers and hooks its forward), a plain
forward with the default cache and a greedy ``generate`` give bit-identical outputs to the same model
before, for every hybrid family padless packs and every vision-language family it packs with images
(documents with images included, Qwen's 3-D rope positions and all). Packed batches, sent their
boundaries, are the only forwards that change course."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch
from test_mixers import CONFIGS, NO_ATTENTION, VOCAB, build

import padless
from padless.attention import multimodal
from padless.attention.select import use_backend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multimodal"))  # the builders beside their sweep
import quick_vlms  # noqa: E402
import wide_vlms  # noqa: E402

GENERATE = dict(max_new_tokens=4, do_sample=False)
HYBRIDS = [f for f in CONFIGS if f not in NO_ATTENTION]


NO_GENERATE = {"xlstm"}
"""transformers' own xLSTM fails on the CPU with its cache (``generate``, the default forward: its
chunkwise kernel's state shapes), before padless touches it: its plain forward without one is compared."""


def _outputs(model, inputs: dict, generate: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A plain forward (the default ``use_cache``) and a greedy ``generate`` of ``inputs``."""
    with torch.no_grad():
        logits = model(**inputs).logits
        generated = model.generate(**inputs, **GENERATE, pad_token_id=0) if generate else None
    return logits, generated


def _assert_untouched(model, inputs: dict, max_length: int, generate: bool = True) -> None:
    before = _outputs(model, inputs, generate)
    padless.PackingCollator.for_model(model, max_length=max_length)
    after = _outputs(model, inputs, generate)
    assert torch.equal(after[0], before[0]), "plain forward changed after for_model"
    assert not generate or torch.equal(after[1], before[1]), "generate changed after for_model"


@pytest.mark.parametrize("family", HYBRIDS + sorted(NO_ATTENTION))
def test_hybrid_forward_and_generate_are_untouched(family):
    model = build(family, None if family in NO_ATTENTION else "sdpa")
    ids = torch.randint(3, VOCAB, (2, 11), generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # one row left-padded, as generation batches are
    if family in NO_GENERATE:
        _assert_untouched(model, {"input_ids": ids[:1], "use_cache": False}, max_length=32, generate=False)
        return
    _assert_untouched(model, {"input_ids": ids[:1]}, max_length=32)
    _assert_untouched(model, {"input_ids": ids, "attention_mask": mask}, max_length=32)


def _image_document(builder) -> tuple[object, dict]:
    model, docs = builder("sdpa")
    doc = next(d for d in docs if any(k in d for k in ("pixel_values", "pixel_values_videos")))
    return model, quick_vlms.alone_inputs(doc)


VLMS = sorted(set(quick_vlms.QUICK) | (set(wide_vlms.WIDE) & set(multimodal.FAMILIES)))


@pytest.mark.parametrize("family", VLMS)
def test_vision_language_forward_and_generate_are_untouched(family):
    builders = {**quick_vlms.QUICK, **wide_vlms.WIDE}
    model, inputs = _image_document(builders[family])
    _assert_untouched(model, inputs, max_length=inputs["input_ids"].shape[1] + 8)


@pytest.mark.parametrize("family", ["lfm2"])
def test_padless_backend_generates_like_sdpa(family):
    """The padless backend on a hybrid: a left-padded ``generate`` runs transformers' own sdpa masks
    and attention, token for token what the sdpa model generates."""
    reference = build(family, "sdpa")
    model = build(family, "sdpa")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.set_attn_implementation(use_backend("padless"))
    padless.PackingCollator.for_model(model, max_length=32)
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    with torch.no_grad():
        got = model.generate(input_ids=ids, attention_mask=mask, **GENERATE, pad_token_id=0)
        want = reference.generate(input_ids=ids, attention_mask=mask, **GENERATE, pad_token_id=0)
    assert torch.equal(got, want)
