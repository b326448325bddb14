"""Chats with images, from JSON lines and Parquet, through ``load_corpus(processor=...)`` and ``padless
pack --processor``: every row of the Parquet shards carries its documents' images in document order,
per-token columns placed like the ids, and the collator's packed batch of those rows equals each
document run alone (logits, fp32, 1e-5) on a tiny Qwen2-VL sized for the offline processor. A document
with images is never cut; one dropped as overlong is counted; a bad image names its line and part."""

from __future__ import annotations

import base64
import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from padless.attention.accept import check_batch
from padless.batching.collate import PackingCollator
from padless.cli import main
from padless.data.images import sample_images
from padless.data.inputs import open_input
from padless.data.load import load_corpus
from padless.data.shards import cached_processor
from padless.export.parquet import pack_to_parquet

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from integrations_support import offline_qwen2_vl  # noqa: E402


def _png(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _records(folder):
    """Chats with 0, 1 and 2 images (paths relative to the file, a data URI), and a tool call."""
    pics = sample_images(4, seed=3)
    for i, pic in enumerate(pics):
        pic.save(folder / f"pic{i}.png")
    uri = "data:image/png;base64," + base64.b64encode(_png(pics[3])).decode()
    records = []
    for i in range(9):
        parts = [{"type": "image", "path": f"pic{(i + j) % 3}.png"} for j in range(i % 3)]
        if i == 4:
            parts.append({"type": "image_url", "image_url": {"url": uri}})
        records.append({"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": f"Picture {i}?"}]},
                                     {"role": "assistant", "content": f"Shapes, {i} of them."}]})  # fmt: skip
    records.append({"messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "snow"}, {"role": "assistant", "content": "Snow."}]})  # fmt: skip
    return records


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chats")
    path = folder / "chats.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _records(folder)) + "\n")
    return path


@pytest.fixture(scope="module")
def model():
    return offline_qwen2_vl(cached_processor("offline"), bos=True).eval()


def _alone(model, feature):
    inputs = {k: torch.as_tensor(v) for k, v in feature.items() if k != "labels" and v is not None}
    inputs = {k: v[None] if k in ("input_ids", "mm_token_type_ids") else v for k, v in inputs.items()}
    with torch.no_grad():
        return model(**inputs).logits[0]


def _assert_rows_exact(model, rows, features):
    """The rows carry their documents' images in document order, and packed equals alone."""
    by_ids = {tuple(f["input_ids"]): f for f in features}
    collator = PackingCollator.for_model(model, max_length=max(len(r["input_ids"]) for r in rows))
    batch = collator(rows)
    check_batch(model, batch)
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    seen = 0
    for r, row in enumerate(rows):
        offset, grids, pixels = 0, [], []
        for n in row["seq_lengths"]:
            doc = by_ids[tuple(row["input_ids"][offset : offset + n])]
            assert list(row["mm_token_type_ids"][offset : offset + n]) == list(doc["mm_token_type_ids"])
            if doc.get("image_grid_thw") is not None:
                grids += np.asarray(doc["image_grid_thw"]).tolist()
                pixels.append(np.asarray(doc["pixel_values"]))
            torch.testing.assert_close(logits[r, offset : offset + n], _alone(model, doc), rtol=0, atol=1e-5)
            offset, seen = offset + n, seen + 1
        assert (row["image_grid_thw"] or []) == grids
        if pixels:
            np.testing.assert_array_equal(np.asarray(row["pixel_values"], dtype=np.float32), np.concatenate(pixels))
    assert seen == len(features)


def test_load_corpus_renders_image_chats_through_the_processor(chats):
    corpus = load_corpus(chats, processor="offline")
    assert corpus.report.image_documents == 6 and corpus.report.images == 10 and corpus.report.kept == 10
    assert "6 examples with 10 images" in str(corpus.report)
    features = corpus.features()
    assert features[1]["image_grid_thw"].shape == (1, 3) and features[0]["image_grid_thw"] is None
    tool = cached_processor("offline").tokenizer.decode(features[9]["input_ids"])
    assert '"name": "weather"' in tool, "a tool call is written into the rendering, never left out"
    with pytest.raises(
        ValueError, match="holds images and .* tokens, above max_length=40: a document with images is never cut"
    ):
        load_corpus(chats, processor="offline", max_length=40, overlong="truncate")
    dropped = load_corpus(chats, processor="offline", max_length=40, overlong="drop")
    assert dropped.report.skipped["overlong"] == 10 - dropped.report.kept > 0
    with pytest.raises(ValueError, match="a tokenizer renders text parts only.*processor=NAME"):
        load_corpus(chats, "gpt2", cache=False)


def test_pack_with_a_processor_keeps_images_in_document_order(chats, model, tmp_path):
    features = load_corpus(chats, processor="offline").features()
    summary = pack_to_parquet(open_input(str(chats), processor="offline", shard_rows=4), tmp_path / "out", 96,
                              rows_per_shard=2, shard_rows=4, progress=False)  # fmt: skip
    assert summary["complete"] and summary["tokens_accounted"] and summary["image_documents"] == 6
    rows = pq.read_table(sorted((tmp_path / "out").glob("shard-*.parquet"))).to_pylist()
    assert len(rows) == summary["stats"]["num_rows"] > 2, "rows from two output shards, four input shards"
    _assert_rows_exact(model, rows, features)


def test_parquet_input_with_an_images_column(chats, model, tmp_path):
    """TRL's vision-dataset layout: bare image parts, the images in an 'images' column of {bytes, path}."""
    pics = sample_images(3, seed=9)
    records = [{"messages": [{"role": "user", "content": [{"type": "image"}] * k + [{"type": "text", "text": f"n{k}"}]},
                             {"role": "assistant", "content": [{"type": "text", "text": "ok " * (k + 1)}]}],
                "images": [{"bytes": _png(pics[(k + j) % 3]), "path": None} for j in range(k)]} for k in (0, 1, 2, 1)]  # fmt: skip
    path = tmp_path / "vision.parquet"
    pq.write_table(pa.Table.from_pylist(records), path)
    features = load_corpus(path, processor="offline").features()
    assert [f["image_grid_thw"] is not None for f in features] == [False, True, True, True]
    pack_to_parquet(open_input(str(path), processor="offline"), tmp_path / "out", 128, progress=False)
    rows = pq.read_table(tmp_path / "out" / "shard-00000.parquet").to_pylist()
    _assert_rows_exact(model, rows, features)


def test_the_cli_names_the_processor_counts_images_and_refuses_a_cut(chats, tmp_path, capsys):
    assert main(["pack", str(chats), "--out", str(tmp_path / "a"), "--max-length", "40", "--processor", "offline",
                 "--overlong", "drop", "--no-progress"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "processor: OfflineQwen2VLProcessor" in out and "a document with images is placed whole" in out
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    dropped = summary["dropped_image_documents"]
    assert dropped > 0 and f"{dropped} document{'s' * (dropped != 1)} with images dropped as overlong" in out
    assert summary["tokens_accounted"]
    assert main(["pack", str(chats), "--out", str(tmp_path / "b"), "--max-length", "40", "--processor", "offline",
                 "--overlong", "split", "--no-progress"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert re.search(r"chats.jsonl, line \d+ holds images and \d+ tokens, above --max-length 40: a document with images "
                     r"is placed whole \(--overlong 'split' would cut its images\)", err), err  # fmt: skip
    assert main(["pack", str(chats), "--out", str(tmp_path / "c"), "--max-length", "64", "--processor", "offline",
                 "--tokenizer", "gpt2"]) == 2  # fmt: skip
    assert "--processor brings its own tokenizer" in capsys.readouterr().err


def test_a_bad_image_and_images_without_a_processor_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    bad = {"messages": [{"role": "user", "content": [{"type": "image", "path": "missing.png"}, {"type": "text", "text": "?"}]},
                        {"role": "assistant", "content": "no"}]}  # fmt: skip
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2: message 0, part 0 \('image'\): image file .*missing.png"):
        pack_to_parquet(open_input(str(path), processor="offline"), tmp_path / "out", 64, progress=False)
    assert not (tmp_path / "out").exists(), "a failed first run leaves nothing behind"
    with pytest.raises(
        ValueError, match=r"line 2: message 0: content parts of type \['image', 'text'\].*processor=NAME"
    ):
        pack_to_parquet(open_input(str(path)), tmp_path / "out", 64, progress=False)


def test_the_docs_snippet_runs(chats, tmp_path, monkeypatch):
    """docs/vlm.md's snippet of packing ahead of training, on a chats.jsonl with images."""
    import shutil

    doc = (Path(__file__).resolve().parents[2] / "docs" / "vlm.md").read_text()
    code = next(b.split("```", 1)[0] for b in doc.split("```python\n")[1:] if 'load_corpus("chats.jsonl"' in b)
    for f in chats.parent.iterdir():
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/vlm.md", "exec"), scope)
    assert scope["rows"].plan.num_rows >= 1 and "6 examples with 10 images" in str(scope["corpus"].report)
