"""Videos travel with their documents like images: Qwen2-VL documents holding videos (and images and
videos together) packed into rows equal each document run alone, logits and gradients (vision tower
included), fp32, 1e-5; their 3-D positions are each document's own (a video's temporal axis too)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_vision import IMAGE, _alone, _assert_same, _packed, _qwen2_vl  # noqa: E402

from padless.attention.accept import check_batch  # noqa: E402
from padless.batching.collate import PackingCollator  # noqa: E402

VIDEO = 253


def _doc(images, videos, seed):
    """Text, then each image's and each video's placeholder tokens (t*h*w / 4) between vision start /
    end; ``mm_token_type_ids`` 1 for image tokens, 2 for video tokens, as Qwen-VL's processor marks them."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 200, (5,), generator=g).tolist()
    feature = {}
    for key, token, grids in (("pixel_values", IMAGE, images), ("pixel_values_videos", VIDEO, videos)):
        pixels = []
        for t, h, w in grids:
            ids += [251] + [token] * (t * h * w // 4) + [252] + torch.randint(3, 200, (3,), generator=g).tolist()
            pixels.append(torch.randn(t * h * w, 3 * 2 * 14 * 14, generator=g))
        if grids:
            feature[key] = torch.cat(pixels)
            feature["image_grid_thw" if token == IMAGE else "video_grid_thw"] = torch.tensor(grids)
    feature.update(input_ids=ids, labels=[-100 if i in (IMAGE, VIDEO) else i for i in ids])
    if images or videos:
        feature["mm_token_type_ids"] = [1 if i == IMAGE else 2 if i == VIDEO else 0 for i in ids]
    return feature


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_documents_with_videos_pack_exactly(attn):
    model = _qwen2_vl(attn)
    docs = [
        _doc([], [(2, 4, 4)], 0),  # one video of two frames
        _doc([], [], 1),
        _doc([(1, 2, 4)], [(2, 2, 4), (2, 4, 2)], 2),  # an image and two videos
        _doc([(1, 4, 4)], [], 3),
    ]
    collator = PackingCollator.for_model(model, max_length=40)
    batch = collator(docs)
    check_batch(model, batch)
    assert batch["input_ids"].shape[0] < len(docs), "documents share rows"
    videos = batch["video_grid_thw"].tolist()  # in the order the rows consume them: doc 2's two stay in order
    assert sorted(videos) == sorted([[2, 4, 4], [2, 2, 4], [2, 4, 2]])
    assert videos.index([2, 2, 4]) + 1 == videos.index([2, 4, 2])
    assert batch["pixel_values_videos"].shape[0] == 32 + 16 + 16 and batch["pixel_values"].shape[0] == 8 + 16
    _assert_same(_alone(model, docs), _packed(model, batch, docs))
