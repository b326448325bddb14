import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_features
from padless.batching.batch import batch_to
from padless.batching.collate import PackingCollator, PaddingCollator
from padless.batching.rowformat import FeatureSpec
from padless.layout import IGNORE_INDEX

PAD = 9  # an odd pad id, so a wrong pad value shows up in the literal expectations


def test_padding_collator_literal():
    batch = PaddingCollator(pad_token_id=PAD)([{"input_ids": [5, 6, 7]}, {"input_ids": [8], "labels": [-100]}])
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, PAD, PAD]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[5, 6, 7], [-100, -100, -100]]


def test_padding_collator_multiple_of():
    batch = PaddingCollator(pad_to_multiple_of=4)([{"input_ids": [1, 2, 3, 4, 5]}])
    assert batch["input_ids"].shape == (1, 8)


def test_packing_collator_literal_one_row():
    feats = [{"input_ids": [11, 12, 13]}, {"input_ids": [21, 22], "labels": [-100, 22]}, {"input_ids": [31]}]
    batch = PackingCollator(model_free=True, pad_token_id=PAD, pad_to_multiple_of=8)(feats)
    assert set(batch) == {"input_ids", "labels", "position_ids", "attention_mask", "use_cache"}
    assert batch["use_cache"] is False
    assert batch["input_ids"].tolist() == [[11, 12, 13, 21, 22, 31, PAD, PAD]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 0, 1]]
    # each document's first label is masked (13 must not learn to predict 21), -100 inputs stay,
    # padding is never a target
    assert batch["labels"].tolist() == [[-100, 12, 13, -100, 22, -100, -100, -100]]
    mask = batch["attention_mask"]
    assert mask.shape == (1, 1, 8, 8) and mask.dtype == torch.float32
    allowed = (mask[0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [0, 0, 0, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 1, 0, 0, 0],
        [0, 0, 0, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 0, 1, 1],
    ]


def test_packing_collator_varlen_keys():
    feats = [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}, {"input_ids": [6, 7, 8, 9]}]
    batch = PackingCollator(model_free=True, max_length=5, attention="varlen", pad_to_max_length=True)(feats)
    assert set(batch) == {
        "input_ids",
        "labels",
        "position_ids",
        "use_cache",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
    }
    assert batch["input_ids"].shape == (2, 5)
    cu = batch["cu_seq_lens_q"]
    assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == 10
    lengths = torch.diff(cu).tolist()
    # documents over the flattened rows: every row sums to 5 (real documents plus a trailing pad)
    assert sorted(lengths) == sorted([3, 2, 4, 1])
    assert batch["max_length_q"] == 4
    assert batch["position_ids"].tolist() == [
        [0, 1, 2, 0, 1] if batch["input_ids"][0, 0] == 1 else [0, 1, 2, 3, 0],
        [0, 1, 2, 0, 1] if batch["input_ids"][1, 0] == 1 else [0, 1, 2, 3, 0],
    ]


def test_packing_collator_position_ids_keys():
    batch = PackingCollator(model_free=True, attention="position_ids")(make_features([3, 4]))
    assert set(batch) == {"input_ids", "labels", "position_ids", "use_cache"}


def test_separator_appended_once():
    spec = FeatureSpec(separator_id=0, train_on_separator=False)
    batch = PackingCollator(model_free=True, features=spec)([{"input_ids": [5, 6]}, {"input_ids": [7, 0]}])
    assert batch["input_ids"].tolist() == [[5, 6, 0, 7, 0]]
    assert batch["labels"].tolist() == [[-100, 6, -100, -100, 0]]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=25),
    st.sampled_from(["next_fit", "best_fit_decreasing", "histogram_best_fit"]),
    st.integers(0, 1000),
)
def test_every_token_placed_exactly_once(lengths, strategy, seed):
    feats = make_features(lengths, seed=seed, with_labels=True)
    pad = -7  # not a valid token id, so padding can never be mistaken for a document
    batch = PackingCollator(model_free=True, max_length=40, strategy=strategy, attention="varlen", pad_token_id=pad)(
        feats
    )
    assert batch["input_ids"].shape[1] <= 40
    flat_ids = batch["input_ids"].reshape(-1).tolist()
    flat_labels = batch["labels"].reshape(-1).tolist()
    flat_pos = batch["position_ids"].reshape(-1).tolist()
    cu = batch["cu_seq_lens_q"].tolist()
    docs = [(flat_ids[a:b], flat_labels[a:b]) for a, b in zip(cu[:-1], cu[1:])]
    assert all(flat_pos[a:b] == list(range(b - a)) for a, b in zip(cu[:-1], cu[1:]))
    real = [d for d in docs if d[0][0] != pad]
    pads = [d for d in docs if d[0][0] == pad]
    expected = [(f["input_ids"], [-100] + f["labels"][1:]) for f in feats]
    assert sorted(real) == sorted(expected)
    assert all(set(i) == {pad} and set(lab) == {IGNORE_INDEX} for i, lab in pads)


def test_overlong_policies_are_counted():
    feats = make_features([5, 12, 3])
    with pytest.raises(ValueError, match="12"):
        PackingCollator(model_free=True, max_length=8)(feats)
    truncating = PackingCollator(model_free=True, max_length=8, overlong="truncate")
    batch = truncating(feats)
    assert int((batch["input_ids"] != 0).sum()) == 5 + 8 + 3
    assert truncating.totals["truncated_sequences"] == 1 and truncating.totals["truncated_tokens"] == 4
    dropping = PackingCollator(model_free=True, max_length=8, overlong="drop")
    dropping(feats)
    assert dropping.totals["dropped_sequences"] == 1 and dropping.totals["dropped_tokens"] == 12


@pytest.mark.parametrize(
    ("features", "kwargs", "message"),
    [
        ([], {}, "empty"),
        ([{"input_ids": []}], {}, "empty sequence"),
        ([{"input_ids": [1, 2], "labels": [1]}], {}, "labels has 1 tokens but input_ids has 2"),
        ([{"input_ids": [1, 600]}], {"features": FeatureSpec(vocab_size=512)}, "token id 600 is outside"),
        ([{"input_ids": [1, -3]}], {}, "token id -3 is outside"),
        ([{"labels": [1]}], {}, "no 'input_ids'"),
        ([{"input_ids": [1.5, 2.0]}], {}, "integer token ids"),
        ([{"input_ids": [1, 2, 3]}], {"max_length": 2}, "longer|max_length|length 3"),
    ],
)
def test_bad_input(features, kwargs, message):
    with pytest.raises(ValueError, match=message):
        PackingCollator(model_free=True, **kwargs)(features)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"w": [1.0, 1.0, 1.0]}, r"feature 1 has keys the collator does not pack: 'w'.*remove_columns"),
        ({"completion_mask": [0, 1, 1]}, r"'completion_mask'.*turn a mask into labels"),
        ({"attention_mask": [1, 1, 0]}, r"feature 1's attention_mask has 1 padding position \(0\)"),
        ({"attention_mask": [1, 1]}, r"attention_mask has shape \(2,\), not \(3,\)"),
        ({"position_ids": [5, 6, 7]}, r"feature 1's position_ids do not count 0..n-1"),
        ({"length": 4}, r"feature 1's length 4 is not the length of its input_ids \(3\)"),
    ],
)
@pytest.mark.parametrize("collator", [PaddingCollator(), PackingCollator(model_free=True, max_length=8)],
                         ids=["padding", "packing"])  # fmt: skip
def test_a_key_the_batch_would_not_carry_is_refused_by_name(collator, extra, message):
    """Nothing a feature holds is dropped without a word: a key the batch would leave out, or one the
    rows re-derive that says something else, is refused naming the key and the feature."""
    features = [{"input_ids": [1, 2]}, {"input_ids": [3, 4, 5], **extra}]
    with pytest.raises(ValueError, match=message):
        collator(features)


def test_image_inputs_need_a_collator_fitted_to_the_model():
    """A packing collator built without the model cannot place images (their positions and attention
    are the model family's); the padding collator carries them with their rows, where the model reads
    them itself. Packing them: tests/batching/test_vision.py."""
    features = [
        {"input_ids": [1, 2]},
        {"input_ids": [3, 4, 5], "pixel_values": [[0.1, 0.2]], "image_grid_thw": [[1, 1, 2]]},
    ]
    with pytest.raises(
        ValueError, match=r"feature 1 carries image inputs \('pixel_values', 'image_grid_thw'\).*without the model"
    ):
        PackingCollator(model_free=True, max_length=8)(features)
    with pytest.raises(ValueError, match=r"feature 1's token_type_ids are not all 0"):
        PackingCollator(model_free=True, max_length=8)(
            [{"input_ids": [1, 2]}, {"input_ids": [3, 4, 5], "token_type_ids": [0, 1, 1]}]
        )
    padded = PaddingCollator()(features)
    assert padded["pixel_values"].tolist() == [[0.1, 0.2]] and padded["image_grid_thw"].tolist() == [[1, 1, 2]]


def test_keys_the_rows_rederive_pass_where_they_agree():
    plain = [{"input_ids": [1, 2]}, {"input_ids": [3, 4, 5]}]
    agreeing = [{"input_ids": [1, 2], "attention_mask": [1, 1], "position_ids": [0, 1], "length": 2},
                {"input_ids": [3, 4, 5], "token_type_ids": [0, 0, 0]}]  # fmt: skip
    for collator in (PaddingCollator(), PackingCollator(model_free=True, max_length=8)):
        got, want = collator(agreeing), collator(plain)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want if torch.is_tensor(want[k]))
    row = [{"input_ids": [1, 2, 3, 4, 5], "seq_lengths": [2, 3], "position_ids": [0, 1, 0, 1, 2]}]
    assert PackingCollator(model_free=True, max_length=5)(row)["position_ids"].tolist() == [[0, 1, 0, 1, 2]]


def test_bad_input_padding_collator():
    with pytest.raises(ValueError, match="empty sequence"):
        PaddingCollator()([{"input_ids": [1]}, {"input_ids": []}])


def test_unknown_attention_inputs():
    with pytest.raises(ValueError, match="unknown attention inputs 'dense'"):
        PackingCollator(model_free=True, attention="dense")


def test_prepacked_rows_are_placed_as_given():
    rows = [
        {"input_ids": [1, 2, 3, 4, 5], "labels": [1, 2, 3, 4, 5], "seq_lengths": [2, 3]},
        {"input_ids": [6, 7], "labels": [6, -100], "seq_lengths": [2]},
    ]
    batch = PackingCollator(model_free=True, max_length=5, pad_token_id=PAD, pad_to_max_length=True)(rows)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5], [6, 7, PAD, PAD, PAD]]
    assert batch["position_ids"].tolist() == [[0, 1, 0, 1, 2], [0, 1, 0, 1, 2]]
    assert batch["labels"].tolist() == [[-100, 2, -100, 4, 5], [-100, -100, -100, -100, -100]]
    with pytest.raises(ValueError, match="sum to"):
        PackingCollator(model_free=True)([{"input_ids": [1, 2], "seq_lengths": [3]}])
    with pytest.raises(ValueError, match="mixes"):
        PackingCollator(model_free=True)([rows[0], {"input_ids": [1]}])


def test_for_model_picks_inputs_and_dtype():
    from padless.models.factory import build_model

    model = build_model("tiny-llama", dtype=torch.bfloat16)
    collator = PackingCollator.for_model(model, max_length=16)
    assert collator.attention == "mask4d" and collator.mask_dtype == torch.bfloat16
    assert collator.features.vocab_size == 512
    with pytest.raises(ValueError, match="outside the vocabulary"):
        collator([{"input_ids": [600]}])


def test_for_model_refuses_a_model_without_position_ids():
    class NoPositions(torch.nn.Module):
        config = type("C", (), {"_attn_implementation": "sdpa", "vocab_size": 10})()
        dtype = torch.float32

        def forward(self, input_ids, attention_mask=None):  # pragma: no cover - never called
            return input_ids

    with pytest.raises(ValueError, match="takes no position_ids"):
        PackingCollator.for_model(NoPositions())


def test_placements_say_where_every_piece_went():
    """Placements replace re-running the planner: each feature's pieces, rows and offsets."""
    feats = [{"input_ids": list(range(1, n + 1))} for n in (5, 3, 9, 2)]
    collate = PackingCollator(model_free=True, max_length=6, overlong="split")
    batch = collate(feats)
    p = batch.placements
    assert p.num_features == 4 and sorted(set(p.feature.tolist())) == [0, 1, 2, 3]
    for i, f in enumerate(feats):
        pieces = p.of_feature(i)
        assert sum(n for *_, n in pieces) == len(f["input_ids"])
        for start, row, offset, n in pieces:
            assert batch["input_ids"][row, offset : offset + n].tolist() == f["input_ids"][start : start + n]
    assert len(p.of_feature(2)) == 2  # 9 tokens in rows of 6: split once
    moved = batch_to(batch, "cpu")
    assert moved.placements is p and set(moved) == set(batch)


def test_labels_outside_the_vocabulary_are_refused_by_both_collators():
    feats = [{"input_ids": [1, 2], "labels": [1, 99999]}]
    spec = FeatureSpec(vocab_size=512)
    for collate in (PaddingCollator(features=spec), PackingCollator(model_free=True, features=spec)):
        with pytest.raises(ValueError, match="label 99999"):
            collate(feats)


@pytest.mark.parametrize(
    "record",
    [{"instruction": "Say hi", "output": "hi"}, {"conversations": [{"from": "human", "value": "x"}]}, {"text": "hi"}],
)
def test_a_record_not_tokenized_is_named_with_where_it_is_tokenized(record):
    from padless.batching.collate import PackingCollator

    with pytest.raises(ValueError, match=r"feature 0 has no 'input_ids' .*padless\.load_corpus"):
        PackingCollator(model_free=True, max_length=32)([record])
