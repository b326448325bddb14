"""ALiBi models: which position scheme a model uses, MPT packed exactly (4D mask, eager), BLOOM and
Falcon-with-alibi refused by padless, and the measurements behind each refusal
(if transformers changes, these tests say so)."""

import pytest
import torch
from transformers import BloomConfig, BloomForCausalLM, FalconConfig, FalconForCausalLM, MptConfig, MptForCausalLM

from padless.attention.masks import additive_block_causal_mask
from padless.attention.positions import alibi_refusal, position_scheme
from padless.batching.batch import forward_inputs
from padless.batching.collate import PackingCollator
from padless.layout import position_ids_from_lengths
from padless.models.factory import build_model, tiny_config
from padless.objectives.logprobs import sequence_logprobs

V = 128


def _bloom():
    return BloomForCausalLM(BloomConfig(vocab_size=V, hidden_size=32, n_layer=2, n_head=4)).eval()


def _falcon(alibi=True):
    return FalconForCausalLM(
        FalconConfig(
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            alibi=alibi,
            new_decoder_architecture=False,
            multi_query=False,
        )
    ).eval()


def _mpt(backend="eager", dtype=torch.float32):
    torch.manual_seed(0)
    config = MptConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, max_seq_len=128)
    config._attn_implementation = backend
    return MptForCausalLM(config).to(dtype).eval()


def _features(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, V, (n,), generator=g).tolist()} for n in lengths]


def test_position_scheme():
    assert position_scheme(build_model("tiny-llama")) == "position_ids"
    assert position_scheme(tiny_config("gpt2")) == "position_ids"
    for model in (_bloom(), _mpt(), _falcon()):
        assert position_scheme(model) == position_scheme(model.config) == "alibi"
    assert position_scheme(_falcon(alibi=False)) == "position_ids"  # rotary Falcon


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mpt_is_packed_exactly(dtype):
    model = _mpt("eager", dtype)  # MPT supports no other attention implementation
    feats = _features([5, 1, 17, 9, 3, 12, 2, 8])
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 5e-2}
    batch = PackingCollator.for_model(model, max_length=24)(feats)
    assert "attention_mask" in batch and batch["attention_mask"].dim() == 4
    with torch.no_grad():
        packed = model(**forward_inputs(batch)).logits
        sums = sequence_logprobs(model, batch, logits=packed)
        for i, f in enumerate(feats):
            ((_, row, offset, n),) = batch.placements.of_feature(i)
            alone = model(input_ids=torch.tensor([f["input_ids"]]), use_cache=False).logits[0]
            torch.testing.assert_close(packed[row, offset : offset + n], alone, **tol)
            lp = alone.float().log_softmax(-1)[:-1].gather(1, torch.tensor(f["input_ids"][1:])[:, None]).sum()
            torch.testing.assert_close(sums[i], lp, **tol)


@pytest.mark.parametrize(
    "make,match",
    [(_bloom, "BLOOM builds its ALiBi bias from a 2D attention_mask"),
     (_falcon, "Falcon with alibi=True cannot take a 4D block mask")],
)  # fmt: skip
def test_refused_with_padless_error(make, match):
    model = make()
    with pytest.raises(ValueError, match=f"uses ALiBi positions: .*{match}"):
        PackingCollator.for_model(model, max_length=24)
    assert alibi_refusal(model, backend=model.config._attn_implementation) is not None


def test_refusal_predicate_per_backend_and_non_alibi_models():
    assert alibi_refusal(_mpt(), backend="eager") is None
    assert "4D block mask" in alibi_refusal(_mpt(), backend="padless")
    assert alibi_refusal(build_model("tiny-gpt2"), backend="padless") is None


def test_what_transformers_does_with_bloom_and_falcon():
    """The measurements behind the refusals: BLOOM and Falcon cannot take a 4D mask, and Falcon's
    bfloat16-rounded ALiBi positions change a document placed past a row's 256th token."""
    docs = [5, 7]
    ids = torch.randint(0, V, (1, 12))
    mask = additive_block_causal_mask([docs], dtype=torch.float32)
    for model in (_bloom(), _falcon()):
        with pytest.raises(ValueError, match="too many values to unpack"):
            model(input_ids=ids, attention_mask=mask, use_cache=False)
    model = _falcon()
    docs = [500, 12]
    ids = torch.randint(0, V, (1, sum(docs)))
    with torch.no_grad():
        packed = model(
            input_ids=ids, position_ids=torch.from_numpy(position_ids_from_lengths(docs))[None], use_cache=False
        ).logits[0, 500:]
        alone = model(input_ids=ids[:, 500:], use_cache=False).logits[0]
    assert (packed - alone).abs().max() > 1e-4
