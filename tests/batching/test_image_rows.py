"""Rows packed ahead of the collator carry their documents' images (pack_dataset over a Dataset and a
streaming one, PackedRows, PackedStream): each row's images in document order, placed whole, and the
collator's packed batch of those rows equals each document run alone."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset

from padless.attention.accept import check_batch
from padless.batching.collate import PackingCollator
from padless.batching.image_rows import concat_images, pack_image_column, require_whole
from padless.batching.rows import PackedRows
from padless.batching.stream import PackedStream
from padless.integrations.datasets import pack_dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multimodal"))
from test_vision import QWEN_DOCS, _alone, _qwen2_vl, _qwen_doc  # noqa: E402


@pytest.fixture(scope="module")
def qwen():
    model = _qwen2_vl()
    docs = [_qwen_doc(g, i) for i, g in enumerate(QWEN_DOCS)]  # lengths 5, 14, 22, 12; 0, 1, 2, 1 images
    return model, docs, _alone(model, docs)[0]


def _lists(docs):
    """The documents as a ``datasets`` table holds them: lists, None where a document has no images."""
    rows = [{k: v.tolist() if hasattr(v, "tolist") else v for k, v in d.items()} for d in docs]
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return Dataset.from_dict({k: [r.get(k) for r in rows] for k in keys})


def _which(docs, ids):
    return next(j for j, d in enumerate(docs) if list(d["input_ids"]) == list(ids))


def _assert_rows_exact(model, docs, alone, rows, max_length=30):
    """Collate the pre-packed rows, check the batch, compare every document with it run alone; returns
    the documents of each row (found by their tokens)."""
    collator = PackingCollator.for_model(model, max_length=max_length)
    batch = collator(rows)
    check_batch(model, batch)
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    placed = []
    for r, row in enumerate(rows):
        ids, offset, mine = list(row["input_ids"]), 0, []
        for n in [int(x) for x in row["seq_lengths"]]:
            i = _which(docs, ids[offset : offset + n])
            torch.testing.assert_close(logits[r, offset : offset + n], alone[i], rtol=0, atol=1e-5)
            mine.append(i)
            offset += n
        placed.append(mine)
    assert sorted(i for m in placed for i in m) == list(range(len(docs)))
    assert collator.totals["images"] == sum(len(g) for g in QWEN_DOCS)
    return placed


def _grids(row):
    return None if row.get("image_grid_thw") is None else np.asarray(row["image_grid_thw"]).tolist()


def _expected_grids(placed):
    return [[list(g) for i in mine for g in QWEN_DOCS[i]] or None for mine in placed]


def test_pack_dataset_rows_carry_images_in_document_order(qwen):
    model, docs, alone = qwen
    dataset = _lists(docs)
    packed = pack_dataset(dataset, 30)
    assert packed.column_names == [*dataset.column_names, "seq_lengths"]
    assert packed.features["pixel_values"] == dataset.features["pixel_values"]
    rows = [packed[i] for i in range(len(packed))]
    placed = _assert_rows_exact(model, docs, alone, rows)
    assert [_grids(r) for r in rows] == _expected_grids(placed)
    for row, mine in zip(rows, placed):  # the patches too, document by document; one image mark per token
        with_images = [i for i in mine if QWEN_DOCS[i]]
        want = torch.cat([docs[i]["pixel_values"] for i in with_images]) if with_images else None
        got = None if row["pixel_values"] is None else torch.tensor(row["pixel_values"], dtype=torch.float32)
        assert (got is None) == (want is None) and (want is None or torch.equal(got, want))
        marks = [m for i in mine for m in docs[i].get("mm_token_type_ids", [0] * len(docs[i]["input_ids"]))]
        assert row["mm_token_type_ids"] == marks


def test_streaming_pack_dataset_rows_carry_images(qwen):
    model, docs, alone = qwen
    stream = pack_dataset(_lists(docs).to_iterable_dataset(), 30)
    rows = list(stream)
    placed = _assert_rows_exact(model, docs, alone, rows)
    assert [_grids(r) for r in rows] == _expected_grids(placed)
    batched = list(pack_dataset(_lists(docs).to_iterable_dataset(), 30, map_kwargs={"batch_size": 2}))
    _assert_rows_exact(model, docs, alone, batched)


def test_packed_rows_and_packed_stream_carry_images(qwen):
    model, docs, alone = qwen
    rows = PackedRows(docs, 30)
    _assert_rows_exact(model, docs, alone, [rows[r] for r in range(len(rows))])
    stream = list(PackedStream(iter(docs), 30, buffer_size=2))
    placed = _assert_rows_exact(model, docs, alone, stream)
    assert [_grids(r) for r in stream] == _expected_grids(placed)
    bounded = PackedRows(docs, 64, max_image_patches=40)  # 16 + 28 + 8 patches: one row cannot take them all
    assert len(PackedRows(docs, 64)) == 1 and len(bounded) == 2
    _assert_rows_exact(model, docs, alone, [bounded[r] for r in range(len(bounded))], max_length=64)


def test_a_stream_resumed_mid_way_yields_the_same_rows_with_their_images(qwen):
    _, docs, _ = qwen
    docs = docs * 3
    whole = list(PackedStream(docs, 30, buffer_size=3))
    stream = PackedStream(docs, 30, buffer_size=3)
    it = iter(stream)
    first = [next(it), next(it)]
    state = stream.state_dict()
    resumed = PackedStream(docs, 30, buffer_size=3)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(first) + len(rest) == len(whole)
    for a, b in zip(first + rest, whole):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))


def test_documents_with_images_are_never_cut_and_drops_are_counted(qwen, caplog):
    _, docs, _ = qwen
    with pytest.raises(ValueError, match=r"feature 2 holds images and 22 tokens, and the plan cuts it"):
        PackedRows(docs, 20, overlong="truncate")
    with pytest.raises(ValueError, match=r"example 2 holds images and 22 tokens, more than max_length=20"):
        list(PackedStream(docs, 20, overlong="split"))
    with pytest.raises(ValueError, match=r"row 2 of the dataset holds images and 22 tokens, and the plan cuts it"):
        pack_dataset(_lists(docs), 30, "wrapped")
    with pytest.raises(ValueError, match=r"example 2 holds images and the stream's plan cuts it"):
        list(pack_dataset(_lists(docs).to_iterable_dataset(), 30, "wrapped"))
    with pytest.raises(ValueError, match=r"example 2 holds images and 22 tokens, longer than seq_length=20"):
        list(pack_dataset(_lists(docs).to_iterable_dataset(), 20, overlong="truncate"))
    assert PackedRows(docs, 20, overlong="drop").dropped_images == 1
    stream = PackedStream(docs, 20, overlong="drop")
    rows = list(stream)
    assert stream.dropped_images == 1 and stream.counts.dropped_sequences == 1
    assert sum(len(np.asarray(r.get("image_grid_thw", np.zeros((0, 3))))) for r in rows) == 2
    with caplog.at_level(logging.WARNING, logger="padless.integrations.datasets"):
        packed = pack_dataset(_lists(docs), 20, overlong="drop")
    assert "1 dropped documents held images" in caplog.text
    assert sum(len(r["image_grid_thw"] or []) for r in packed) == 2


def test_idefics3_per_sample_pixels_are_stacked_along_the_image_axis():
    """Idefics3 / SmolVLM give per-sample tensors [1, images, C, H, W]: a packed row's are [1, all, ...]."""
    import quick_vlms

    model, docs = quick_vlms.idefics3("sdpa")
    alone = _alone(model, docs)[0]
    packed = pack_dataset(_lists(docs), 64)
    rows = [packed[i] for i in range(len(packed))]
    assert len(rows) == 1 and np.asarray(rows[0]["pixel_values"]).shape == (1, 4, 3, 28, 28)
    batch = PackingCollator.for_model(model, max_length=64)(rows)
    check_batch(model, batch)
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    offset = 0
    for n in rows[0]["seq_lengths"]:
        i = _which(docs, rows[0]["input_ids"][offset : offset + n])
        torch.testing.assert_close(logits[0, offset : offset + n], alone[i], rtol=0, atol=1e-5)
        offset += n


def test_the_arrow_and_numpy_rules_agree():
    import pyarrow as pa

    values = [[[1.0, 2.0], [3.0, 4.0]], None, [[5.0, 6.0]], [], [[7.0, 8.0]]]
    column = pa.array(values)
    docs, rows = np.array([2, 0, 1, 4, 3]), np.array([0, 0, 1, 2, 2])
    got = pack_image_column(column, "pixel_values", docs, rows, 4).to_pylist()
    assert got == [[[5.0, 6.0], [1.0, 2.0], [3.0, 4.0]], None, [[7.0, 8.0]], None]
    assert concat_images([values[2], values[0]], "pixel_values").tolist() == got[0]
    padded = concat_images([np.zeros((1, 2, 3, 4, 4)), np.ones((1, 1, 3, 5, 5))], "pixel_values")
    assert padded.shape == (1, 3, 3, 5, 5) and padded[0, :2].sum() == 0 and padded[0, 2, :, :5, :5].min() == 1
    with pytest.raises(ValueError, match="document 1 holds images"):
        require_whole(np.array([0, 1]), np.array([0, 2]), np.array([3, 2]), np.array([3, 4]), np.array([True, True]),
                      lambda d: f"document {d}")  # fmt: skip
