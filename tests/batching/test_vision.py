"""Images travel with their documents (padless.batching.vision): packed image-text documents give
the logits and gradients of each document alone, and every input that cannot be packed exactly is
refused naming the feature and the field. Tiny Qwen2-VL (3-D rope index per document) and Gemma 3
(image tokens attending both ways, inside a sliding window); the other families: tests/multimodal."""

import warnings

import pytest
import torch
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)

from padless.attention import multimodal
from padless.attention.accept import check_batch
from padless.attention.select import use_backend
from padless.batching.collate import PackingCollator, PaddingCollator
from padless.batching.preference import PreferenceCollator

V, IMAGE = 300, 250


def _qwen2_vl(attn: str = "sdpa") -> Qwen2VLForConditionalGeneration:
    torch.manual_seed(0)
    text = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0})  # fmt: skip
    vision = dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2, in_chans=3)  # fmt: skip
    config = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE, vision_start_token_id=251,
                           vision_end_token_id=252, video_token_id=253, bos_token_id=1, eos_token_id=2)  # fmt: skip
    config._attn_implementation = attn
    return Qwen2VLForConditionalGeneration(config).eval()


def _gemma3() -> Gemma3ForConditionalGeneration:
    torch.manual_seed(0)
    text = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, sliding_window=8, max_position_embeddings=256,
                layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=7
    )
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=IMAGE,
                          boi_token_index=251, eoi_token_index=252)  # fmt: skip
    config._attn_implementation = "sdpa"
    return Gemma3ForConditionalGeneration(config).eval()


def _qwen_doc(grids, seed):
    """One document as Qwen2-VL's processor gives it: text, then per image its placeholder tokens
    (t*h*w / 4 after the 2x2 merge) between vision start / end, pixel patches and the grid."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 200, (5,), generator=g).tolist()
    pixels = []
    for t, h, w in grids:
        ids += [251] + [IMAGE] * (t * h * w // 4) + [252] + torch.randint(3, 200, (3,), generator=g).tolist()
        pixels.append(torch.randn(t * h * w, 3 * 2 * 14 * 14, generator=g))
    labels = [-100 if i == IMAGE else i for i in ids]
    feature = {"input_ids": ids, "labels": labels}
    if grids:
        feature.update(pixel_values=torch.cat(pixels), image_grid_thw=torch.tensor(grids),
                       mm_token_type_ids=[int(i == IMAGE) for i in ids])  # fmt: skip
    return feature


def _gemma_doc(images, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 200, (4,), generator=g).tolist()
    for _ in range(images):
        ids += [251] + [IMAGE] * 4 + [252] + torch.randint(3, 200, (3,), generator=g).tolist()
    feature = {"input_ids": ids, "labels": [-100 if i == IMAGE else i for i in ids]}
    if images:
        feature.update(
            pixel_values=torch.randn(images, 3, 28, 28, generator=g), token_type_ids=[int(i == IMAGE) for i in ids]
        )
    return feature


QWEN_DOCS = [[], [(1, 4, 4)], [(1, 4, 6), (1, 2, 2)], [(1, 2, 4)]]


def _inputs(feature):
    return {k: torch.tensor(v)[None] if isinstance(v, list) else v for k, v in feature.items() if k != "labels"}


def _loss(logits, labels):
    """Summed next-token cross-entropy of one document (its labels unshifted, as transformers takes them)."""
    return torch.nn.functional.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="sum")


def _alone(model, docs):
    """Each document alone: its logits, and the gradients of the summed losses."""
    model.zero_grad()
    outs = []
    for f in docs:
        logits = model(**_inputs(f)).logits[0]
        _loss(logits, torch.tensor(f["labels"])).backward()
        outs.append(logits.detach())
    return outs, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _packed(model, batch, docs):
    model.zero_grad()
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    outs, total = [], 0
    for i, f in enumerate(docs):
        ((_, r, o, n),) = batch.placements.of_feature(i)
        outs.append(logits[r, o : o + n].detach())
        total = total + _loss(logits[r, o : o + n], torch.tensor(f["labels"]))
    total.backward()
    return outs, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(alone, packed):
    for a, p in zip(alone[0], packed[0]):
        torch.testing.assert_close(p, a, rtol=0, atol=1e-5)
    assert alone[1].keys() == packed[1].keys()
    assert any(k.startswith("model.visual") for k in packed[1]), "the vision tower must get gradients"
    for name, grad in alone[1].items():
        torch.testing.assert_close(packed[1][name], grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("attn, max_length", [("sdpa", 30), ("sdpa", None), ("padless", 30), ("eager", 40)])
def test_qwen2_vl_packed_images_equal_each_document_alone(attn, max_length):
    """Images of different sizes, 0-2 per document, rows of several documents: logits at every
    position and the gradients of every parameter (vision tower and merger included) equal each
    document run alone; the positions are each document's own 3-D rope index, restarting per document."""
    model = _qwen2_vl()
    docs = [_qwen_doc(g, i) for i, g in enumerate(QWEN_DOCS)]
    alone = _alone(model, docs)
    model.set_attn_implementation(use_backend(attn))
    collator = PackingCollator.for_model(model, max_length=max_length)
    batch = collator(docs)
    assert batch["position_ids"].shape[0] == 4 and batch["image_grid_thw"].shape == (4, 3)
    assert collator.totals["images"] == 4
    check_batch(model, batch)
    _assert_same(alone, _packed(model, batch, docs))


def test_gemma3_image_tokens_attend_both_ways_inside_their_image_only():
    """Gemma 3's image tokens see each other both ways (inside the sliding window of its local layers);
    the packed 4D masks carry those blocks inside each document, so packed rows equal each document alone,
    and a mask without the blocks is refused by check_batch (and would differ)."""
    model = _gemma3()
    docs = [_gemma_doc(k, i) for i, k in enumerate([0, 1, 2, 1])]
    alone = _alone(model, docs)
    batch = PackingCollator.for_model(model, max_length=30)(docs)
    check_batch(model, batch)
    packed = _packed(model, batch, docs)
    for a, p in zip(alone[0], packed[0]):
        torch.testing.assert_close(p, a, rtol=0, atol=1e-5)
    for name, grad in alone[1].items():
        torch.testing.assert_close(packed[1][name], grad, rtol=1e-4, atol=1e-5, msg=name)
    causal_only = dict(batch)
    plain = PackingCollator.for_model(_gemma3(), max_length=30)([{"input_ids": f["input_ids"]} for f in docs])
    causal_only["attention_mask"] = plain["attention_mask"]
    with pytest.raises(ValueError, match="each image's tokens attending to each other"):
        check_batch(model, causal_only)
    with torch.no_grad():
        wrong = model(**{k: v for k, v in causal_only.items() if k != "labels"}).logits
    ((_, r, o, n),) = batch.placements.of_feature(2)
    assert (wrong[r, o : o + n] - alone[0][2]).abs().max() > 1e-4  # the blocks matter


def test_padding_collator_carries_images_with_their_rows():
    model = _qwen2_vl()
    docs = [_qwen_doc(g, i) for i, g in enumerate(QWEN_DOCS)]
    alone = _alone(model, docs)[0]
    batch = PaddingCollator()(docs)
    assert batch["mm_token_type_ids"].shape == batch["input_ids"].shape
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    for i, f in enumerate(docs):
        torch.testing.assert_close(logits[i, : len(f["input_ids"])], alone[i], rtol=0, atol=1e-5)


def test_overlong_documents_with_images_are_placed_whole_or_dropped_with_their_images():
    model = _qwen2_vl()
    docs = [_qwen_doc(g, i) for i, g in enumerate(QWEN_DOCS)]  # lengths 5, 14, 22, 12
    with pytest.raises(ValueError, match=r"feature 2 holds 2 image\(s\) and 22 tokens.*would cut its images"):
        PackingCollator.for_model(model, max_length=20, overlong="truncate")(docs)
    with pytest.raises(ValueError, match=r"feature 2 holds 2 image\(s\).*would cut"):
        PackingCollator.for_model(model, max_length=20, overlong="split")(docs)
    collator = PackingCollator.for_model(model, max_length=20, overlong="drop")
    batch = collator(docs)
    assert collator.totals["dropped_images"] == 2 and collator.totals["images"] == 2
    assert batch["image_grid_thw"].tolist() == [[1, 4, 4], [1, 2, 4]] or batch["image_grid_thw"].tolist() == [
        [1, 2, 4],
        [1, 4, 4],
    ]
    check_batch(model, batch)


def test_bad_image_inputs_name_the_feature_and_the_field():
    model = _qwen2_vl()
    collator = PackingCollator.for_model(model, max_length=64)
    good = _qwen_doc([(1, 4, 4)], 1)
    short = dict(good, input_ids=good["input_ids"][:8] + good["input_ids"][9:], labels=good["labels"][:8] + good["labels"][9:],
                 mm_token_type_ids=good["mm_token_type_ids"][:8] + good["mm_token_type_ids"][9:])  # fmt: skip
    with pytest.raises(ValueError, match=r"feature 1 has 3 image placeholder tokens \(id 250\) but its 1 image take 4"):
        collator([_qwen_doc([], 0), short])
    types_off = dict(good, mm_token_type_ids=[0] * len(good["input_ids"]))
    with pytest.raises(ValueError, match=r"feature 0's mm_token_type_ids mark 0 image tokens"):
        collator([types_off])
    no_types = {k: v for k, v in good.items() if k != "mm_token_type_ids"}
    with pytest.raises(ValueError, match=r"feature 0 carries images but no 'mm_token_type_ids'"):
        collator([no_types])
    with pytest.raises(ValueError, match=r"feature 0 carries 'image_sizes', which qwen2_vl packing does not read"):
        collator([dict(good, image_sizes=[[28, 28]])])
    with pytest.raises(
        ValueError, match=r"feature 0's 'mm_token_type_ids' marks image tokens, but it carries no images"
    ):
        collator([{k: v for k, v in good.items() if k not in ("pixel_values", "image_grid_thw")}])


def test_images_for_a_model_without_a_vision_tower_are_refused():
    config = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    config._attn_implementation = "sdpa"
    collator = PackingCollator.for_model(LlamaForCausalLM(config), max_length=64)
    with pytest.raises(ValueError, match=r"feature 0 carries image inputs .* no vision tower"):
        collator([_qwen_doc([(1, 2, 2)], 0)])


def test_a_family_padless_has_not_verified_is_refused_for_images_not_for_text(monkeypatch):
    model = _gemma3()
    monkeypatch.delitem(multimodal.FAMILIES, "gemma3")
    from padless.attention.facts import model_facts

    model_facts(model, refresh=True)
    collator = PackingCollator.for_model(model, max_length=30)
    assert collator.verdict.exact and "padless has not verified how 'gemma3'" in collator.verdict.images_reason
    collator([{"input_ids": [5, 6, 7]}])  # text-only rows: judged by the text rule
    with pytest.raises(ValueError, match=r"feature 0 carries image inputs.*not verified how 'gemma3'"):
        collator([_gemma_doc(1, 0)])


def test_image_blocks_need_a_4d_mask():
    model = _gemma3()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.set_attn_implementation(use_backend("padless"))
    collator = PackingCollator.for_model(model, max_length=30)
    assert "only a 4D mask carries" in collator.verdict.images_reason
    with pytest.raises(ValueError, match="attend to each other both ways, which only a 4D mask carries"):
        collator([_gemma_doc(1, 0)])


def test_check_batch_refuses_positions_that_are_not_each_documents_rope_index():
    model = _qwen2_vl()
    docs = [_qwen_doc(g, i) for i, g in enumerate(QWEN_DOCS)]
    batch = PackingCollator.for_model(model, max_length=30)(docs)
    flat = dict(batch, position_ids=batch["position_ids"][0])
    with pytest.raises(ValueError, match=r"position_ids \[4, R, L\].*shape \(2, 27\)"):
        check_batch(model, flat)
    same = batch["position_ids"].clone()
    same[1:] = same[0]
    with pytest.raises(ValueError, match="not each document's own rope index"):
        check_batch(model, dict(batch, position_ids=same))


def test_preference_collator_refuses_images_by_name():
    with pytest.raises(ValueError, match=r"carries image inputs \('pixel_values'.*this collator does not carry images"):
        PreferenceCollator(max_length=64)(
            [{"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4], "pixel_values": [[0.0]]}]
        )


def test_rows_packed_beforehand_carry_their_documents_images():
    """A dataset view of planned rows (what the trainers' samplers read) carries each document's images
    with it; the collator places the pre-packed rows as they are, positions per document."""
    from padless.batching.rows import PackedRowView

    model = _qwen2_vl()
    docs = [_qwen_doc(g, i) for i, g in enumerate(QWEN_DOCS)]
    alone = _alone(model, docs)[0]
    view = PackedRowView(docs)
    keys = [((2, 0, 22), (0, 0, 5)), ((1, 0, 14), (3, 0, 12))]
    rows = [view[k] for k in keys]
    assert rows[0]["image_grid_thw"].tolist() == [[1, 4, 6], [1, 2, 2]]
    batch = PackingCollator.for_model(model, max_length=27)(rows)
    check_batch(model, batch)
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    for r, key in enumerate(keys):
        offset = 0
        for i, _, n in key:
            torch.testing.assert_close(logits[r, offset : offset + n], alone[i], rtol=0, atol=1e-5)
            offset += n
    with pytest.raises(ValueError, match=r"sequence 2 holds images and was cut to tokens \[0, 10\) of 22"):
        view[((2, 0, 10),)]


def test_the_guard_reruns_text_documents_and_counts_the_image_ones():
    from padless.isolation.guard import IsolationGuard

    model = _qwen2_vl()
    docs = [_qwen_doc(g, i) for i, g in enumerate(QWEN_DOCS)]
    batch = PackingCollator.for_model(model, max_length=64)(docs)
    check = IsolationGuard(every=1, documents=4)(model, batch)
    assert check.passed and check.image_documents == 3
    assert [p[0] for p in check.pieces] == [0]  # the one text-only document


def test_verify_says_how_images_are_packed_or_why_not(monkeypatch):
    from padless.attention.facts import model_facts
    from padless.isolation.verify import model_summary

    model = _qwen2_vl()
    assert (
        "images: packed with their documents (qwen2_vl: a 3-D rope index per document)"
        in model_summary(model).describe()
    )
    model = _gemma3()
    assert "image tokens attending both ways" in model_summary(model).images
    monkeypatch.delitem(multimodal.FAMILIES, "gemma3")
    model_facts(model, refresh=True)
    assert model_summary(model).images.startswith("refused (padless has not verified how 'gemma3'")


def test_rows_bounded_by_image_patches_too():
    """max_image_patches: a second limit per row, so that one row does not collect every large image;
    every row holds at most that many vision-encoder patches and the batch stays exact."""
    from padless.batching.vision import image_patches

    model = _qwen2_vl()
    grids = [[(1, 4, 6)], [(1, 4, 6)], [(1, 4, 4)], [], [(1, 2, 2)], [(1, 4, 6)]]
    docs = [_qwen_doc(g, i) for i, g in enumerate(grids)]
    assert [image_patches(d) for d in docs] == [24, 24, 16, 0, 4, 24]
    alone = _alone(model, docs)[0]
    free = PackingCollator.for_model(model, max_length=64)(docs)
    bounded = PackingCollator.for_model(model, max_length=64, max_image_patches=28)(docs)

    def per_row(b):
        rows = range(b["input_ids"].shape[0])
        return [
            sum(image_patches(docs[i]) for i in set(b.placements.feature[b.placements.row == r].tolist())) for r in rows
        ]

    assert max(per_row(free)) > 28 and max(per_row(bounded)) <= 28
    check_batch(model, bounded)
    with torch.no_grad():
        logits = model(**{k: v for k, v in bounded.items() if k != "labels"}).logits
    for i in range(len(docs)):
        ((_, r, o, n),) = bounded.placements.of_feature(i)
        torch.testing.assert_close(logits[r, o : o + n], alone[i], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="max_image_patches bounds planned rows; it needs max_length"):
        PackingCollator.for_model(model, max_image_patches=28)
