"""padless varlen attention: kernels against the dense oracle, the transformers backend against each
sequence run alone and against SDPA with a 4D mask, refusals, and backend selection."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from padless.attention.backend import (
    cu_seqlens_from_position_ids,
    packed_documents,
    padless_attention,
    register_padless_attention,
)
from padless.attention.masks import additive_block_causal_mask
from padless.attention.select import BACKENDS, backend_inputs, resolve_backend
from padless.attention.varlen import BucketCost, bucket_documents, reference_varlen_attention, varlen_attention
from padless.layout import cu_seqlens_from_lengths, position_ids_from_lengths
from padless.models.factory import build_model

# ------------------------------------------------------------------------------------------ kernels


def _qkv(lengths, hq=4, hk=4, d=8, dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    t = int(sum(lengths))
    make = lambda h: torch.randn(t, h, d, generator=g).to(device=device, dtype=dtype).requires_grad_()  # noqa: E731
    cu = torch.from_numpy(cu_seqlens_from_lengths(lengths)).to(device)
    return make(hq), make(hk), make(hk), cu


def _check_against_reference(lengths, hq=4, hk=4, atol=2e-5, dtype=torch.float32, impl="auto", device="cpu", **kw):
    q, k, v, cu = _qkv(lengths, hq, hk, dtype=dtype, device=device)
    out = varlen_attention(q, k, v, cu, impl=impl, **kw)
    assert out.shape == q.shape and out.dtype == dtype
    # the oracle runs in float32 on float32 copies of the same inputs
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref = reference_varlen_attention(q32, k32, v32, cu, **kw)
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(ref.device)
    got = torch.autograd.grad(out, (q, k, v), grad.to(dtype))
    want = torch.autograd.grad(ref, (q32, k32, v32), grad)
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=atol)
    for name, a, b in zip("qkv", got, want):
        torch.testing.assert_close(a.float(), b, atol=atol, rtol=atol, msg=lambda m, n=name: f"grad {n}: {m}")


def test_bucket_documents_literal():
    # pair cost only: every distinct length gets its own bucket (no padding); shortest first
    buckets = bucket_documents(np.array([5, 1, 5, 1]), BucketCost(call=0.0, token=0.0, pair=1.0))
    assert [b.tolist() for b in buckets] == [[1, 3], [0, 2]]
    # a huge per-call cost: one bucket holding everything
    buckets = bucket_documents(np.array([5, 1, 5, 1]), BucketCost(call=1e9, token=0.0, pair=1.0))
    assert [sorted(b.tolist()) for b in buckets] == [[0, 1, 2, 3]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=60))
def test_bucket_documents_places_every_document_once_in_length_order(lengths):
    lengths = np.array(lengths)
    buckets = bucket_documents(lengths)
    placed = np.concatenate(buckets)
    assert sorted(placed.tolist()) == list(range(lengths.size))
    for a, b in zip(buckets, buckets[1:]):
        assert lengths[a].max() <= lengths[b].min()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 24), min_size=1, max_size=12),
    st.sampled_from([(4, 4), (4, 2), (4, 1)]),
)
def test_varlen_matches_dense_reference(lengths, heads):
    _check_against_reference(lengths, *heads)


@pytest.mark.parametrize(
    "lengths",
    [[1], [1, 1, 1, 1], [37], [6, 6, 6], [1, 9, 1, 30, 2, 2, 17], [128, 1, 3]],
    ids=["one-token", "all-one-token", "one-document-fills-row", "equal-documents", "mixed", "long-and-short"],
)
@pytest.mark.parametrize("hk", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("window", [None, 3])
def test_varlen_grid(lengths, hk, window):
    _check_against_reference(lengths, hq=4, hk=hk, sliding_window=window)


def test_varlen_bidirectional_and_scale():
    _check_against_reference([5, 1, 8, 3], causal=False, scale=0.3)


@pytest.mark.parametrize("dtype, atol", [(torch.bfloat16, 3e-2), (torch.float16, 5e-3)])
def test_varlen_half_precision(dtype, atol):
    _check_against_reference([7, 1, 20, 4, 12], hq=4, hk=2, dtype=dtype, atol=atol)


def test_dropout_keeps_documents_isolated():
    q, k, v, cu = _qkv([6, 9, 4])
    plain = varlen_attention(q, k, v, cu)
    torch.manual_seed(3)
    first = varlen_attention(q, k, v, cu, dropout_p=0.5)
    v2 = v.detach().clone()
    v2[6:15] += 10.0  # change only the second document
    torch.manual_seed(3)
    second = varlen_attention(q, k, v2, cu, dropout_p=0.5)
    assert not torch.allclose(first, plain)  # dropout did something
    torch.testing.assert_close(first[:6], second[:6])
    torch.testing.assert_close(first[15:], second[15:])
    first.sum().backward()  # and it trains
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.parametrize("lengths", [[5, 5], [3, 7]], ids=["equal", "bucketed"])
def test_varlen_accepts_strided_inputs(lengths):
    q = torch.randn(4, 10, 8).transpose(0, 1)  # [10, 4, 8], not contiguous
    k, v = torch.randn(10, 4, 8), torch.randn(10, 4, 8)
    cu = torch.from_numpy(cu_seqlens_from_lengths(lengths))
    torch.testing.assert_close(varlen_attention(q, k, v, cu), reference_varlen_attention(q, k, v, cu))


def test_boundaries_are_not_stale_after_in_place_change():
    q, k, v, cu = _qkv([5, 5, 6])
    varlen_attention(q, k, v, cu)
    cu[1] = 2  # same tensor, new documents [2, 8, 6]
    torch.testing.assert_close(varlen_attention(q, k, v, cu), reference_varlen_attention(q, k, v, cu))


@pytest.mark.parametrize(
    "cu, kwargs, match",
    [
        ([1, 4, 8], {}, "start at 0"),
        ([0, 4, 7], {}, "ends at 7"),
        ([0, 4, 4, 8], {}, "length 0"),
        ([0, 2, 8], {"max_seqlen": 3}, "below the longest"),
        ([0, 8], {"softcap": 30.0}, "soft-capping"),
        ([0, 8], {"impl": "flash_attn"}, "needs CUDA"),
        ([0, 8], {"impl": "torch_varlen"}, "needs CUDA"),
        ([0, 8], {"impl": "magic"}, "unknown impl"),
        ([0, 8], {"dropout_p": 1.0}, "dropout_p"),
        ([0, 8], {"sliding_window": 0}, "sliding_window"),
    ],
)
def test_varlen_refusals(cu, kwargs, match):
    q, k, v, _ = _qkv([8])
    with pytest.raises(ValueError, match=match):
        varlen_attention(q, k, v, torch.tensor(cu), **kwargs)


def test_varlen_refuses_head_mismatch():
    q, k, v, cu = _qkv([8], hq=4, hk=3)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        varlen_attention(q, k, v, cu)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("impl", ["auto", "grouped_sdpa", "flash_attn", "torch_varlen"])
@pytest.mark.parametrize("hk, window", [(4, None), (2, None), (1, 5)])
def test_varlen_cuda(impl, hk, window):
    from padless.attention.varlen import flash_attn_available, torch_varlen_available

    if impl == "flash_attn" and not flash_attn_available():
        pytest.skip("flash-attn is not installed")
    if impl == "torch_varlen" and not torch_varlen_available():
        pytest.skip("torch varlen_attn needs torch.nn.attention.varlen and an sm80+ GPU")
    lengths = [1, 9, 1, 130, 2, 2, 17, 64]
    _check_against_reference(
        lengths, 4, hk, dtype=torch.bfloat16, atol=3e-2, impl=impl, device="cuda", sliding_window=window
    )


@pytest.mark.gpu
@cuda
def test_flash_attn_softcap_cuda():
    from padless.attention.varlen import flash_attn_available

    if not flash_attn_available():
        pytest.skip("flash-attn is not installed")
    _check_against_reference([3, 40, 7], dtype=torch.float16, atol=5e-3, impl="flash_attn", device="cuda", softcap=5.0)


# ------------------------------------------------------------------------------- transformers backend

LENGTHS = [[5, 1, 9, 3], [11, 6, 1]]  # row 1 ends with one token of padding, its own document
WIDTH = 18


@pytest.fixture(scope="module")
def registered():
    return register_padless_attention()


def _packed_batch(vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    seqs = [[torch.randint(0, vocab, (n,), generator=g) for n in row] for row in LENGTHS]
    input_ids = torch.stack([torch.cat(row) for row in seqs])  # [2, 18]
    position_ids = torch.stack([torch.from_numpy(position_ids_from_lengths(row)) for row in LENGTHS])
    cu = torch.from_numpy(cu_seqlens_from_lengths([n for row in LENGTHS for n in row])).to(torch.int32)
    varlen = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 11, "max_length_k": 11}
    return seqs, input_ids, position_ids, varlen


@pytest.mark.parametrize("family", ["tiny-gpt2", "tiny-llama"])
@pytest.mark.parametrize("with_cu", [False, True], ids=["position_ids", "cu_seq_lens"])
def test_packed_logits_equal_each_sequence_alone(registered, family, with_cu):
    reference = build_model(family)  # sdpa, same seed, same weights
    model = build_model(family, attn_implementation=registered)
    seqs, input_ids, position_ids, varlen = _packed_batch(model.config.vocab_size)
    with torch.no_grad():
        packed = model(input_ids=input_ids, position_ids=position_ids, **(varlen if with_cu else {})).logits
        for b, row in enumerate(seqs):
            start = 0
            for ids in row:
                alone = reference(input_ids=ids[None]).logits[0]
                torch.testing.assert_close(packed[b, start : start + ids.numel()], alone, atol=1e-5, rtol=1e-5)
                start += ids.numel()


def test_packed_exact_even_with_use_cache(registered):
    """use_cache=True disables transformers' packed-row detection for sdpa; padless reads position_ids itself."""
    model = build_model("tiny-llama", attn_implementation=registered)
    reference = build_model("tiny-llama")
    seqs, input_ids, position_ids, _ = _packed_batch(model.config.vocab_size)
    with torch.no_grad():
        packed = model(input_ids=input_ids, position_ids=position_ids, use_cache=True).logits
        alone = reference(input_ids=seqs[0][2][None]).logits[0]
    torch.testing.assert_close(packed[0, 6:15], alone, atol=1e-5, rtol=1e-5)


def test_sliding_window_model_matches_alone(registered):
    from transformers import AutoModelForCausalLM

    from padless.models.factory import tiny_config

    config = tiny_config("mistral")
    config.sliding_window, config.use_cache = 4, False
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model = AutoModelForCausalLM.from_config(config, attn_implementation=registered)
    model.load_state_dict(reference.state_dict())
    seqs, input_ids, position_ids, _ = _packed_batch(config.vocab_size)
    with torch.no_grad():
        packed = model(input_ids=input_ids, position_ids=position_ids).logits
        alone = reference(input_ids=seqs[1][0][None]).logits[0]
    torch.testing.assert_close(packed[1, :11], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["tiny-gpt2", "tiny-llama"])
def test_gradients_equal_sdpa_with_4d_mask(registered, family):
    dense = build_model(family)
    model = build_model(family, attn_implementation=registered)
    _, input_ids, position_ids, varlen = _packed_batch(model.config.vocab_size, seed=1)
    labels = input_ids.clone()
    labels[1, -1] = -100  # the padding document
    mask = additive_block_causal_mask(LENGTHS)
    dense(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, labels=labels).loss.backward()
    model(input_ids=input_ids, position_ids=position_ids, labels=labels, **varlen).loss.backward()
    grads = dict(dense.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_right_padding_mask_is_accepted(registered):
    model = build_model("tiny-gpt2", attn_implementation=registered)
    reference = build_model("tiny-gpt2")
    ids = torch.randint(0, 500, (1, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.tensor([[1, 1, 1, 1, 1, 0, 0]])).logits
        alone = reference(input_ids=ids[:, :5]).logits
    torch.testing.assert_close(out[:, :5], alone, atol=1e-5, rtol=1e-5)


def test_model_level_refusals(registered):
    """Boundaries sent together with what padless attention cannot split by document are refused."""
    model = build_model("tiny-llama", attn_implementation=registered)
    _, input_ids, position_ids, varlen = _packed_batch(model.config.vocab_size)
    with torch.no_grad():
        with pytest.raises(ValueError, match="attention_mask of shape"):
            mask = additive_block_causal_mask(LENGTHS)
            model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, **varlen)
        with pytest.raises(ValueError, match="do not restart"):
            model(input_ids=input_ids, **varlen)  # positions would run on across documents
        prefill = model(input_ids=input_ids[:1, :5], use_cache=True)
        cu = torch.tensor([0, 1], dtype=torch.int32)
        sent = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 1, "max_length_k": 1}
        with pytest.raises(ValueError, match="cache or cross-attention"):
            model(input_ids=input_ids[:1, 5:6], cache=prefill.cache, use_cache=True, **sent)


@pytest.mark.parametrize("family", ["tiny-gpt2", "tiny-llama"])
def test_forwards_without_documents_run_as_sdpa(registered, family):
    """No boundaries sent: a left-padded batch, a KV-cache step and ``generate`` run the model's own
    semantics (transformers' sdpa mask and attention), equal to the sdpa model bit for bit."""
    reference = build_model(family)
    model = build_model(family, attn_implementation=registered)
    ids = torch.randint(3, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :4] = 0  # left padding
    with torch.no_grad():
        assert torch.equal(
            model(input_ids=ids, attention_mask=mask).logits, reference(input_ids=ids, attention_mask=mask).logits
        )
        step = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
        assert torch.equal(
            model.generate(input_ids=ids, attention_mask=mask, **step),
            reference.generate(input_ids=ids, attention_mask=mask, **step),
        )
        prefill, prefill_ref = model(input_ids=ids[:1], use_cache=True), reference(input_ids=ids[:1], use_cache=True)
        nxt = ids[:1, :1]
        torch.testing.assert_close(
            model(input_ids=nxt, cache=prefill.cache, use_cache=True).logits,
            reference(input_ids=nxt, cache=prefill_ref.cache, use_cache=True).logits,
            atol=1e-6,
            rtol=1e-5,
        )


class _Layer(torch.nn.Module):
    is_causal = True


def _direct_inputs(lengths=(3, 4, 2)):
    q, k, v, cu = _qkv(list(lengths), hq=2, hk=2)
    as_hf = lambda x: x.detach().reshape(1, -1, 2, 8).transpose(1, 2)  # noqa: E731 [1, H, T, D]
    return as_hf(q), as_hf(k), as_hf(v), q.detach(), k.detach(), v.detach(), cu


def test_packed_documents_context_for_models_that_forward_nothing():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v, q3, k3, v3, cu = _direct_inputs()
    out, _ = padless_attention(_Layer(), q, k, v, None)  # nothing sent: one causal sequence, as sdpa runs it
    assert torch.equal(out, sdpa_attention_forward(_Layer(), q, k, v, None, dropout=0.0, scaling=None)[0])
    position_ids = torch.from_numpy(position_ids_from_lengths([3, 4, 2]))[None]
    with packed_documents(position_ids=position_ids):
        out, weights = padless_attention(_Layer(), q, k, v, None)
    assert weights is None and out.shape == (1, 9, 2, 8)
    torch.testing.assert_close(out[0], reference_varlen_attention(q3, k3, v3, cu))


def test_a_bidirectional_layer_outside_the_packed_rows_runs_as_sdpa():
    """A vision encoder's layers (bidirectional, given no document boundaries: each image is its own
    batch entry, or Qwen-VL splits by image itself) run as transformers' sdpa backend runs them, so a
    vision-language model can train its text on padless attention; a bidirectional layer given packed
    positions is refused (above)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v, *_ = _direct_inputs()
    layer = _Layer()
    layer.is_causal = False
    out, _ = padless_attention(layer, q, k, v, None)
    want, _ = sdpa_attention_forward(layer, q, k, v, None, dropout=0.0, scaling=None)
    torch.testing.assert_close(out, want)
    mask = torch.zeros(1, 1, 9, 9)
    out, _ = padless_attention(layer, q, k, v, mask)
    torch.testing.assert_close(out, sdpa_attention_forward(layer, q, k, v, mask, dropout=0.0, scaling=None)[0])


_SENT = {"cu_seq_lens_q": torch.tensor([0, 3, 7, 9], dtype=torch.int32)}
_SENT["cu_seq_lens_k"] = _SENT["cu_seq_lens_q"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"is_causal": False, **_SENT}, "causal only"),
        ({"s_aux": torch.zeros(2), **_SENT}, "attention sinks"),
        ({"cu_seq_lens_q": torch.tensor([0, 9], dtype=torch.int32)}, "both cu_seq_lens_q and cu_seq_lens_k"),
        ({"cu_seq_lens_q": torch.tensor([0, 9]), "cu_seq_lens_k": torch.tensor([0, 4, 9])}, "differ"),
        ({"position_ids": torch.zeros(3, 1, 9, dtype=torch.long), **_SENT}, r"\[batch, length\]"),
    ],
)
def test_adapter_refusals(kwargs, match):
    q, k, v, *_ = _direct_inputs()
    with pytest.raises(ValueError, match=match):
        padless_attention(_Layer(), q, k, v, None, **kwargs)


def test_cu_seqlens_from_position_ids_literal():
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]])
    assert cu_seqlens_from_position_ids(position_ids, 2).tolist() == [0, 3, 5, 6, 10, 12]
    assert cu_seqlens_from_position_ids(torch.tensor([[0, 1, 0]]), 2).tolist() == [0, 2, 3, 5, 6]


def test_register_is_idempotent():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert register_padless_attention() == register_padless_attention() == "padless"
    assert AttentionInterface._global_mapping["padless"] is padless_attention
    assert "padless" in AttentionMaskInterface._global_mapping


# -------------------------------------------------------------------------------------- selection


def test_backend_inputs_table():
    assert {name: backend_inputs(name) for name in BACKENDS} == {
        "padless": "varlen",
        "sdpa": "mask4d",
        "eager": "mask4d",
        "flash_attention_2": "varlen",
        "flex_attention": "position_ids",
    }
    with pytest.raises(ValueError, match="no known way"):
        backend_inputs("paged|eager")


def _config(family, **overrides):
    from padless.models.factory import tiny_config

    config = tiny_config(family)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


F32, BF16 = torch.float32, torch.bfloat16


@pytest.mark.parametrize(
    "requested, device, dtype, config, max_length, expected",
    [
        (None, "cpu", F32, "gpt2", None, "padless"),
        (None, "cpu", BF16, "llama", None, "padless"),
        (None, "cuda", BF16, "llama", None, "padless"),
        ("sdpa", "cpu", F32, "gpt2", None, "sdpa"),
        ("eager", "cpu", F32, "llama", None, "eager"),
        ("flex_attention", "cuda", BF16, "llama", None, "flex_attention"),
        ("sdpa", "cpu", F32, "window", 64, "sdpa"),  # rows no longer than the window: the mask is exact
        (None, "cpu", F32, "softcap", 512, "eager"),  # soft-capping: eager, its window covering the rows
        (None, "cpu", F32, None, None, "padless"),
    ],
)
def test_resolve_backend(requested, device, dtype, config, max_length, expected):
    configs = {
        "gpt2": lambda: _config("gpt2"),
        "llama": lambda: _config("llama", use_cache=False),
        "window": lambda: _config("mistral", sliding_window=64),
        "softcap": lambda: _gemma2_config(),
        None: lambda: None,
    }
    got = resolve_backend(requested, device=device, dtype=dtype, config=configs[config](), max_length=max_length)
    assert got == expected


def _gemma2_config():
    from transformers import Gemma2Config

    return Gemma2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )


def _bloom_config():
    from transformers import BloomConfig

    return BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=2)


@pytest.mark.parametrize(
    "requested, device, dtype, config, match",
    [
        ("flex_attention", "cpu", F32, _config("llama"), "no backward on CPU.*use backend 'padless'"),
        ("flex_attention", "cuda", BF16, _config("gpt2"), "does not support flex_attention"),
        ("flex_attention", "cuda", BF16, _config("llama", use_cache=True), "use_cache=True"),
        ("flash_attention_2", "cpu", BF16, _config("llama"), "CUDA only.*use backend 'padless'"),
        ("flash_attention_2", "cuda", F32, _config("llama"), "fp16 or bf16"),
        ("sdpa", "cpu", F32, _config("mistral", sliding_window=64), None),  # the 4D mask carries the window
        (
            "eager",
            "cpu",
            F32,
            _bloom_config(),
            "ALiBi positions: BLOOM builds its ALiBi bias.*; no attention backend can$",
        ),
        ("sdpa", "cpu", F32, None, None),
        ("nope", "cpu", F32, None, "unknown attention backend"),
    ],
)
def test_resolve_backend_refusals(requested, device, dtype, config, match):
    if match is None:
        assert resolve_backend(requested, device=device, dtype=dtype, config=config) == requested
        return
    with pytest.raises(ValueError, match=match):
        resolve_backend(requested, device=device, dtype=dtype, config=config)


def test_resolve_backend_refuses_padless_for_softcap_on_cpu():
    with pytest.raises(ValueError, match="soft-capping.*use backend 'eager'"):
        resolve_backend("padless", device="cpu", dtype=F32, config=_gemma2_config(), max_length=512)
    # rows longer than Gemma2's window (4096): eager, its 4D masks carrying the window per layer type
    assert resolve_backend(device="cpu", dtype=F32, config=_gemma2_config()) == "eager"


def test_resolve_backend_registers_padless(registered):
    model = build_model("tiny-gpt2")
    name = resolve_backend(device="cpu", dtype=torch.float32, config=model)
    model.set_attn_implementation(name)
    assert model.config._attn_implementation == "padless"
