"""Token mixers without a mask (gated DeltaNet, Mamba, short convolutions, ...) run on each packed
document alone: packed logits equal each document alone after ``enable_per_document_mixers`` and are
contaminated without it, for every hybrid and state-space family of the pinned transformers with a tiny
config that keeps the family's own layer pattern (a mixer and an attention layer where it has both)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as T

import padless
from conftest import make_features
from padless.attention import mixers
from padless.attention.backend import packed_documents
from padless.attention.mixers import (
    _SCAN_FUNCTIONS,
    KERNEL,
    PER_DOCUMENT,
    SCAN,
    MixerInfo,
    disable_per_document_mixers,
    enable_per_document_mixers,
    mixer_layers,
    mixer_refusal,
)
from padless.layout import lengths_from_position_ids
from padless.models.factory import tiny_config

VOCAB = 128
SCANNED_KINDS = set(_SCAN_FUNCTIONS)
EXACT, CONTAMINATED = 1e-5, 1e-3
# initializer_range 0.1 (not 0.02): with tiny weights a short convolution's leak is below 1e-3
_COMMON = dict(
    initializer_range=0.1,
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
_MAMBA2 = dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1, mamba_chunk_size=8, mamba_expand=2)
_DELTANET = dict(
    head_dim=8,
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
)
_HYBRID = ["linear_attention", "full_attention"]
_NO_FFN = {k: v for k, v in _COMMON.items() if k != "intermediate_size"}  # MoE-only configs
_MOE = dict(moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2)

_TWO = dict(num_hidden_layers=2)
_SSM = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2)
_MLA = dict(qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
_KV4 = {**_COMMON, "num_key_value_heads": 4}

CONFIGS: dict[str, tuple[type, dict]] = {
    # family -> (config class, its tiny kwargs): a mixer layer and an attention layer where it has both
    "qwen3_5_text": (T.Qwen3_5TextConfig, dict(**_COMMON, **_TWO, layer_types=_HYBRID, **_DELTANET)),
    "qwen3_next": (T.Qwen3NextConfig, dict(**_NO_FFN, **_TWO, layer_types=_HYBRID, **_DELTANET, **_MOE)),
    "qwen3_5_moe_text": (T.Qwen3_5MoeTextConfig, dict(**_NO_FFN, **_TWO, layer_types=_HYBRID, **_DELTANET, **_MOE)),
    "lara_mini": (T.LaraMiniConfig, dict(**_NO_FFN, **_TWO, layer_types=_HYBRID, **_DELTANET, **_MOE)),
    "olmo_hybrid": (
        T.OlmoHybridConfig,
        dict(**_COMMON, **_TWO, layer_types=_HYBRID, **{k: v for k, v in _DELTANET.items() if k != "head_dim"}),
    ),
    "kimi_linear": (
        T.KimiLinearConfig,
        dict(
            **_KV4,
            **_TWO,
            layer_types=_HYBRID,
            kv_lora_rank=16,
            **_MLA,
            linear_head_dim=8,
            linear_num_heads=4,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            mlp_layer_types=["dense", "sparse"],
        ),
    ),
    "bailing_hybrid": (
        T.BailingHybridConfig,
        dict(
            **_KV4,
            **_TWO,
            layer_types=_HYBRID,
            **_MLA,
            head_dim=8,
            mlp_layer_types=["dense", "dense"],
            moe_intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            num_mtp_layers=0,
            layer_group_size=2,
        ),
    ),
    "lfm2": (T.Lfm2Config, dict(**_COMMON, **_TWO, layer_types=["conv", "full_attention"], conv_L_cache=3)),
    "lfm2_moe": (
        T.Lfm2MoeConfig,
        dict(
            **_COMMON,
            **_TWO,
            layer_types=["conv", "full_attention"],
            num_dense_layers=1,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
        ),
    ),
    "lfm3": (T.Lfm3Config, dict(**_COMMON, **_TWO, layer_types=["conv", "full_attention"], head_dim=8)),
    "bamba": (T.BambaConfig, dict(**_COMMON, **_TWO, attn_layer_indices=[1], **_MAMBA2)),
    "falcon_h1": (T.FalconH1Config, dict(**_COMMON, **_TWO, head_dim=8, mamba_d_ssm=64, **_MAMBA2)),
    "granitemoehybrid": (
        T.GraniteMoeHybridConfig,
        dict(**_COMMON, **_TWO, layer_types=["mamba", "attention"], num_local_experts=0, **_MAMBA2),
    ),
    "jamba": (
        T.JambaConfig,
        dict(
            **_COMMON,
            **_TWO,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            num_experts=2,
            mamba_d_state=8,
            mamba_d_conv=4,
            mamba_expand=2,
        ),
    ),
    "nemotron_h": (
        T.NemotronHConfig,
        dict(
            **_COMMON,
            num_hidden_layers=3,
            hybrid_override_pattern="M*-",
            head_dim=8,
            mamba_num_heads=4,
            mamba_head_dim=16,
            ssm_state_size=8,
            n_groups=1,
            chunk_size=8,
            expand=2,
        ),
    ),
    "zamba": (
        T.ZambaConfig,
        dict(
            **_COMMON,
            num_hidden_layers=3,
            mamba_d_state=8,
            n_mamba_heads=2,
            mamba_expand=2,
            layers_block_type=["linear_attention", "hybrid", "hybrid"],
        ),
    ),
    "zamba2": (
        T.Zamba2Config,
        dict(
            **_COMMON,
            **_TWO,
            layers_block_type=["mamba", "hybrid"],
            mamba_d_state=8,
            mamba_ngroups=1,
            mamba_headdim=16,
            n_mamba_heads=4,
            chunk_size=8,
        ),
    ),
    "minimax": (
        T.MiniMaxConfig,
        dict(
            **_COMMON, **_TWO, layer_types=_HYBRID, head_dim=8, num_local_experts=2, num_experts_per_tok=1, block_size=8
        ),
    ),
    "recurrent_gemma": (
        T.RecurrentGemmaConfig,
        dict(
            **_SSM,
            initializer_range=0.1,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=1,
            lru_width=32,
            block_types=["recurrent", "attention"],
            conv1d_width=4,
            attention_window_size=64,
            pad_token_id=0,
        ),
    ),
    # state-space / recurrent models without attention (and without position_ids)
    "mamba": (T.MambaConfig, dict(**_SSM, state_size=8, expand=2, conv_kernel=4)),
    "mamba2": (
        T.Mamba2Config,
        dict(**_SSM, state_size=8, expand=2, num_heads=4, head_dim=16, n_groups=1, chunk_size=8, conv_kernel=4),
    ),
    "falcon_mamba": (T.FalconMambaConfig, dict(**_SSM, state_size=8, expand=2, conv_kernel=4)),
    "rwkv": (T.RwkvConfig, dict(**_SSM, attention_hidden_size=32, intermediate_size=64, context_length=256)),
    "xlstm": (
        T.xLSTMConfig,
        dict(**_SSM, embedding_dim=32, num_heads=2, chunk_size=8, qk_dim_factor=0.5, v_dim_factor=1.0),
    ),
}
NO_ATTENTION = {"mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm"}
LENGTHS = [7, 13, 5, 11]  # one row; default grouping: [13, 11] and [7, 5], both right-padded


def build(family: str, attn: str | None) -> torch.nn.Module:
    torch.manual_seed(0)
    config_class, kwargs = CONFIGS[family]
    config = config_class(**kwargs)
    backend = {} if attn is None else {"attn_implementation": attn}
    return T.AutoModelForCausalLM.from_config(config, **backend).eval()


def packed_batch(attn: str | None, lengths=LENGTHS, max_length=None, seed=0) -> dict:
    """What the model-free collator sends: mask4d for sdpa/eager, varlen for padless, and position ids
    alone for models without attention (their documents come from ``packed_documents``)."""
    attention = "varlen" if attn == "padless" else "mask4d"
    collator = padless.PackingCollator(model_free=True, max_length=max_length, attention=attention)
    batch = collator(make_features(lengths, vocab_size=VOCAB, seed=seed))
    if attn is None:
        batch.pop("attention_mask", None)
    return batch


def packed_logits(model, batch: dict, attn: str | None) -> torch.Tensor:
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    if attn is None:  # the forward takes no position_ids: boundaries from the context
        position_ids = inputs.pop("position_ids")
        with packed_documents(position_ids=position_ids):
            return model(**inputs).logits
    return model(**inputs).logits


def alone_logits(model, batch: dict) -> torch.Tensor:
    """``[B, L, V]``: each document of each row run alone (no packing, no mask), put back in place."""
    rows = []
    for ids, pos in zip(batch["input_ids"], batch["position_ids"], strict=True):
        parts, at = [], 0
        for n in lengths_from_position_ids(pos.numpy()):
            parts.append(model(ids[None, at : at + n], use_cache=False).logits[0])
            at += int(n)
        rows.append(torch.cat(parts))
    return torch.stack(rows)


def max_diff(model, batch, attn) -> float:
    with torch.no_grad():
        return (packed_logits(model, batch, attn) - alone_logits(model, batch)).abs().max().item()


CASES = [(f, a) for f in CONFIGS if f not in NO_ATTENTION for a in ("sdpa", "eager")]
CASES += [(f, None) for f in sorted(NO_ATTENTION)]


@pytest.mark.parametrize(("family", "attn"), CASES, ids=[f"{f}-{a or 'none'}" for f, a in CASES])
def test_packed_equals_alone(family, attn):
    model = build(family, attn)
    batch = packed_batch(attn)
    before = max_diff(model, batch, attn)
    assert before > CONTAMINATED, f"{family}: the unpatched model is not contaminated ({before:.2e})"
    names = enable_per_document_mixers(model)
    layers = mixer_layers(model)
    assert names == [m.name for m in layers] and names
    assert all(m.how == (SCAN if m.kind in SCANNED_KINDS else PER_DOCUMENT) for m in layers)
    if family not in NO_ATTENTION:  # the family's own pattern: softmax attention beside the mixers
        attention = [n for n, m in model.named_modules() if type(m).__name__.endswith("Attention") and n not in names]
        assert attention, f"{family}: the tiny config has no attention layer"
    after = max_diff(model, batch, attn)
    assert after <= EXACT, f"{family} {attn}: packed vs alone {after:.2e} after enable_per_document_mixers"


PADLESS_FAMILIES = [
    f
    for f in CONFIGS
    if f not in NO_ATTENTION
    and f
    not in {
        # padless attention itself cannot run these (not the mixers): the MLA value head differs from the
        # query head (kimi_linear, bailing_hybrid); the decoder layers pass attention no position_ids or
        # boundaries (granitemoehybrid, zamba, recurrent_gemma)
        "kimi_linear",
        "bailing_hybrid",
        "granitemoehybrid",
        "zamba",
        "recurrent_gemma",
    }
]


@pytest.mark.parametrize("family", PADLESS_FAMILIES)
def test_padless_backend_cu_seq_lens(family):
    """With padless attention the collator sends cu_seq_lens_q/k: the mixers take their documents
    from them (and strip them, so the torch fallbacks do not refuse them)."""
    padless.register_padless_attention()
    model = build(family, "padless")
    batch = packed_batch("padless", lengths=[7, 13, 5, 11, 6], max_length=20)
    assert batch["input_ids"].shape[0] > 1  # documents of several rows share padded groups
    enable_per_document_mixers(model)
    assert max_diff(model, batch, "padless") <= EXACT


@pytest.mark.parametrize("family", ["qwen3_5_text", "bamba", "lfm2", "rwkv", "recurrent_gemma"])
@pytest.mark.parametrize("max_padding", [0.0, 1000.0])
def test_grouping_does_not_change_outputs(family, max_padding):
    """``max_padding=0``: every document of its own length runs alone (the slow reference);
    ``1000``: all documents in one group padded to the longest (the most padding)."""
    attn = None if family in NO_ATTENTION else "sdpa"
    model = build(family, attn)
    batch = packed_batch(attn, lengths=[7, 13, 5, 11, 6], max_length=20)
    enable_per_document_mixers(model, max_padding=max_padding)
    assert max_diff(model, batch, attn) <= EXACT


def _document_loss(logits, ids):
    """Summed next-token cross-entropy of one document (``logits`` ``[1, n, V]``, ``ids`` ``[1, n]``)."""
    predicted, targets = logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1)
    return torch.nn.functional.cross_entropy(predicted, targets, reduction="sum")


def assert_packed_grads_equal_alone(model, packed_logits_fn, input_ids, lengths):
    """The summed per-document loss of one packed row (``packed_logits_fn()`` -> ``[1, T, V]`` logits of
    ``input_ids`` ``[1, T]``, documents of ``lengths`` in order) has the gradients of the documents
    trained alone."""
    model.zero_grad()
    logits, at, total = packed_logits_fn(), 0, 0
    for n in lengths:
        total = total + _document_loss(logits[:, at : at + n], input_ids[:, at : at + n])
        at += n
    total.backward()
    packed = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    at = 0
    for n in lengths:
        ids = input_ids[:, at : at + n]
        _document_loss(model(ids, use_cache=False).logits, ids).backward()
        at += n
    alone = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert packed.keys() == alone.keys() and packed
    for name in packed:  # 1e-5 of the gradient's scale: OLMo-hybrid's reach 15, summed in another order
        atol = EXACT * max(1.0, alone[name].abs().max().item())
        torch.testing.assert_close(packed[name], alone[name], atol=atol, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize(
    "family",
    ["qwen3_5_text", "qwen3_next", "olmo_hybrid", "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h", "zamba2",
     "lfm2", "lfm3", "mamba", "mamba2"],
)  # fmt: skip
def test_packed_gradients_equal_alone(family):
    """A training step: the summed token loss of the packed row has the gradients of the documents
    trained alone."""
    attn = None if family in NO_ATTENTION else "sdpa"
    model = build(family, attn).train()
    enable_per_document_mixers(model)
    batch = packed_batch(attn)

    assert_packed_grads_equal_alone(model, lambda: packed_logits(model, batch, attn), batch["input_ids"], LENGTHS)


@pytest.mark.parametrize("family", ["bamba", "mamba", "recurrent_gemma"])
@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_recomputes_per_document(family, reentrant):
    """Checkpointing re-runs each decoder layer in backward, outside the forward (and outside the
    packed_documents context of the attention-free models): the recomputation must split the same
    documents, so the gradients equal those without checkpointing."""
    attn = None if family in NO_ATTENTION else "sdpa"
    batch = packed_batch(attn)
    grads = []
    for checkpointing in (False, True):
        model = build(family, attn).train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        enable_per_document_mixers(model)
        packed_logits(model, batch, attn).square().mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("family", ["qwen3_5_text", "bamba", "mamba"])
def test_unpacked_batch_runs_unchanged(family):
    """One document per row (no position_ids, or positions counting from 0 in every row): the patched
    layers run exactly as before, bit for bit."""
    attn = None if family in NO_ATTENTION else "sdpa"
    model = build(family, attn)
    ids = torch.randint(3, VOCAB, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model(ids, use_cache=False).logits
        enable_per_document_mixers(model)
        assert torch.equal(model(ids, use_cache=False).logits, plain)
        positions = torch.arange(17).expand(2, -1)
        with packed_documents(position_ids=positions):
            assert torch.equal(model(ids, use_cache=False).logits, plain)


@pytest.mark.parametrize("family", ["qwen3_5_text", "bamba", "recurrent_gemma"])
def test_left_padded_generation_runs_unchanged(family):
    """Left padding restarts position_ids too (generation computes them from the mask): with a 2D
    padding mask they mark padding, not documents (transformers' own rule), so nothing is split."""
    model = build(family, "sdpa")
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 9, dtype=torch.long)
    ids[0, :4], mask[0, :4] = 0, 0
    plain = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    enable_per_document_mixers(model)
    assert torch.equal(model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False), plain)


def test_boundaries_sent_with_a_cache_are_refused():
    model = build("bamba", "sdpa")
    collator = padless.PackingCollator.for_model(model, max_length=64)
    batch = collator(make_features(LENGTHS, vocab_size=VOCAB, seed=0))
    assert "cu_seq_lens_q" in batch  # sent beside the 4D mask: the mixers read them
    batch["use_cache"] = True
    with pytest.raises(ValueError, match="use_cache=False"):
        packed_logits(model, batch, "sdpa")


def test_restarted_positions_with_a_cache_run_the_models_own_code():
    """A peer's batch of position ids alone, with a cache: transformers itself reads no documents then
    (its packed-row rule needs no cache), and neither do the mixers: the model's own code, bit for bit."""
    model = build("bamba", "sdpa")
    batch = packed_batch("sdpa")
    batch.pop("attention_mask")
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "use_cache")}
    with torch.no_grad():
        plain = model(**inputs, use_cache=True).logits
        enable_per_document_mixers(model)
        assert torch.equal(model(**inputs, use_cache=True).logits, plain)


def test_enable_is_idempotent_and_disable_restores():
    model = build("bamba", "sdpa")
    batch = packed_batch("sdpa")
    first = enable_per_document_mixers(model)
    assert enable_per_document_mixers(model) == first == ["model.layers.0.mamba"]
    assert max_diff(model, batch, "sdpa") <= EXACT
    assert disable_per_document_mixers(model) == first
    assert max_diff(model, batch, "sdpa") > CONTAMINATED
    assert disable_per_document_mixers(model) == []


def test_documents_from_packed_documents_cu_seqlens():
    model = build("mamba2", None)
    batch = packed_batch(None)
    enable_per_document_mixers(model)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(LENGTHS)]), dtype=torch.int32)
    with torch.no_grad():
        with packed_documents(cu_seqlens=cu):
            logits = model(input_ids=batch["input_ids"], use_cache=False).logits
        assert (logits - alone_logits(model, batch)).abs().max().item() <= EXACT


def test_positions_of_another_length_are_refused():
    model = build("mamba", None)
    enable_per_document_mixers(model)
    ids = torch.randint(3, VOCAB, (1, 12))
    positions = torch.tensor([[0, 1, 2, 0, 1]])
    with packed_documents(position_ids=positions), pytest.raises(ValueError, match="cover 5 tokens"):
        model(ids)


def test_attention_only_model_has_no_mixers():
    model = T.AutoModelForCausalLM.from_config(tiny_config("llama", vocab_size=VOCAB))
    assert mixer_layers(model) == [] and enable_per_document_mixers(model) == []


class FooMixer(torch.nn.Module):
    def forward(self, hidden_states):
        return hidden_states.cumsum(1)


@pytest.mark.parametrize("layer", [FooMixer(), torch.nn.Conv1d(32, 32, 4, padding=3, groups=32)],
                         ids=["suffix", "conv1d"])  # fmt: skip
def test_unknown_token_mixer_is_refused(layer):
    model = T.AutoModelForCausalLM.from_config(tiny_config("llama", vocab_size=VOCAB))
    model.model.layers[0].extra = layer
    assert mixer_layers(model) == [MixerInfo("model.layers.0.extra", "unknown", mixers._how("unknown", "cpu"))]
    assert mixer_layers(model)[0].how.startswith("unsupported: ")
    with pytest.raises(ValueError, match=r"model\.layers\.0\.extra .*padded batches"):
        enable_per_document_mixers(model)


def test_how_names_the_cuda_kernels_only_when_opted_in_and_installed(monkeypatch):
    monkeypatch.setattr(mixers.importlib.util, "find_spec", lambda name: object())
    assert mixers._how("mamba2", "cuda", True) == mixers._how("gated_deltanet", "cuda", True) == KERNEL
    assert mixers._how("mamba2", "cuda") == mixers._how("gated_deltanet", "cuda") == PER_DOCUMENT  # the default
    assert mixers._how("short_conv", "cuda", True) == KERNEL  # causal_conv1d takes seq_idx
    assert mixers._how("mamba2", "cpu", True) == mixers._how("rwkv", "cuda", True) == PER_DOCUMENT
    monkeypatch.setattr(mixers.importlib.util, "find_spec", lambda name: None)
    assert mixers._how("mamba2", "cuda", True) == PER_DOCUMENT


def test_max_padding_must_not_be_negative():
    with pytest.raises(ValueError, match="max_padding"):
        enable_per_document_mixers(torch.nn.Linear(2, 2), max_padding=-0.5)


def test_mixer_refusal_until_enabled():
    model = build("bamba", "sdpa")
    reason = mixer_refusal(model)
    assert reason is not None and "mamba2" in reason and "enable_per_document_mixers" in reason
    enable_per_document_mixers(model)
    assert mixer_refusal(model) is None
    disable_per_document_mixers(model)
    assert mixer_refusal(model) == reason
    assert mixer_refusal(T.AutoModelForCausalLM.from_config(tiny_config("llama", vocab_size=VOCAB))) is None


def test_a_deep_copy_runs_its_own_weights():
    """A DPO reference model is often ``copy.deepcopy(policy)``: its patched layers must use the copy's
    weights, not the original's."""
    import copy
    import pickle

    model = build("bamba", "sdpa")
    enable_per_document_mixers(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.model.layers[0].mamba.parameters():
            p.mul_(1.5)
    batch = packed_batch("sdpa")
    assert max_diff(twin, batch, "sdpa") <= EXACT and max_diff(model, batch, "sdpa") <= EXACT
    with torch.no_grad():
        assert (packed_logits(twin, batch, "sdpa") - packed_logits(model, batch, "sdpa")).abs().max() > CONTAMINATED
    assert max_diff(pickle.loads(pickle.dumps(model)), batch, "sdpa") <= EXACT


# --- the exactness rule given a model: its mixers decide -----------------------------------------

WIRED = ["qwen3_5_text", "bamba", "lfm2"]


@pytest.mark.parametrize("family", WIRED)
def test_check_exact_follows_the_models_mixers(family):
    model = build(family, "sdpa")
    with pytest.raises(ValueError, match=r"enable_per_document_mixers\(model\).*for_model"):
        padless.check_exact(model, "sdpa")
    enable_per_document_mixers(model)
    padless.check_exact(model, "sdpa")
    padless.check_exact(model, "eager")
    with pytest.raises(ValueError, match="mix tokens without the attention mask"):  # a bare config cannot tell
        padless.check_exact(model.config, "sdpa")
    disable_per_document_mixers(model)
    with pytest.raises(ValueError, match="enable_per_document_mixers"):
        padless.check_exact(model, "sdpa")


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", WIRED)
def test_for_model_patches_the_mixers_and_packs_exactly(family, attn):
    model = build(family, attn)
    assert mixer_refusal(model) is not None
    collator = padless.PackingCollator.for_model(model, max_length=32)
    assert mixer_refusal(model) is None
    padless.PackingCollator.for_model(model, max_length=32)  # idempotent
    assert all(m.how == SCAN for m in mixer_layers(model))
    batch = collator(make_features(LENGTHS, vocab_size=VOCAB, seed=3))
    assert "cu_seq_lens_q" in batch and batch["attention_mask"].ndim == 4  # boundaries beside the mask
    padless.check_batch(model, batch)
    assert max_diff(model, batch, attn) <= EXACT


@pytest.mark.parametrize("family", ["lfm2", "qwen3_5_text", "qwen3_next"])
def test_for_model_with_the_padless_backend_on_a_hybrid(family):
    """Qwen3.5 and Qwen3-Next declare no ``_supports_attention_backend``, yet their code hands attention
    the keyword arguments it is sent (read from its calls): accepted on padless attention, exact."""
    padless.register_padless_attention()
    model = build(family, "padless")
    batch = padless.PackingCollator.for_model(model, max_length=32)(make_features(LENGTHS, vocab_size=VOCAB, seed=4))
    assert "cu_seq_lens_q" in batch and "attention_mask" not in batch
    assert max_diff(model, batch, "padless") <= EXACT


def test_boundaries_that_do_not_reach_attention_are_refused_at_run_time():
    """A model sent boundaries whose attention layer receives neither them nor restarted positions would
    attend across documents: padless attention raises instead (a layer that drops its kwargs, simulated)."""
    padless.register_padless_attention()
    model = T.AutoModelForCausalLM.from_config(tiny_config("llama", vocab_size=VOCAB), attn_implementation="padless")
    batch = padless.PackingCollator.for_model(model, max_length=32)(make_features(LENGTHS, vocab_size=VOCAB, seed=4))
    attention = model.model.layers[0].self_attn
    forward = attention.forward
    dropped = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "position_ids")
    attention.forward = lambda *a, **kw: forward(*a, **{k: v for k, v in kw.items() if k not in dropped})
    with pytest.raises(ValueError, match="received none"):
        model(**{k: v for k, v in batch.items() if k != "labels"})


def test_check_batch_refuses_a_model_free_batch_on_unpatched_mixers():
    model = build("qwen3_5_text", "sdpa")
    batch = packed_batch("sdpa")
    with pytest.raises(ValueError, match="enable_per_document_mixers"):
        padless.check_batch(model, batch)
    assert max_diff(model, batch, "sdpa") > CONTAMINATED  # what the refusal prevents
    enable_per_document_mixers(model)
    padless.check_batch(model, batch)
    assert max_diff(model, batch, "sdpa") <= EXACT


@pytest.mark.parametrize("family", ["granitemoehybrid", "recurrent_gemma", "zamba", "kimi_linear", "bailing_hybrid"])
def test_padless_attention_is_refused_where_it_cannot_separate_documents(family):
    model = build(family, "sdpa")
    enable_per_document_mixers(model)
    padless.check_exact(model, "sdpa")
    with pytest.raises(ValueError, match="attention backend 'padless' cannot"):
        padless.check_exact(model, "padless")


def test_padless_attention_refuses_value_heads_unlike_query_heads():
    config = T.DeepseekV3Config(
        **_KV4,
        **_TWO,
        kv_lora_rank=16,
        q_lora_rank=None,
        **_MLA,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        first_k_dense_replace=2,
    )
    with pytest.raises(ValueError, match=r"value heads as large as query/key heads.* 8 and 16"):
        padless.check_exact(config, "padless")
    padless.check_exact(config, "sdpa")
    same = T.DeepseekV3Config(**{**_KV4, **_TWO, **_MLA, "v_head_dim": 16}, kv_lora_rank=16, q_lora_rank=None)
    padless.check_exact(same, "padless")


def test_kernel_path_is_opt_in():
    model = build("bamba", "sdpa")
    enable_per_document_mixers(model)
    assert {getattr(model.get_submodule(m.name), mixers._MARK)[2] for m in mixer_layers(model)} == {False}
    enable_per_document_mixers(model, kernels=True)
    assert {getattr(model.get_submodule(m.name), mixers._MARK)[2] for m in mixer_layers(model)} == {True}
    assert all(m.how == SCAN for m in mixer_layers(model))  # on the CPU whatever is asked


def test_padless_attention_refuses_value_heads_at_run_time_too():
    from padless.attention.backend import padless_attention

    q = k = torch.randn(1, 2, 6, 8)
    v = torch.randn(1, 2, 6, 4)
    module = torch.nn.Module()
    with pytest.raises(ValueError, match="value heads of size 4 and query heads of size 8"):
        padless_attention(module, q, k, v, None, scaling=8**-0.5, position_ids=torch.arange(6)[None])


def test_4d_mask_dict_without_the_mixer_layer_types_is_refused_not_crashed():
    """A model whose layers differ in window takes a dict of 4D masks looked up by layer type, mixer
    types included (LFM3, Lara-mini): padless' dict has none for them, so the 4D path is refused."""
    config = T.Lfm3Config(
        **{**_COMMON, "num_hidden_layers": 3},
        head_dim=8,
        sliding_window=4,
        layer_types=["conv", "sliding_attention", "full_attention"],
    )
    model = T.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    with pytest.raises(ValueError, match=r"none for the token-mixer layers \('conv'\)"):
        padless.PackingCollator.for_model(model, max_length=32)
    padless.check_exact(model, "sdpa", max_length=4)  # a window no shorter than the documents: one mask
