"""RowFormat: its fields are declared and documented once (the collators are row formats and
redeclare none), the one for_model sequence (exactness rule -> inputs -> dtype and windows ->
vocabulary), the device / dtype of the run passed to the rule, and the one row-width rounding."""

import ast
import dataclasses
import inspect

import pytest
import torch

import padless.attention.select as select
from padless.attention.masks import additive_block_causal_mask
from padless.batching import collate, groups, preference, rollouts, rowformat
from padless.batching.batch import forward_inputs
from padless.batching.collate import PackingCollator
from padless.batching.preference import PreferenceCollator, RolloutCollator
from padless.batching.rowformat import FeatureSpec, RowFormat, round_up
from padless.models.factory import build_model

FORMAT_FIELDS = [f.name for f in dataclasses.fields(RowFormat)]


def _declared(module, cls_name):
    """``{field: docstring or None}`` of the annotated names a class body declares (its source)."""
    tree = ast.parse(inspect.getsource(module))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name]
    out = {}
    for stmt, after in zip(cls.body, [*cls.body[1:], None]):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            doc = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else None
            out[stmt.target.id] = doc
    return out


def test_every_field_is_documented_once():
    own = _declared(rowformat, "RowFormat")
    assert list(own) == FORMAT_FIELDS and all(own.values()), own
    for module, name in (
        (collate, "PackingCollator"),
        (groups, "GroupCollator"),
        (preference, "PreferenceCollator"),
        (rollouts, "RolloutCollator"),
    ):
        redeclared = set(_declared(module, name)) & set(FORMAT_FIELDS)
        assert redeclared == set(), f"{name} redeclares {redeclared}"
    for cls in (PackingCollator, PreferenceCollator, RolloutCollator):
        assert issubclass(cls, RowFormat)
        assert [f.name for f in dataclasses.fields(cls)][: len(FORMAT_FIELDS)] == FORMAT_FIELDS


def test_constructor_keywords_and_validation():
    c = PackingCollator(max_length=8, strategy="next_fit", pad_token_id=-9, pad_to_multiple_of=4, attention="varlen")
    assert (c.max_length, c.strategy, c.pad_token_id, c.pad_to_multiple_of, c.attention) == (
        8,
        "next_fit",
        -9,
        4,
        "varlen",
    )
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        RowFormat(strategy="nope")
    with pytest.raises(ValueError, match="unknown overlong policy 'cut'"):
        PackingCollator(overlong="cut")
    with pytest.raises(ValueError, match="pad_to_multiple_of must be an integer >= 1"):
        PreferenceCollator(pad_to_multiple_of=0)
    with pytest.raises(ValueError, match="windows apply to the 4D mask only"):
        RolloutCollator(share_prompt=False, attention="varlen", windows=4)
    with pytest.raises(ValueError, match="tree mask of a shared prompt carries no sliding window"):
        PreferenceCollator(windows=4)
    with pytest.raises(TypeError):
        PackingCollator(8)  # keywords only: a positional value cannot land in the wrong field


@pytest.mark.parametrize(
    ("max_length", "pad_to_max_length", "multiple", "used", "width"),
    [(None, False, None, 5, 5), (None, True, None, 5, 5), (12, True, None, 5, 12), (12, False, None, 5, 5),
     (12, False, 8, 5, 8), (12, True, 8, 5, 16), (None, False, 4, 8, 8)],
)  # fmt: skip
def test_row_width(max_length, pad_to_max_length, multiple, used, width):
    fmt = RowFormat(max_length=max_length, pad_to_max_length=pad_to_max_length, pad_to_multiple_of=multiple)
    assert fmt.row_width(used) == width
    assert (
        PreferenceCollator(
            max_length=max_length, pad_to_max_length=pad_to_max_length, pad_to_multiple_of=multiple
        ).row_width(used)
        == width
    )
    assert round_up(used, multiple) == (-(-used // multiple) * multiple if multiple else used)


def test_for_model_sequence():
    model = build_model("tiny-llama", dtype=torch.bfloat16)
    for cls in (PackingCollator, PreferenceCollator, RolloutCollator):
        c = cls.for_model(model, max_length=16, features=FeatureSpec(separator_id=3))
        assert c.attention == "mask4d" and c.mask_dtype == torch.bfloat16 and c.windows is None
        assert c.features == FeatureSpec(vocab_size=512, separator_id=3)  # vocabulary filled in, the rest kept
        assert c.max_length == 16
    with pytest.raises(ValueError, match="attention='varlen' does not isolate documents on backend 'sdpa'"):
        PackingCollator.for_model(model, attention="varlen")
    with pytest.raises(ValueError, match="does not isolate documents"):
        PreferenceCollator.for_model(model, share_prompt=False, attention="position_ids")


def test_for_model_passes_the_run_device_and_dtype_to_the_rule(monkeypatch):
    seen = []
    real = select.check_exact
    monkeypatch.setattr(select, "check_exact", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    model = build_model("tiny-llama")  # float32 weights on the CPU
    PackingCollator.for_model(model, max_length=8)
    c = PackingCollator.for_model(model, max_length=8, device="cuda", dtype=torch.bfloat16)
    PreferenceCollator.for_model(model, device="cuda", dtype=torch.float16)
    RolloutCollator.for_model(model, share_prompt=False)
    assert [(str(kw["device"]), kw["dtype"], kw["layout"]) for kw in seen] == [
        ("cpu", torch.float32, "documents"),
        ("cuda", torch.bfloat16, "documents"),
        ("cuda", torch.float16, "shared_prompt"),
        ("cpu", torch.float32, "documents"),
    ]
    assert c.mask_dtype == torch.float32  # the mask follows the weights; autocast casts it with the scores


def test_for_model_judges_the_run_not_the_weights():
    """A collator built on a CPU model for a CUDA run is not refused for the CPU."""
    model = build_model("tiny-llama")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="runs on CUDA only, not cpu"):
        PackingCollator.for_model(model, max_length=8)
    with pytest.raises(ValueError) as refused:  # refused for another reason (no flash-attn here), or accepted
        PackingCollator.for_model(model, max_length=8, device="cuda", dtype=torch.bfloat16)
        pytest.skip("flash-attn and a GPU are present: accepted")
    assert "CUDA only" not in str(refused.value) and "fp16 or bf16" not in str(refused.value)


def test_independent_groups_keep_the_model_window():
    """share_prompt=False rows are plain documents: for_model carries the model's sliding window into
    their 4D mask, and the packed logits equal each document run alone."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    model = MistralForCausalLM(
        MistralConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            sliding_window=4,
            attn_implementation="sdpa",
        )
    )
    pairs = [{"prompt_ids": [1, 2, 3, 4, 5], "chosen_ids": [6, 7, 8, 9], "rejected_ids": [10, 11]},
             {"prompt_ids": [12, 13], "chosen_ids": [14, 15, 16, 17, 18], "rejected_ids": [19]}]  # fmt: skip
    collator = PreferenceCollator.for_model(model, max_length=64, share_prompt=False, pad_to_multiple_of=8)
    assert collator.windows == 4
    batch = collator(pairs)
    docs = [[9, 7, 7, 3, 6]]  # prompt + completion per document, in placement order, then the pad
    assert batch["attention_mask"].shape == (1, 1, 32, 32)
    torch.testing.assert_close(batch["attention_mask"], additive_block_causal_mask(docs, window=4), rtol=0, atol=0)
    with torch.no_grad():
        logits = model(**forward_inputs(batch)).logits[0]
        ids, at = batch["input_ids"][0], 0
        for n in docs[0][:-1]:
            alone = model(input_ids=ids[None, at : at + n], use_cache=False).logits[0]
            torch.testing.assert_close(logits[at : at + n], alone, atol=1e-5, rtol=1e-5)
            at += n
    with pytest.raises(ValueError, match="sliding window"):
        PreferenceCollator.for_model(model, max_length=64)  # the shared-prompt tree mask has no window


def test_collators_pickle_and_count():
    """DataLoader workers pickle the collator: a frozen row format must survive the round trip, its
    running totals included; the whole-batch row (max_length=None) counts what it placed too."""
    import pickle

    feats = [{"input_ids": [5, 6, 7]}, {"input_ids": [8]}]
    c = PackingCollator(model_free=True, pad_token_id=-9, pad_to_multiple_of=8)
    c(feats)
    assert c.totals["sequences"] == 2 and c.totals["tokens"] == 4
    back = pickle.loads(pickle.dumps(c))
    assert back == c and back.totals == c.totals
    assert back(feats)["input_ids"].tolist() == c(feats)["input_ids"].tolist() == [[5, 6, 7, 8, -9, -9, -9, -9]]
    group = PreferenceCollator(max_length=16, share_prompt=False)
    assert pickle.loads(pickle.dumps(group)) == group


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_for_model_for_an_autocast_run(backend):
    """float32 weights trained under bf16 autocast (Trainer(bf16=True)): the collator is built for
    dtype=bfloat16, its mask follows the weights, and the packed rows under autocast give each
    document's logits alone under autocast."""
    model = build_model("tiny-llama", attn_implementation=backend)
    collator = PackingCollator.for_model(model, max_length=32, dtype=torch.bfloat16)
    docs = [[1, 2, 3, 4, 5], [6, 7, 8], [9]]
    batch = collator([{"input_ids": d} for d in docs])
    assert batch["attention_mask"].dtype == torch.float32
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        packed = model(**forward_inputs(batch)).logits[0]
        at = 0
        for d in docs:
            alone = model(input_ids=torch.tensor([d]), use_cache=False).logits[0]
            assert packed.dtype == alone.dtype == torch.bfloat16
            # bf16 reductions over a 32-token row and a 5-token one may round apart by one ulp on some CPUs
            torch.testing.assert_close(packed[at : at + len(d)], alone, atol=2**-8, rtol=2**-8)
            at += len(d)
