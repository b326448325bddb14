"""``padless stats``' comparison table: one overlong policy and one definition of padding for every way
of batching (the one ``padless bench`` uses), bucketing against the same shuffle as pad-to-longest, and
no ratio for data smaller than one row."""

from __future__ import annotations

import json

import numpy as np
import pytest

from padless.cli import main
from padless.planning.lengths import compare_batching
from padless.planning.padding import padded_tokens, padding_fraction, placed_lengths
from padless.planning.plan import plan_packs


def test_padding_fraction_is_one_definition():
    assert padding_fraction(3, 4) == pytest.approx(0.25) and padding_fraction(0, 0) is None
    with pytest.raises(ValueError, match="real_tokens must be in"):
        padding_fraction(5, 4)


@pytest.mark.parametrize("policy", ["truncate", "split", "drop"])
def test_every_way_places_the_tokens_the_plan_places(policy):
    lengths = np.array([30, 2, 17, 8, 45, 16])
    plan = plan_packs(lengths, 16, overlong=policy)
    units = placed_lengths(lengths, 16, policy)
    assert int(units.sum()) == plan.stats.real_tokens and units.max() <= 16
    out = compare_batching(lengths, plan, 2, overlong=policy)
    for way in out.values():  # each way computes at least the placed tokens, padding by the one definition
        assert way["padding_fraction"] == pytest.approx(
            padding_fraction(plan.stats.real_tokens, way["tokens_computed"])
        )
    if policy == "split":  # nothing truncated: the padding baselines hold every token too
        assert plan.stats.real_tokens == lengths.sum()
    with pytest.raises(ValueError, match="plan them with the same policy"):
        compare_batching(lengths, plan_packs(lengths, 16, overlong="drop"), 2, overlong="split")


def test_split_pieces_keep_order_and_remainders():
    assert placed_lengths(np.array([5, 20, 3, 33]), 10, "split").tolist() == [5, 10, 10, 3, 10, 10, 10, 3]


@pytest.mark.parametrize("sort", [False, True])
def test_bucketing_pads_no_more_than_pad_to_longest(sort):
    # a file sorted by length (or small, one chunk per batch) once made bucketing look worse: pad to longest
    # took the file in order, bucketing a shuffle of it; both now start from the same shuffle
    rng = np.random.default_rng(1)
    for n in (5, 35, 170):
        lengths = rng.integers(1, 500, n)
        lengths = np.sort(lengths) if sort else lengths
        for seed in range(5):
            out = compare_batching(lengths, plan_packs(lengths, 512), 8, seed)
            assert out["bucketed"]["tokens_computed"] <= out["pad_to_longest"]["tokens_computed"]


def test_the_public_fractions_compare_on_the_same_shuffle():
    from padless.planning.lengths import padding_fraction_bucketed, padding_fraction_pad_to_longest

    lengths = np.sort(np.random.default_rng(2).integers(1, 500, 60))  # sorted: in order, already bucketed
    shuffled = padding_fraction_pad_to_longest(lengths, 8, seed=3)
    assert padding_fraction_bucketed(lengths, 8, 3) <= shuffled
    assert padding_fraction_pad_to_longest(lengths, 8) < shuffled  # the given order, as before
    plan = plan_packs(lengths, 512)
    assert compare_batching(lengths, plan, 8, 3)["pad_to_longest"]["padding_fraction"] == pytest.approx(shuffled)


def test_packed_rows_are_charged_what_the_collator_feeds():
    lengths = np.array([100, 200, 300])  # one row of 600 in 2048: fed 600 wide, not 2048
    out = compare_batching(lengths, plan_packs(lengths, 2048), 8)
    assert out["packed"] == {"padding_fraction": 0.0, "tokens_computed": 600}
    rows = plan_packs(np.array([6, 2, 3, 5, 7]), 8)
    assert compare_batching(np.array([6, 2, 3, 5, 7]), rows, 2)["packed"]["tokens_computed"] == padded_tokens(
        rows.row_lengths, 2
    )


def test_a_file_smaller_than_one_row_says_so(tmp_path, capsys):
    path = tmp_path / "two.txt"
    path.write_text("3\n5\n")
    assert main(["stats", "--lengths", str(path)]) == 0
    out = capsys.readouterr().out
    assert "all 8 tokens fit in one row of --max-length 2048: smaller than one row" in out
    table = [ln for ln in out.splitlines() if ln.startswith(("  pad to longest", "  bucketed", "  packed"))]
    assert len(table) == 3 and all(ln.endswith(" -") for ln in table)
    assert main(["stats", "--lengths", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["smaller_than_one_row"] is True and doc["batching"]["packed"]["padding_fraction"] == 0.0


def test_split_does_not_let_the_padding_baselines_truncate(tmp_path, capsys):
    path = tmp_path / "l.txt"
    path.write_text("\n".join(map(str, [30, 2, 17, 8, 45] * 4)))
    argv = ["stats", "--lengths", str(path), "--max-length", "16", "--batch-size", "2", "--json"]
    assert main([*argv, "--overlong", "split"]) == 0
    split = json.loads(capsys.readouterr().out)
    assert main([*argv, "--overlong", "truncate"]) == 0
    truncated = json.loads(capsys.readouterr().out)
    for way in ("pad_to_longest", "bucketed", "packed"):  # split keeps 408 tokens for every way, truncate 264
        assert split["batching"][way]["tokens_computed"] >= 408 > truncated["batching"][way]["tokens_computed"]


def _image_chats(folder):
    from padless.data.images import sample_images

    pics = sample_images(3, seed=1)
    for i, pic in enumerate(pics):
        pic.save(folder / f"p{i}.png")
    records = [
        {"messages": [{"role": "user", "content": [*[{"type": "image", "path": f"p{j}.png"} for j in range(i % 3)],
                                                   {"type": "text", "text": f"Picture {i}?"}]},
                      {"role": "assistant", "content": f"Shapes, {i} of them."}]}
        for i in range(6)
    ]  # fmt: skip
    path = folder / "chats.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def test_stats_reads_chats_with_images_through_a_processor(tmp_path, capsys):
    from padless.data.load import load_corpus
    from padless.data.shards import cached_processor

    chats = _image_chats(tmp_path)
    assert main(["stats", "--data", str(chats), "--processor", "offline", "--max-length", "256"]) == 0
    out = capsys.readouterr().out
    assert "processor: OfflineQwen2VLProcessor (built offline" in out and "4 documents with 6 images" in out
    assert main(["stats", "--data", str(chats), "--processor", "offline", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    want = load_corpus(str(chats), processor=cached_processor("offline")).lengths
    assert doc["lengths"]["total"] == int(want.sum()) and doc["data"]["images"] == 6
    assert main(["stats", "--data", str(chats)]) == 2  # without a processor the images are refused, named
    assert "line 2: message 0: content parts of type ['image', 'text']" in capsys.readouterr().err
    assert main(["stats", "--processor", "offline", "--num", "10"]) == 2
    assert "--processor applies to --data" in capsys.readouterr().err
