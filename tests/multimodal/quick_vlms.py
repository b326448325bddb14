"""Tiny vision-language models for the quick multimodal sweep, and their documents as each model's
processor gives them for one document (text, image placeholder tokens, pixel values of images of
different sizes), so that a packed row can be compared with each document run alone.

One builder per family: ``(model, documents)``; the model fp32, random, seeded; the documents hold 0,
1 and 2 images of different sizes (where the family allows varied sizes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import transformers as T

V, IMAGE, START, END = 300, 250, 251, 252
TEXT = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512)  # fmt: skip
MROPE = {"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0}


def _words(g: torch.Generator, n: int) -> list[int]:
    return torch.randint(3, 200, (n,), generator=g).tolist()


def _qwen_docs(patch: int, images: list[list[tuple[int, int, int]]]) -> list[dict[str, Any]]:
    docs = []
    for seed, grids in enumerate(images):
        g = torch.Generator().manual_seed(seed)
        ids, pixels = _words(g, 5), []
        for t, h, w in grids:
            ids += [START] + [IMAGE] * (t * h * w // 4) + [END] + _words(g, 3)
            pixels.append(torch.randn(t * h * w, 3 * 2 * patch * patch, generator=g))
        doc = {"input_ids": ids, "labels": [-100 if i == IMAGE else i for i in ids]}
        if grids:
            doc.update(pixel_values=torch.cat(pixels), image_grid_thw=torch.tensor(grids),
                       mm_token_type_ids=[int(i == IMAGE) for i in ids])  # fmt: skip
        docs.append(doc)
    return docs


QWEN_IMAGES = [[], [(1, 4, 4)], [(1, 4, 6), (1, 2, 2)], [(1, 2, 4)]]


def qwen2_vl(attn: str) -> tuple[Any, list[dict]]:
    vision = dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2, in_chans=3)  # fmt: skip
    config = T.Qwen2VLConfig(text_config={**TEXT, "rope_parameters": MROPE}, vision_config=vision, image_token_id=IMAGE,
                             vision_start_token_id=START, vision_end_token_id=END, video_token_id=253)  # fmt: skip
    return _build(T.Qwen2VLForConditionalGeneration, config, attn), _qwen_docs(14, QWEN_IMAGES)


def qwen2_5_vl(attn: str) -> tuple[Any, list[dict]]:
    vision = dict(depth=1, hidden_size=32, out_hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3, window_size=56, fullatt_block_indexes=[0])  # fmt: skip
    config = T.Qwen2_5_VLConfig(text_config={**TEXT, "head_dim": 8, "rope_parameters": MROPE}, vision_config=vision,
                                image_token_id=IMAGE, vision_start_token_id=START, vision_end_token_id=END,
                                video_token_id=253)  # fmt: skip
    return _build(T.Qwen2_5_VLForConditionalGeneration, config, attn), _qwen_docs(14, QWEN_IMAGES)


def qwen3_vl(attn: str) -> tuple[Any, list[dict]]:
    vision = dict(depth=2, hidden_size=32, out_hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3, num_position_embeddings=64,
                  deepstack_visual_indexes=[1])  # fmt: skip
    text = {**TEXT, "head_dim": 8, "rope_parameters": {**MROPE, "mrope_interleaved": True}}
    config = T.Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE, vision_start_token_id=START,
                             vision_end_token_id=END, video_token_id=253)  # fmt: skip
    return _build(T.Qwen3VLForConditionalGeneration, config, attn), _qwen_docs(14, QWEN_IMAGES)


def qwen3_5(attn: str) -> tuple[Any, list[dict]]:
    """Hybrid plus vision: gated DeltaNet layers beside full attention, Qwen3-VL's vision tower."""
    text = {**TEXT, "head_dim": 8, "layer_types": ["linear_attention", "full_attention"], "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "rope_parameters": {**MROPE, "mrope_interleaved": True, "partial_rotary_factor": 1.0}}  # fmt: skip
    vision = dict(depth=1, hidden_size=32, out_hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3, num_position_embeddings=64)  # fmt: skip
    config = T.Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=IMAGE, vision_start_token_id=START,
                             vision_end_token_id=END, video_token_id=253)  # fmt: skip
    return _build(T.Qwen3_5ForConditionalGeneration, config, attn), _qwen_docs(14, QWEN_IMAGES)


def _fixed_docs(tokens: int, pixels: Callable[[int, torch.Generator], dict], per_token: str | None) -> list[dict]:
    docs = []
    for seed, k in enumerate([0, 1, 2, 1]):
        g = torch.Generator().manual_seed(seed)
        ids = _words(g, 4)
        for _ in range(k):
            ids += [START] + [IMAGE] * tokens + [END] + _words(g, 3)
        doc = {"input_ids": ids, "labels": [-100 if i == IMAGE else i for i in ids]}
        if k:
            doc.update(pixels(k, g))
            if per_token:
                doc[per_token] = [int(i == IMAGE) for i in ids]
        docs.append(doc)
    return docs


def gemma3(attn: str) -> tuple[Any, list[dict]]:
    text = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, sliding_window=8, max_position_embeddings=256,
                layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=7
    )
    config = T.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=IMAGE,
                            boi_token_index=START, eoi_token_index=END)  # fmt: skip
    pixels = lambda k, g: {"pixel_values": torch.randn(k, 3, 28, 28, generator=g)}  # noqa: E731
    return _build(T.Gemma3ForConditionalGeneration, config, attn), _fixed_docs(4, pixels, "token_type_ids")


def llava(attn: str) -> tuple[Any, list[dict]]:
    vision = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, image_size=28, patch_size=7, projection_dim=32)  # fmt: skip
    config = T.LlavaConfig(text_config={"model_type": "llama", **TEXT}, vision_config=vision, image_token_index=IMAGE,
                           image_seq_length=16, vision_feature_layer=-1, vision_feature_select_strategy="default")  # fmt: skip
    pixels = lambda k, g: {"pixel_values": torch.randn(k, 3, 28, 28, generator=g)}  # noqa: E731
    return _build(T.LlavaForConditionalGeneration, config, attn), _fixed_docs(16, pixels, None)


def _idefics_pixels(k: int, g: torch.Generator) -> dict:
    return {"pixel_values": torch.randn(1, k, 3, 28, 28, generator=g),
            "pixel_attention_mask": torch.ones(1, k, 28, 28, dtype=torch.bool)}  # fmt: skip


def idefics3(attn: str) -> tuple[Any, list[dict]]:
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=7
    )
    config = T.Idefics3Config(text_config={"model_type": "llama", **TEXT}, vision_config=vision, image_token_id=IMAGE,
                              scale_factor=2)  # fmt: skip
    return _build(T.Idefics3ForConditionalGeneration, config, attn), _fixed_docs(4, _idefics_pixels, None)


def smolvlm(attn: str) -> tuple[Any, list[dict]]:
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=7
    )
    config = T.SmolVLMConfig(text_config={"model_type": "llama", **TEXT}, vision_config=vision, image_token_id=IMAGE,
                             scale_factor=2)  # fmt: skip
    return _build(T.SmolVLMForConditionalGeneration, config, attn), _fixed_docs(4, _idefics_pixels, None)


def alone_inputs(doc: dict[str, Any]) -> dict[str, Any]:
    """One document's model inputs, run alone: its lists as ``[1, n]`` tensors, no labels."""
    return {k: torch.tensor(v)[None] if isinstance(v, list) else v for k, v in doc.items() if k != "labels"}


def document_loss(logits: torch.Tensor, labels: Any) -> torch.Tensor:
    """Summed next-token cross-entropy of one document's ``[n, V]`` logits."""
    return torch.nn.functional.cross_entropy(
        logits[:-1], torch.as_tensor(labels)[1:], ignore_index=-100, reduction="sum"
    )


def gradients(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _build(cls: type, config: Any, attn: str) -> Any:
    torch.manual_seed(0)
    config._attn_implementation = attn
    return cls(config).eval()


QUICK: dict[str, Callable[[str], tuple[Any, list[dict]]]] = {
    "qwen2_vl": qwen2_vl, "qwen2_5_vl": qwen2_5_vl, "qwen3_vl": qwen3_vl, "qwen3_5": qwen3_5, "gemma3": gemma3, "llava": llava,
    "idefics3": idefics3, "smolvlm": smolvlm,
}  # fmt: skip
"""Model type -> builder: the quick subset CI runs."""
