"""LLaVA-NeXT's any-resolution images (``pixel_values [images, tiles, C, H, W]`` with ``image_sizes``)
are image-major, not per-sample like Idefics3's ``[1, images, C, H, W]``: the padding collator and
the paths that pack rows beforehand (``pack_dataset``) stack them on the image axis, and the rows equal
each document alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wide_vlms import WIDE  # noqa: E402

from padless.batching.collate import PackingCollator, PaddingCollator  # noqa: E402
from padless.integrations.datasets import pack_dataset  # noqa: E402


def _alone(model, doc):
    inputs = {k: (torch.tensor(v)[None] if isinstance(v, list) else v) for k, v in doc.items() if k != "labels"}
    with torch.no_grad():
        return model(**inputs).logits[0]


@pytest.fixture(scope="module")
def llava_next():
    model, docs = WIDE["llava_next"]("sdpa")
    assert docs[2]["pixel_values"].dim() == 5 and docs[2]["pixel_values"].shape[0] == 2, "two images, tiles each"
    return model, docs, [_alone(model, d) for d in docs]


def test_the_padding_collator_stacks_anyres_images_per_image(llava_next):
    model, docs, alone = llava_next
    batch = PaddingCollator()(docs)
    assert batch["pixel_values"].shape[0] == sum(d["pixel_values"].shape[0] for d in docs if "pixel_values" in d)
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    for i, doc in enumerate(docs):
        n = len(doc["input_ids"])
        torch.testing.assert_close(logits[i, :n], alone[i], rtol=0, atol=1e-5)


def test_rows_packed_beforehand_carry_anyres_images_per_image(llava_next):
    model, docs, alone = llava_next
    rows = [{k: v.tolist() if torch.is_tensor(v) else v for k, v in d.items()} for d in docs]
    keys = list(dict.fromkeys(k for r in rows for k in r))
    packed = pack_dataset(
        Dataset.from_dict({k: [r.get(k) for r in rows] for k in keys}), 2 * max(len(r["input_ids"]) for r in rows)
    )
    assert packed.num_rows < len(docs)
    features = [packed[i] for i in range(packed.num_rows)]
    batch = PackingCollator.for_model(model, max_length=max(len(f["input_ids"]) for f in features))(features)
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    seen = 0
    for r, row in enumerate(features):
        offset = 0
        for n in row["seq_lengths"]:
            i = next(j for j, d in enumerate(docs) if d["input_ids"] == row["input_ids"][offset : offset + n])
            torch.testing.assert_close(logits[r, offset : offset + n], alone[i], rtol=0, atol=1e-5)
            offset, seen = offset + n, seen + 1
    assert seen == len(docs)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_a_wrappers_language_model_keeps_its_sliding_window(backend):
    """Mistral3 around a Mistral text model with sliding_window=6, documents longer than the window: the
    rule reads the window from the language model's own module (not the wrapper's), the 4D mask carries
    it, and packed rows equal each document alone (the window dropped mixed them by 2.7e-1)."""
    import transformers as T

    from padless.attention.rules import attention_rules

    model, docs = WIDE["mistral3"](backend)
    config = model.config
    config.text_config.sliding_window = 6
    windowed = T.Mistral3ForConditionalGeneration(config).eval()
    windowed.load_state_dict(model.state_dict())
    assert set(attention_rules(windowed).windows.values()) == {6}
    assert set(attention_rules(config).windows.values()) == {6}, "the config alone reads the same"
    alone = [_alone(windowed, d) for d in docs]
    batch = PackingCollator.for_model(windowed, max_length=2 * max(len(d["input_ids"]) for d in docs))(docs)
    with torch.no_grad():
        logits = windowed(**{k: v for k, v in batch.items() if k != "labels"}).logits
    for i, doc in enumerate(docs):
        ((_, r, o, n),) = batch.placements.of_feature(i)
        torch.testing.assert_close(logits[r, o : o + n], alone[i], rtol=0, atol=1e-5)
