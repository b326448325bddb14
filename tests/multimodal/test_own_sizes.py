"""Processor outputs as users have them: each document processed alone, so padded to its own images.

- LLaVA-NeXT's any-resolution images: ``pixel_values [images, tiles, C, H, W]`` padded with zero tiles
  to the document's most (the model keeps each image's first tiles, counted from ``image_sizes``);
- Pixtral's images (Mistral 3, and LLaVA around a Pixtral tower): ``pixel_values [images, C, H, W]``
  padded at the bottom and right to the document's largest (the tower keeps each image's
  ``image_sizes`` patches);
- GLM-4V's videos: frames holding the image token, typed 2 in ``mm_token_type_ids``, each document's
  3-D positions its own (``get_rope_index`` per document).

Documents of different sizes are re-padded to the batch's largest on the dims the model crops back,
as the processor pads a batch; packed rows equal each document run alone, logits at every position
and gradients of every parameter (vision tower included), fp32, 1e-5."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch
import transformers as T

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quick_vlms import END, IMAGE, MROPE, START, TEXT, _build, _words, alone_inputs, document_loss, gradients  # noqa: E402
from wide_vlms import CLIP, _tokens  # noqa: E402

from padless.attention.accept import check_batch  # noqa: E402
from padless.attention.select import use_backend  # noqa: E402
from padless.batching.collate import PackingCollator, PaddingCollator  # noqa: E402

ATOL = 1e-5
VSTART, VEND = 254, 255
PIXTRAL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, head_dim=16,
               image_size=28, patch_size=7)  # fmt: skip


def _built(builder, attn):
    """``builder``'s model on ``attn``; ``padless``: built on sdpa (which the documents alone run on), then
    swapped to padless attention for the packed rows."""
    return builder("sdpa" if attn == "padless" else attn)


def assert_packs_exactly(model, docs, max_length, attn="sdpa"):
    """Pack ``docs`` for ``model`` (on ``attn``: ``padless`` swaps to padless attention after the documents
    ran alone) and compare every document's logits and every gradient with the documents run alone;
    returns the batch."""
    model.zero_grad()
    alone = []
    for d in docs:
        logits = model(**alone_inputs(d)).logits[0]
        document_loss(logits, d["labels"]).backward()
        alone.append(logits.detach())
    want = gradients(model)
    if attn == "padless":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.set_attn_implementation(use_backend("padless"))
    batch = PackingCollator.for_model(model, max_length=max_length)(docs)
    check_batch(model, batch)
    assert batch["input_ids"].shape[0] < len(docs), "documents share rows"
    model.zero_grad()
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    total = 0
    for i, d in enumerate(docs):
        ((_, r, o, n),) = batch.placements.of_feature(i)
        torch.testing.assert_close(logits[r, o : o + n].detach(), alone[i], rtol=0, atol=ATOL)
        total = total + document_loss(logits[r, o : o + n], d["labels"])
    total.backward()
    got = gradients(model)
    assert got.keys() == want.keys() and any("vis" in n for n in got)
    scale = max(g.abs().max().item() for g in want.values())
    worst = max((got[n] - g).abs().max().item() for n, g in want.items()) / scale
    assert worst <= ATOL, worst
    return batch


def _documents(model, images, pad_dims):
    """One document per entry of ``images`` (a list of per-image tensors, each ``{"pixel_values": [1, ...],
    "image_sizes": [1, 2]}``): words, then each image's placeholders between start and end tokens; its
    ``pixel_values`` zero-padded at the end of ``pad_dims`` to the document's largest image, as its
    processor pads one call's images."""
    docs = []
    for seed, ims in enumerate(images):
        g = torch.Generator().manual_seed(seed)
        ids = _words(g, 4)
        for im in ims:
            ids += [START] + [IMAGE] * _tokens(model, im) + [END] + _words(g, 3)
        doc = {"input_ids": ids, "labels": [-100 if i == IMAGE else i for i in ids]}
        if ims:
            pixels = [im["pixel_values"] for im in ims]
            size = {d: max(p.shape[d] for p in pixels) for d in pad_dims}
            padded = []
            for p in pixels:
                pad = []
                for d in reversed(range(1, p.dim())):
                    pad += [0, size.get(d, p.shape[d]) - p.shape[d]]
                padded.append(torch.nn.functional.pad(p, pad))
            doc.update(pixel_values=torch.cat(padded), image_sizes=torch.cat([im["image_sizes"] for im in ims]))
        docs.append(doc)
    return docs


def llava_next(attn):
    """Grid pinpoints of 1 x 1, 1 x 2 and 2 x 2 tiles: images of 2, 3 and 5 tiles (the base image too)."""
    config = T.LlavaNextConfig(text_config={"model_type": "llama", **TEXT}, vision_config=CLIP, image_token_index=IMAGE,
                               image_grid_pinpoints=[[28, 28], [28, 56], [56, 56]], vision_feature_layer=-1,
                               vision_feature_select_strategy="default")  # fmt: skip
    model = _build(T.LlavaNextForConditionalGeneration, config, attn)

    def image(seed, size):
        tiles = T.models.llava_next.modeling_llava_next.image_size_to_num_patches(
            size, [[28, 28], [28, 56], [56, 56]], 28
        )
        g = torch.Generator().manual_seed(100 + seed)
        return {"pixel_values": torch.randn(1, tiles, 3, 28, 28, generator=g), "image_sizes": torch.tensor([size])}

    images = [[image(0, (56, 56))], [], [image(1, (20, 28)), image(2, (24, 50))], [image(3, (28, 28))]]
    docs = _documents(model, images, pad_dims=(1,))
    assert len({d["pixel_values"].shape[1] for d in docs if "pixel_values" in d}) == 3, "each its own tiles"
    return model, docs


def _pixtral_images(seed, sizes):
    g = torch.Generator().manual_seed(100 + seed)
    return [
        {"pixel_values": torch.randn(1, 3, h, w, generator=g), "image_sizes": torch.tensor([[h, w]])} for h, w in sizes
    ]


PIXTRAL_SIZES = [[(28, 14)], [], [(14, 28), (28, 14)], [(28, 28)], [(14, 28)]]


def mistral3(attn):
    config = T.Mistral3Config(text_config={"model_type": "mistral", **TEXT}, vision_config=PIXTRAL,
                              image_token_index=IMAGE, spatial_merge_size=2, vision_feature_layer=-1)  # fmt: skip
    model = _build(T.Mistral3ForConditionalGeneration, config, attn)
    return model, _documents(model, [_pixtral_images(i, s) for i, s in enumerate(PIXTRAL_SIZES)], pad_dims=(2, 3))


def llava_pixtral(attn):
    """A Pixtral checkpoint: LLaVA around a Pixtral tower, one token per patch."""
    config = T.LlavaConfig(text_config={"model_type": "mistral", **TEXT}, vision_config={"model_type": "pixtral", **PIXTRAL},
                           image_token_index=IMAGE, vision_feature_layer=-1, vision_feature_select_strategy="full")  # fmt: skip
    model = _build(T.LlavaForConditionalGeneration, config, attn)
    return model, _documents(model, [_pixtral_images(i, s) for i, s in enumerate(PIXTRAL_SIZES)], pad_dims=(2, 3))


BUILDERS = {"llava_next": llava_next, "mistral3": mistral3, "llava_pixtral": llava_pixtral}


def _shapes(docs):
    return {tuple(d["pixel_values"].shape[1:]) for d in docs if "pixel_values" in d}


@pytest.mark.parametrize("attn", ["sdpa", "eager", "padless"])
@pytest.mark.parametrize("family", list(BUILDERS))
def test_documents_padded_to_their_own_images_pack_exactly(family, attn):
    model, docs = _built(BUILDERS[family], attn)
    assert len(_shapes(docs)) > 1, "the documents differ in shape beyond the first dimension"
    batch = assert_packs_exactly(model, docs, 2 * max(len(d["input_ids"]) for d in docs), attn)
    assert batch["pixel_values"].shape[0] == sum(d["pixel_values"].shape[0] for d in docs if "pixel_values" in d)


@pytest.mark.parametrize("family", list(BUILDERS))
def test_the_padding_collator_repads_as_the_processor_pads_a_batch(family):
    model, docs = BUILDERS[family]("sdpa")
    batch = PaddingCollator()(docs)
    widest = max(max(d["pixel_values"].shape[k] for d in docs if "pixel_values" in d) for k in (1,))
    assert batch["pixel_values"].shape[1] == widest
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        for i, d in enumerate(docs):
            alone = model(**alone_inputs(d)).logits[0]
            torch.testing.assert_close(logits[i, : len(d["input_ids"])], alone, rtol=0, atol=ATOL)


@pytest.mark.parametrize("path", ["pack_dataset", "PackedRows", "PackedStream"])
@pytest.mark.parametrize("family", list(BUILDERS))
def test_rows_packed_beforehand_carry_documents_of_their_own_sizes(family, path):
    """``pack_dataset`` keeps a row's images as Arrow lists (images of different sizes stay ragged), and
    :class:`padless.PackedRows` and :class:`padless.PackedStream` concatenate its documents' tensors:
    both re-pad as the collator does, which re-pads across rows, and the rows equal each document alone."""
    from datasets import Dataset

    from padless.batching.rows import PackedRows
    from padless.batching.stream import PackedStream
    from padless.integrations.datasets import pack_dataset

    model, docs = BUILDERS[family]("sdpa")
    width = 2 * max(len(d["input_ids"]) for d in docs)
    if path == "pack_dataset":
        rows = [{k: v.tolist() if torch.is_tensor(v) else v for k, v in d.items()} for d in docs]
        keys = list(dict.fromkeys(k for r in rows for k in r))
        packed = pack_dataset(Dataset.from_dict({k: [r.get(k) for r in rows] for k in keys}), width)
    elif path == "PackedRows":
        packed = PackedRows(docs, width)
    else:
        packed = list(PackedStream(docs, width, buffer_size=len(docs)))
    features = [packed[i] for i in range(len(packed))]
    assert len(features) < len(docs)
    batch = PackingCollator.for_model(model, max_length=width)(features)
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        alone = [model(**alone_inputs(d)).logits[0] for d in docs]
    seen = 0
    for r, row in enumerate(features):
        ids, offset = list(row["input_ids"]), 0
        for n in row["seq_lengths"]:
            i = next(j for j, d in enumerate(docs) if d["input_ids"] == ids[offset : offset + n])
            torch.testing.assert_close(logits[r, offset : offset + n], alone[i], rtol=0, atol=ATOL)
            offset, seen = offset + n, seen + 1
    assert seen == len(docs)


def test_llava_next_tiles_of_another_size_are_still_refused():
    """Only the dims the model crops back are re-padded: tiles of another height differ in a dim it reads."""
    model, docs = llava_next("sdpa")
    docs[0]["pixel_values"] = torch.nn.functional.pad(docs[0]["pixel_values"], (0, 0, 0, 2))
    with pytest.raises(ValueError, match="differ in shape beyond the first dimension"):
        PackingCollator.for_model(model, max_length=200)(docs)


def glm4v(attn):
    vision = dict(depth=1, hidden_size=32, out_hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3, image_size=56)  # fmt: skip
    text = {**TEXT, "rope_parameters": {**MROPE, "partial_rotary_factor": 0.5, "mrope_section": [1, 1, 0]}}
    config = T.Glm4vConfig(text_config=text, vision_config=vision, image_token_id=IMAGE, video_token_id=253,
                           image_start_token_id=START, image_end_token_id=END, video_start_token_id=VSTART,
                           video_end_token_id=VEND)  # fmt: skip
    return _build(T.Glm4vForConditionalGeneration, config, attn)


def glm_doc(videos, seed, images=()):
    """As GLM-4V's processor gives one document: each video between its start and end tokens, each frame
    its image tokens (``h*w / 4``) between image start and end, then its timestamp; frames typed 2 in
    ``mm_token_type_ids``, images 1; ``video_grid_thw`` ``[frames, h, w]`` per video."""
    g = torch.Generator().manual_seed(seed)
    ids, types = _words(g, 5), []
    feature = {}
    types = [0] * len(ids)
    for kind, grids in ((1, images), (2, videos)):
        pixels = []
        for t, h, w in grids:
            run = [VSTART] if kind == 2 else []
            for frame in range(t if kind == 2 else 1):
                run += [START] + [IMAGE] * (h * w // 4) + [END] + ([10 + frame] if kind == 2 else [])
            run += [VEND] if kind == 2 else []
            run += _words(g, 3)
            ids += run
            types += [kind if i == IMAGE else 0 for i in run]
            pixels.append(torch.randn(t * h * w, 3 * 2 * 14 * 14, generator=g))
        if grids:
            name = "pixel_values" if kind == 1 else "pixel_values_videos"
            feature[name] = torch.cat(pixels)
            feature["image_grid_thw" if kind == 1 else "video_grid_thw"] = torch.tensor(grids)
    feature.update(input_ids=ids, labels=[-100 if i == IMAGE else i for i in ids])
    if images or videos:
        feature["mm_token_type_ids"] = types
    return feature


@pytest.mark.parametrize("attn", ["sdpa", "eager", "padless"])
def test_glm4v_documents_with_videos_pack_exactly(attn):
    model = _built(glm4v, attn)
    docs = [glm_doc([(2, 4, 4)], 0), glm_doc([], 1), glm_doc([(3, 2, 4), (1, 4, 2)], 2), glm_doc([(2, 2, 2)], 3)]
    batch = assert_packs_exactly(model, docs, 2 * max(len(d["input_ids"]) for d in docs), attn)
    assert int((batch["mm_token_type_ids"] == 2).sum()) == sum(
        t * h * w // 4 for t, h, w in [(2, 4, 4), (3, 2, 4), (1, 4, 2), (2, 2, 2)]
    )
    assert "pixel_values" not in batch


def test_glm4v_images_and_videos_share_no_forward():
    """GLM-4V reads image and video placeholders at one token: the model itself cannot take both in one
    forward, so a batch (or a document) holding both is refused, naming the features."""
    model = glm4v("sdpa")
    with pytest.raises(ValueError, match=r"features \[1\] hold images and features \[0\] videos"):
        PackingCollator.for_model(model, max_length=200)([glm_doc([(2, 2, 2)], 0), glm_doc([], 1, images=[(1, 2, 4)])])
    with pytest.raises(ValueError, match="feature 0 holds images and videos"):
        PackingCollator.for_model(model, max_length=200)([glm_doc([(2, 2, 2)], 0, images=[(1, 2, 4)])])
    with pytest.raises(Exception, match="do not match"):  # what the model says of such a document alone
        model(**alone_inputs(glm_doc([(2, 2, 2)], 0, images=[(1, 2, 4)])))
