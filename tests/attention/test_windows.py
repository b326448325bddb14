"""Sliding windows stay windows inside packed documents; one rule decides what is exact.

Every model here is a tiny random config whose window (8 tokens) is shorter than most documents
(up to 20 tokens), fed the way a user does: ``PackingCollator.for_model(model, ...)`` then
``model(**batch)``. Packed logits must equal each document run alone (fp32, 1e-5), or the set-up is
refused with an error naming a backend that works.
"""

from __future__ import annotations

import pytest
import torch

from conftest import make_features
from padless.attention.backend import register_padless_attention
from padless.attention.masks import additive_block_causal_mask, block_causal_mask
from padless.attention.rules import attention_rules
from padless.attention.select import check_exact, resolve_backend
from padless.batching.batch import batch_to
from padless.batching.collate import PackingCollator

VOCAB, WINDOW, ROW = 64, 8, 32
LENGTHS = (20, 3, 13, 1, 17, 9)  # five of six documents longer than the window once packed with others
ATOL = 1e-5
BACKENDS = ("sdpa", "eager", "padless")
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
)
ALTERNATING = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def _mistral(**kw):
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM(MistralConfig(**TINY, sliding_window=WINDOW, **kw))


def _starcoder2():
    from transformers import Starcoder2Config, Starcoder2ForCausalLM

    return Starcoder2ForCausalLM(Starcoder2Config(**TINY, sliding_window=WINDOW, bos_token_id=0, eos_token_id=0))


def _gemma2(softcap=None):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    return Gemma2ForCausalLM(
        Gemma2Config(**TINY, head_dim=8, sliding_window=WINDOW, layer_types=ALTERNATING, attn_logit_softcapping=softcap)
    )


def _gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    return Gemma3ForCausalLM(Gemma3TextConfig(**TINY, head_dim=8, sliding_window=WINDOW, layer_types=ALTERNATING))


def _qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    # layers i >= max_window_layers slide: layers 2 and 3 here
    return Qwen2ForCausalLM(Qwen2Config(**TINY, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2))


WINDOWED = {
    "mistral": _mistral,
    "starcoder2": _starcoder2,
    "gemma2": _gemma2,
    "gemma2-softcap": lambda: _gemma2(softcap=50.0),
    "gemma3": _gemma3,
    "qwen2": _qwen2,
}


@pytest.fixture(autouse=True, scope="module")
def _registered():
    register_padless_attention()


def _model(make, backend):
    torch.manual_seed(0)
    model = make().eval()
    model.set_attn_implementation(backend)
    return model


def _max_packed_vs_alone(model, collator, feats, reference=None) -> float:
    """Largest |logit| difference between the packed batch and each document alone, run through
    ``reference`` (same weights; default ``model`` itself)."""
    batch = collator(feats)
    reference = model if reference is None else reference
    with torch.no_grad():
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits  # [R, L, V]
        worst = 0.0
        for i, f in enumerate(feats):
            ((_, row, offset, n),) = batch.placements.of_feature(i)
            alone = reference(input_ids=torch.tensor([f["input_ids"]]), use_cache=False).logits[0]  # [n, V]
            worst = max(worst, (alone - packed[row, offset : offset + n]).abs().max().item())
    return worst


def _supports(model, backend) -> bool:
    flags = {"sdpa": "_supports_sdpa", "eager": None, "padless": "_supports_attention_backend"}
    return flags[backend] is None or bool(getattr(type(model), flags[backend], False))


# ------------------------------------------------------------------------------------ the masks


def test_windowed_mask_literal():
    expected = [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]
    assert block_causal_mask([3, 2, 1], window=2).astype(int).tolist() == expected
    assert (additive_block_causal_mask([[3, 2, 1]], window=2)[0, 0] == 0).int().tolist() == expected


@pytest.mark.parametrize("window", [1, 2, 5, 64])
def test_additive_window_mask_matches_reference(window):
    rows = [[7, 1, 4, 3], [2, 9, 4]]
    mask = additive_block_causal_mask(rows, window=window)  # [B, 1, L, L]
    for b, row in enumerate(rows):
        assert ((mask[b, 0] == 0).numpy() == block_causal_mask(row, window=window)).all()
    with pytest.raises(ValueError, match="window must be a positive int"):
        additive_block_causal_mask(rows, window=0)


# ------------------------------------------------------------------------- which layers slide


def test_rules_read_windows_per_layer_type():
    from transformers import Qwen2Config

    assert attention_rules(_mistral().config).mask_windows(ROW) == WINDOW
    assert attention_rules(_mistral().config).mask_windows(WINDOW) is None  # rows within the window
    qwen = Qwen2Config(**TINY, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2)
    assert qwen.layer_types == ["full_attention", "full_attention", "sliding_attention", "sliding_attention"]
    assert attention_rules(qwen).mask_windows(ROW) == {"full_attention": None, "sliding_attention": WINDOW}
    no_window = Qwen2Config(**TINY, use_sliding_window=False, sliding_window=WINDOW)
    assert attention_rules(no_window).mask_windows(None) is None
    all_full = Qwen2Config(**TINY, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=4)
    assert attention_rules(all_full).mask_windows(None) is None
    gemma3 = attention_rules(_gemma3())
    assert gemma3.accepts_mask_dict and gemma3.mask_windows(None) == {
        "sliding_attention": WINDOW,
        "full_attention": None,
    }


# --------------------------------------------------- packed == alone, or refused naming a backend


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(WINDOWED))
def test_windowed_models_packed_equal_alone_or_refused(name, backend):
    """Alone runs on eager, the model's own mask: so a backend that dropped the window everywhere
    (packed and alone alike) would fail too, not only one that drops it when packing."""
    reference = _model(WINDOWED[name], "eager")
    torch.manual_seed(0)
    model = WINDOWED[name]().eval()
    feats = make_features(LENGTHS, vocab_size=VOCAB, seed=1)
    if not _supports(model, backend):  # transformers itself refuses the backend: so does padless
        with pytest.raises(ValueError, match="does not support.*use backend '(eager|padless)'"):
            check_exact(model, backend, device="cpu", dtype=torch.float32, max_length=ROW)
        return
    model.set_attn_implementation(backend)
    if name == "gemma2-softcap" and backend == "padless":  # soft-capping: no padless kernel on CPU
        with pytest.raises(ValueError, match="soft-capping.*use backend 'eager'"):
            PackingCollator.for_model(model, max_length=ROW)
        return
    collator = PackingCollator.for_model(model, max_length=ROW)
    assert _max_packed_vs_alone(model, collator, feats, reference) <= ATOL


@pytest.mark.parametrize("name", ["mistral", "gemma3", "qwen2"])
def test_a_mask_without_the_window_contaminates(name):
    """The control: the block-causal mask alone (what padless sent before) lets tokens see past the
    window, so the equality above is a test that can fail."""
    model = _model(WINDOWED[name], "sdpa")
    feats = make_features(LENGTHS, vocab_size=VOCAB, seed=1)
    blind = PackingCollator(model_free=True, max_length=ROW, attention="mask4d")
    assert _max_packed_vs_alone(model, blind, feats) > 1e-2


def test_layers_that_differ_get_a_mask_per_layer_type():
    model = _model(_gemma3, "eager")
    batch = PackingCollator.for_model(model, max_length=ROW)(make_features(LENGTHS, vocab_size=VOCAB))
    masks = batch["attention_mask"]
    assert set(masks) == {"sliding_attention", "full_attention"}
    assert not torch.equal(masks["sliding_attention"], masks["full_attention"])
    moved = batch_to(batch, "meta")  # a dict of masks travels with the batch
    assert {m.device.type for m in moved["attention_mask"].values()} == {"meta"}
    # rows no longer than the window: one plain block-causal mask
    short = PackingCollator.for_model(model, max_length=WINDOW)(make_features([5, 3, 8], vocab_size=VOCAB))
    assert isinstance(short["attention_mask"], torch.Tensor)


def test_a_model_without_per_layer_masks_is_refused_for_mixed_windows():
    """Mistral's modeling builds one mask for all layers; given ``layer_types`` that differ, a 4D mask
    cannot follow them, so mask4d is refused and padless (which takes each layer's own window) named."""
    model = _mistral(layer_types=ALTERNATING)
    with pytest.raises(ValueError, match="takes no 4D mask per layer type; use backend 'padless'"):
        check_exact(model, "sdpa", device="cpu", dtype=torch.float32, max_length=ROW)
    model.set_attn_implementation("padless")
    feats = make_features(LENGTHS, vocab_size=VOCAB, seed=1)
    assert _max_packed_vs_alone(model.eval(), PackingCollator.for_model(model, max_length=ROW), feats) <= ATOL


def test_gemma3_local_windows_in_long_rows():
    """The real case, scaled down: local layers with a window of 16, global layers none, rows of 96."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        **{**TINY, "num_hidden_layers": 3},
        head_dim=8,
        sliding_window=16,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    )
    feats = make_features([60, 30, 2, 45, 17, 40], vocab_size=VOCAB, seed=3)
    for backend in BACKENDS:
        torch.manual_seed(0)
        model = Gemma3ForCausalLM(config).eval()
        model.set_attn_implementation(backend)
        assert _max_packed_vs_alone(model, PackingCollator.for_model(model, max_length=96), feats) <= ATOL, backend


# ------------------------------------------------------------- architectures padless was not tuned for


def _llama_gqa():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**{**TINY, "num_key_value_heads": 1}))


def _neox_partial_rotary():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    return GPTNeoXForCausalLM(
        GPTNeoXConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            rotary_pct=0.25,
            attention_dropout=0.0,
            hidden_dropout=0.0,
        )
    )


def _phi_partial_rotary():
    from transformers import PhiConfig, PhiForCausalLM

    return PhiForCausalLM(PhiConfig(**TINY, partial_rotary_factor=0.5, resid_pdrop=0.0, embd_pdrop=0.0))


def _mixtral_moe():
    from transformers import MixtralConfig, MixtralForCausalLM

    return MixtralForCausalLM(MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW))


def _qwen2_moe():
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    return Qwen2MoeForCausalLM(
        Qwen2MoeConfig(
            **TINY, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32
        )
    )


OTHERS = {
    "llama-gqa": _llama_gqa,
    "neox-partial-rotary": _neox_partial_rotary,
    "phi-partial-rotary": _phi_partial_rotary,
    "mixtral-moe-window": _mixtral_moe,
    "qwen2-moe": _qwen2_moe,
}


@pytest.mark.parametrize("name", list(OTHERS))
def test_untuned_architectures_packed_equal_alone_on_every_accepted_backend(name):
    feats = make_features(LENGTHS, vocab_size=VOCAB, seed=2)
    accepted = []
    for backend in BACKENDS:
        torch.manual_seed(0)
        model = OTHERS[name]().eval()
        try:
            check_exact(model, backend, device="cpu", dtype=torch.float32, max_length=ROW)
        except ValueError as exc:
            assert "use backend '" in str(exc)
            continue
        model.set_attn_implementation(backend)
        worst = _max_packed_vs_alone(model, PackingCollator.for_model(model, max_length=ROW), feats)
        assert worst <= ATOL, (backend, worst)
        accepted.append(backend)
    assert "padless" in accepted


# ----------------------------------------------------------------------------- one rule, asked by all

GRID_BACKENDS = ("sdpa", "eager", "padless", "flash_attention_2", "flex_attention")


@pytest.mark.parametrize("name", ["mistral", "gemma2-softcap", "qwen2"])
def test_every_path_asks_the_same_rule(name):
    """for_model, resolve_backend and verify accept or refuse exactly what check_exact does (on CPU,
    fp32, rows longer and shorter than the window)."""
    from padless.isolation.verify import verify_isolation

    model = WINDOWED[name]()
    for max_length in (WINDOW, ROW, None):
        for backend in GRID_BACKENDS:
            try:
                check_exact(model, backend, device="cpu", dtype=torch.float32, max_length=max_length)
                exact = True
            except ValueError:
                exact = False
            try:
                resolve_backend(backend, device="cpu", dtype=torch.float32, config=model, max_length=max_length)
                resolved = True
            except ValueError:
                resolved = False
            model.config._attn_implementation = backend  # what for_model reads; no kernel is loaded
            try:
                PackingCollator.for_model(model, max_length=max_length)
                collated = True
            except ValueError:
                collated = False
            assert exact == resolved == collated, (backend, max_length)
    model.set_attn_implementation("eager")
    report = verify_isolation(model.eval(), backends=GRID_BACKENDS, max_length=ROW)
    for result in report.results:
        backend, _, layout = result.backend.partition("+")  # "sdpa+shared_prompt": the tree layout's row
        try:
            check_exact(
                model,
                backend,
                device="cpu",
                dtype=torch.float32,
                max_length=None if layout else report.max_length,
                layout=layout or "documents",
            )
            assert result.status in ("pass", "unavailable"), result
        except ValueError:
            assert result.status == "refused", result


def test_for_model_refuses_flex_attention_on_cpu_like_resolve_backend():
    model = _llama_gqa()
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="no backward on CPU.*use backend 'padless'"):
        PackingCollator.for_model(model, max_length=ROW)
    with pytest.raises(ValueError, match="no backward on CPU.*use backend 'padless'"):
        resolve_backend("flex_attention", device="cpu", dtype=torch.float32, config=model)


def test_for_model_refuses_inputs_that_do_not_fit_the_backend():
    model = _model(_mistral, "sdpa")
    with pytest.raises(ValueError, match="attention='varlen' does not isolate documents on backend 'sdpa'"):
        PackingCollator.for_model(model, max_length=ROW, attention="varlen")
    with pytest.raises(ValueError, match="windows apply to the 4D mask only"):
        PackingCollator(model_free=True, attention="varlen", windows=WINDOW)
    with pytest.raises(ValueError, match="windows must be"):
        PackingCollator(model_free=True, windows={"sliding_attention": 0})


@pytest.mark.parametrize(
    "config_kw, match",
    [
        ({"use_bidirectional_attention": True}, "both directions"),
        (
            {"layer_types": ["sliding_attention", "linear_attention", "full_attention", "full_attention"]},
            "'linear_attention' mix tokens without the attention mask",
        ),
    ],
)
def test_model_wide_refusals_name_no_backend(config_kw, match):
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(**TINY, head_dim=8, sliding_window=WINDOW)
    for key, value in config_kw.items():
        setattr(config, key, value)
    for backend in BACKENDS:
        with pytest.raises(ValueError, match=f"{match}.*no attention backend can"):
            check_exact(config, backend, device="cpu", dtype=torch.float32)


def test_attention_sinks_refuse_padless():
    from transformers import GptOssConfig

    config = GptOssConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=2,
        num_experts_per_tok=1,
        sliding_window=WINDOW,
    )
    with pytest.raises(ValueError, match=r"attention sinks.*use backend 'eager'"):
        check_exact(config, "padless", device="cpu", dtype=torch.float32)


# ------------------------------------------------------------------------- verify sees the problem


def test_verify_default_lengths_exceed_the_window(monkeypatch):
    """verify's default sequences include one longer than the model's window, so a 4D mask without
    the window (simulated by a rule that forgets it) shows as a failure, not a pass."""
    from padless.attention import select
    from padless.isolation.verify import DEFAULT_LENGTHS, default_lengths, verify_isolation

    model = _model(lambda: _mistral(), "sdpa")
    model.config.sliding_window = 40  # longer than every built-in length
    assert default_lengths(model) == (*DEFAULT_LENGTHS, 44)
    assert default_lengths(_llama_gqa()) == DEFAULT_LENGTHS
    assert verify_isolation(model, backends=("sdpa",)).passed
    monkeypatch.setattr(select, "mask_windows", lambda model, max_length: None)
    result = verify_isolation(model, backends=("sdpa",)).results[0]  # the documents row (then the tree row)
    assert result.status == "fail" and result.max_logit_diff > 1e-2


@pytest.mark.parametrize(
    "make, match",
    [
        # RoBERTa numbers positions from padding_idx + 1 when it computes them: restarted ids from 0 differ
        (lambda: __import__("transformers").RobertaConfig(is_decoder=True), "padding_idx \\+ 1"),
        (lambda: __import__("transformers").XLMRobertaConfig(is_decoder=True), "padding_idx \\+ 1"),
        # a BERT-family causal LM attends both ways unless it is configured as a decoder
        (lambda: __import__("transformers").BertConfig(is_decoder=False), "both directions"),
    ],
)
def test_position_offsets_and_encoders_are_refused_on_every_backend(make, match):
    for backend in BACKENDS:
        with pytest.raises(ValueError, match=f"{match}.*no attention backend can"):
            check_exact(make(), backend, device="cpu", dtype=torch.float32)


def test_a_bert_decoder_is_accepted():
    from transformers import BertConfig

    check_exact(BertConfig(is_decoder=True), "eager", device="cpu", dtype=torch.float32)


def test_a_window_the_models_own_mask_ignores_is_not_carried():
    """Moshi has ``sliding_window`` in its config, but its mask path builds a plain causal mask on sdpa and
    eager: alone it attends to the whole document, so the packed mask must too."""
    from transformers import MoshiConfig

    rules = attention_rules(MoshiConfig(sliding_window=WINDOW))
    assert rules.mask_windows(ROW) is None
    assert attention_rules(_mistral().config).mask_windows(ROW) == WINDOW  # Mistral's mask does slide


def test_per_token_layer_types_are_not_state():
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(**TINY, head_dim=8, sliding_window=WINDOW)
    config.layer_types = ["sliding_attention", "moe", "full_attention", "mlp"]
    assert attention_rules(config).other_layer_types == ()


def test_chunked_attention_is_carried_by_position_ids_or_refused_per_backend():
    """Llama 4's chunks: on sdpa / eager a packed batch of restarted position_ids alone lets transformers
    build per-document chunked masks (a 4D mask would replace the chunks); padless attention has no chunks."""
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    from padless.attention.select import model_inputs

    config = Llama4TextConfig(
        **TINY, attention_chunk_size=WINDOW, head_dim=8, intermediate_size_mlp=64, num_local_experts=2
    )
    assert attention_rules(config).chunk_size == WINDOW and "chunked_attention" in config.layer_types
    with pytest.raises(ValueError, match="the model uses chunked attention"):
        check_exact(config, "padless", device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="tree of a shared prompt carries no chunked attention"):
        check_exact(config, "sdpa", device="cpu", dtype=torch.float32, layout="shared_prompt")
    for backend in ("sdpa", "eager"):
        check_exact(config, backend, device="cpu", dtype=torch.float32)
        assert model_inputs(config, backend) == "position_ids"
        torch.manual_seed(0)
        model = Llama4ForCausalLM(config).eval()
        model.set_attn_implementation(backend)
        feats = make_features(LENGTHS, vocab_size=VOCAB, seed=3)
        batch = PackingCollator.for_model(model, max_length=ROW)(feats)
        assert "attention_mask" not in batch and batch["use_cache"] is False
        with torch.no_grad():
            logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
            pl = batch.placements
            for j in range(pl.feature.size):
                r, o, n = int(pl.row[j]), int(pl.offset[j]), int(pl.length[j])
                alone = model(input_ids=torch.tensor([feats[int(pl.feature[j])]["input_ids"]])).logits[0]
                torch.testing.assert_close(logits[r, o : o + n], alone, atol=1e-5, rtol=1e-5)
        # the plain block mask would be wrong here: the chunks are what a 4D mask loses
        plain = PackingCollator(model_free=True, max_length=ROW)(feats)
        with torch.no_grad():
            wrong = model(**{k: v for k, v in plain.items() if k != "labels"}).logits
        docs = [(int(pl.row[j]), int(pl.offset[j]), int(pl.length[j])) for j in range(pl.feature.size)]
        assert max((wrong[r, o : o + n] - logits[r, o : o + n]).abs().max().item() for r, o, n in docs) > 1e-3


def test_a_model_that_expands_its_own_2d_mask_is_refused_the_4d_mask():
    from transformers import OpenAIGPTConfig

    config = OpenAIGPTConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4)
    assert not attention_rules(config).takes_4d_mask and attention_rules(_mistral().config).takes_4d_mask
    with pytest.raises(ValueError, match="expands a 2D padding mask itself"):
        check_exact(config, "eager", device="cpu", dtype=torch.float32)


def test_a_config_with_per_layer_head_sizes_is_judged_not_crashed():
    """Gemma 4's config refuses a global head_dim (it varies per layer): the rule answers anyway."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import sweep_support

    config = sweep_support.tiny_config("gemma4_text")
    check_exact(config, "sdpa", device="cpu", dtype=torch.float32, max_length=ROW)
