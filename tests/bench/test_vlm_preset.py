"""``padless bench --preset vlm``: a tiny Qwen2-VL matched to the offline processor, trained on chats
with 0-2 images each (padless.bench.captions) by padding, bucketing and packing. The images travel with
their documents in every strategy: the same examples give the same step losses and eval losses."""

from __future__ import annotations

import json

import pytest

from padless.bench.config import PRESETS, RunConfig
from padless.cli import main


def test_the_vlm_preset_trains_every_strategy_on_the_same_images(tmp_path, capsys):
    out = tmp_path / "vlm"
    argv = ["bench", "--preset", "vlm", "--steps", "3", "--warmup-steps", "1", "--in-process", "--out", str(out)]
    assert main(argv) == 0
    said = capsys.readouterr()
    assert "processor: offline" in said.out + said.err and "images travel with their documents" in said.out + said.err
    results = json.loads((out / "results.json").read_text())
    runs = results["strategies"]
    assert set(runs) == {"padding", "bucketing", "packing"}
    first = {name: run["loss"][0] for name, run in runs.items()}
    assert max(first.values()) - min(first.values()) < 1e-4 * max(first.values()), (
        first
    )  # the same examples, images included
    evals = {name: run["eval_loss_start"] for name, run in runs.items()}
    assert max(evals.values()) - min(evals.values()) < 1e-4 * max(evals.values()), evals
    assert runs["packing"]["padded_tokens"][0] < runs["padding"]["padded_tokens"][0]


def test_the_captions_hold_chats_with_zero_one_and_two_images():
    from padless.bench.captions import RECORDS, captions_file

    chats = [json.loads(line)["messages"] for line in captions_file().read_text().splitlines()]
    shown = [sum(part["type"] == "image" for part in chat[0]["content"]) for chat in chats]
    assert len(chats) == RECORDS and set(shown) == {0, 1, 2}
    assert all(chat[1]["role"] == "assistant" and chat[1]["content"] for chat in chats)


def test_images_need_a_processor_and_no_strategy_that_drops_them():
    vlm = PRESETS["vlm"]
    with pytest.raises(ValueError, match="flattening .* drops a record's images"):
        RunConfig(**{**vlm.__dict__, "strategies": ("padding", "flattening")})
    with pytest.raises(ValueError, match="data 'captions' holds images: it needs processor"):
        RunConfig(**{**vlm.__dict__, "processor": None})
