"""Tiny vision-language models for the wide multimodal sweep (CI runs the ones the rule accepts,
``PADLESS_SWEEP=1`` the refused ones too), built like :mod:`quick_vlms`: ``builder(attn) -> (model, documents)``, the
model fp32, random, seeded; the documents hold 0, 1 and 2 images, each with as many placeholder
tokens as the model's own ``get_image_features`` returns features for it (so images of different
sizes take their own counts where the family allows varied sizes).

Not here: ``gemma3n`` and ``fast_vlm`` (their vision towers are timm models, ``timm_wrapper``, and
timm is not a dependency of padless or its tests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import transformers as T
from quick_vlms import END, IMAGE, MROPE, START, TEXT, V, _build, _qwen_docs, _words

Image = Callable[[torch.Generator, int], dict[str, torch.Tensor]]
"""``(generator, index) -> one image's processor tensors`` (image-major: a leading dim of 1)."""

CLIP = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, image_size=28, patch_size=7, projection_dim=32)  # fmt: skip
SIGLIP = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
              num_attention_heads=2, image_size=28, patch_size=7)  # fmt: skip


def _tokens(model: Any, image: dict[str, torch.Tensor]) -> int:
    """The features the model scatters into placeholder tokens for one image alone."""
    with torch.no_grad():
        out = model.model.get_image_features(**image)
    feats = getattr(out, "pooler_output", out)
    if isinstance(feats, (list, tuple)):
        feats = torch.cat([f.reshape(-1, f.shape[-1]) for f in feats])
    return feats.reshape(-1, feats.shape[-1]).shape[0]


def _docs(model: Any, image: Image, per_token: str | None = None, image_dim: int = 0, prefix: bool = False,
          extra: Callable[[int], dict] | None = None, counts: tuple[int, ...] = (0, 1, 2, 1)) -> list[dict]:  # fmt: skip
    """Documents of ``counts`` images each; ``prefix``: PaliGemma's layout (the images, then the prompt,
    then the suffix, ``token_type_ids`` 0 over the prefix and 1 over the suffix, which alone is
    trained); else ``START, IMAGE * n, END`` after some words, ``per_token`` marking the image tokens.
    ``extra(k)``: per-document keys the processor adds for ``k`` images."""
    docs = []
    for seed, k in enumerate(counts):
        g = torch.Generator().manual_seed(seed)
        images = [image(g, j) for j in range(k)]
        sizes = [_tokens(model, {**im, **(extra(k) if extra else {})}) for im in images]
        if prefix:
            head = [IMAGE] * sum(sizes) + [2] + _words(g, 4) + [108]
            tail = _words(g, 4) + [1]
            ids = head + tail
            doc = {"input_ids": ids, "labels": [-100] * len(head) + tail}
        else:
            ids = _words(g, 4)
            for n in sizes:
                ids += [START] + [IMAGE] * n + [END] + _words(g, 3)
            doc = {"input_ids": ids, "labels": [-100 if i == IMAGE else i for i in ids]}
        if k:
            doc.update({key: torch.cat([im[key] for im in images], dim=image_dim) for key in images[0]})
            if per_token == "token_type_ids" and prefix:
                doc[per_token] = [0] * len(head) + [1] * len(tail)
            elif per_token:
                doc[per_token] = [int(i == IMAGE) for i in ids]
            if extra is not None:
                doc.update(extra(k))
        docs.append(doc)
    return docs


def _anyres(sizes: list[tuple[int, int]], patches: int) -> Image:
    """LLaVA-NeXT's inputs: ``patches`` crops of 28 x 28 per image (the base image and its grid, one
    grid here so every image has as many), and the image's original size, which decides how many of
    its grid features survive unpadding."""
    return lambda g, j: {"pixel_values": torch.randn(1, patches, 3, 28, 28, generator=g),
                         "image_sizes": torch.tensor([sizes[j % len(sizes)]])}  # fmt: skip


def llava_next(attn: str) -> tuple[Any, list[dict]]:
    config = T.LlavaNextConfig(text_config={"model_type": "llama", **TEXT}, vision_config=CLIP, image_token_index=IMAGE,
                               image_grid_pinpoints=[[28, 28]], vision_feature_layer=-1,
                               vision_feature_select_strategy="default")  # fmt: skip
    model = _build(T.LlavaNextForConditionalGeneration, config, attn)
    return model, _docs(model, _anyres([(28, 28), (20, 28), (28, 14)], 2))


def llava_next_video(attn: str) -> tuple[Any, list[dict]]:
    config = T.LlavaNextVideoConfig(text_config={"model_type": "llama", **TEXT}, vision_config=CLIP,
                                    image_token_index=IMAGE, video_token_index=253, image_grid_pinpoints=[[28, 28]],
                                    vision_feature_layer=-1, vision_feature_select_strategy="default",
                                    spatial_pool_stride=2)  # fmt: skip
    model = _build(T.LlavaNextVideoForConditionalGeneration, config, attn)
    return model, _docs(model, _anyres([(28, 28), (20, 28), (28, 14)], 2))


def llava_onevision(attn: str) -> tuple[Any, list[dict]]:
    """As its processor gives them: ``batch_num_images`` per document (several images: base features only)."""
    config = T.LlavaOnevisionConfig(text_config={"model_type": "qwen2", **TEXT}, vision_config=SIGLIP,
                                    image_token_index=IMAGE, video_token_index=253, image_grid_pinpoints=[[28, 28]],
                                    vision_feature_layer=-1, vision_feature_select_strategy="full",
                                    vision_aspect_ratio="anyres_max_9")  # fmt: skip
    model = _build(T.LlavaOnevisionForConditionalGeneration, config, attn)
    image = _anyres([(28, 28), (20, 28), (28, 14)], 2)
    return model, _docs(model, image, extra=lambda k: {"batch_num_images": torch.tensor([k])})


def mistral3(attn: str) -> tuple[Any, list[dict]]:
    """Pixtral's tower on images padded to 28 x 28, ``image_sizes`` their own size (fewer patches)."""
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, head_dim=16,
                  image_size=28, patch_size=7)  # fmt: skip
    config = T.Mistral3Config(text_config={"model_type": "mistral", **TEXT}, vision_config=vision,
                              image_token_index=IMAGE, spatial_merge_size=2, vision_feature_layer=-1)  # fmt: skip
    model = _build(T.Mistral3ForConditionalGeneration, config, attn)
    sizes = [(28, 28), (14, 28), (28, 14)]
    image = lambda g, j: {"pixel_values": torch.randn(1, 3, 28, 28, generator=g),  # noqa: E731
                          "image_sizes": torch.tensor([sizes[j % 3]])}  # fmt: skip
    return model, _docs(model, image)


def aya_vision(attn: str) -> tuple[Any, list[dict]]:
    text = {**TEXT, "model_type": "cohere2", "head_dim": 8, "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"]}  # fmt: skip
    config = T.AyaVisionConfig(text_config=text, vision_config=SIGLIP, image_token_index=IMAGE, downsample_factor=2)
    model = _build(T.AyaVisionForConditionalGeneration, config, attn)
    return model, _docs(model, lambda g, j: {"pixel_values": torch.randn(1, 3, 28, 28, generator=g)})


def internvl(attn: str) -> tuple[Any, list[dict]]:
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=[28, 28],
                  patch_size=[7, 7])  # fmt: skip
    config = T.InternVLConfig(text_config={"model_type": "qwen2", **TEXT}, vision_config=vision, image_token_id=IMAGE,
                              image_seq_length=4, downsample_ratio=0.5)  # fmt: skip
    model = _build(T.InternVLForConditionalGeneration, config, attn)
    return model, _docs(model, lambda g, j: {"pixel_values": torch.randn(1, 3, 28, 28, generator=g)})


def got_ocr2(attn: str) -> tuple[Any, list[dict]]:
    vision = dict(hidden_size=32, output_channels=16, num_hidden_layers=2, num_attention_heads=2, image_size=64,
                  patch_size=8, window_size=4, global_attn_indexes=[1], mlp_dim=64)  # fmt: skip
    config = T.GotOcr2Config(text_config={"model_type": "qwen2", **TEXT}, vision_config=vision, image_token_index=IMAGE,
                             image_seq_length=4)  # fmt: skip
    model = _build(T.GotOcr2ForConditionalGeneration, config, attn)
    return model, _docs(model, lambda g, j: {"pixel_values": torch.randn(1, 3, 64, 64, generator=g)})


def idefics2(attn: str) -> tuple[Any, list[dict]]:
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=7)  # fmt: skip
    perceiver = dict(hidden_size=32, resampler_n_latents=4, resampler_depth=1, resampler_n_heads=2,
                     resampler_head_dim=16, num_key_value_heads=1)  # fmt: skip
    config = T.Idefics2Config(text_config={"model_type": "mistral", **TEXT}, vision_config=vision,
                              perceiver_config=perceiver, image_token_id=IMAGE)  # fmt: skip
    model = _build(T.Idefics2ForConditionalGeneration, config, attn)
    image = lambda g, j: {"pixel_values": torch.randn(1, 1, 3, 28, 28, generator=g),  # noqa: E731
                          "pixel_attention_mask": torch.ones(1, 1, 28, 28, dtype=torch.bool)}  # fmt: skip
    return model, _docs(model, image, image_dim=1)


def paligemma(attn: str) -> tuple[Any, list[dict]]:
    """Images first, the prompt prefix attended both ways, the suffix causal (``token_type_ids`` 1)."""
    text = dict(model_type="gemma", vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=256)  # fmt: skip
    config = T.PaliGemmaConfig(text_config=text, vision_config={**SIGLIP, "projection_dim": 32}, image_token_index=IMAGE,
                               projection_dim=32, hidden_size=32)  # fmt: skip
    model = _build(T.PaliGemmaForConditionalGeneration, config, attn)
    image = lambda g, j: {"pixel_values": torch.randn(1, 3, 28, 28, generator=g)}  # noqa: E731
    return model, _docs(model, image, per_token="token_type_ids", prefix=True)


def glm4v(attn: str) -> tuple[Any, list[dict]]:
    vision = dict(depth=1, hidden_size=32, out_hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3, image_size=56)  # fmt: skip
    text = {**TEXT, "rope_parameters": {**MROPE, "partial_rotary_factor": 0.5, "mrope_section": [1, 1, 0]}}
    config = T.Glm4vConfig(text_config=text, vision_config=vision, image_token_id=IMAGE, video_token_id=253,
                           image_start_token_id=START, image_end_token_id=END, video_start_token_id=254,
                           video_end_token_id=255)  # fmt: skip
    return _build(T.Glm4vForConditionalGeneration, config, attn), _qwen_docs(14, [[], [(1, 4, 4)], [(1, 4, 6), (1, 2, 2)],
                                                                               [(1, 2, 4)]])  # fmt: skip


WIDE: dict[str, Callable[[str], tuple[Any, list[dict]]]] = {
    "llava_next": llava_next, "llava_next_video": llava_next_video, "llava_onevision": llava_onevision,
    "mistral3": mistral3, "aya_vision": aya_vision, "internvl": internvl, "got_ocr2": got_ocr2, "idefics2": idefics2,
    "paligemma": paligemma, "glm4v": glm4v,
}  # fmt: skip
"""Model type -> builder: the wide sweep (``PADLESS_SWEEP=1``), beside :data:`quick_vlms.QUICK`."""

TRIED: dict[str, tuple[dict[str, Any], str]] = {
    "llava_onevision": (
        dict(positions="text", image_keys=("pixel_values", "image_sizes")),
        "its processor gives batch_num_images per document (a document of several images takes their base "
        "features only), a key the collator does not carry: a new scheme field",
    ),
    "got_ocr2": (
        dict(positions="text"),
        "no sdpa in transformers; on padless only its language model switches (the top config stays eager), "
        "so the collator sends a 4D mask that padless attention refuses in the forward",
    ),
    "paligemma": (
        dict(positions="text", blocks="prefix", token_keys=("token_type_ids",)),
        "its config sets use_bidirectional_attention on its Gemma layers (a text-only document attends both "
        "ways alone), which the text rule refuses on every backend",
    ),
}
"""The wide families the rule refuses: the scheme each was tried with, and what keeps it out. The
sweep also runs them as if :data:`padless.attention.multimodal.FAMILIES` held that scheme, and the
table says what it gave."""
