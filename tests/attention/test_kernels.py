"""The fused kernels' limits and the flash-boundary reading of a model's code (padless.attention.kernels),
on a CPU machine: the GPU's capability, flash-attn and torch's varlen module are mocked."""

from __future__ import annotations

import importlib
import sys
import textwrap
import types

import pytest
import torch

import padless.attention.kernels as kernels
from padless.attention.kernels import flash_boundaries, flash_boundary_refusal, head_dim_of, kernel_refusal
from padless.attention.varlen import choose_impl


@pytest.fixture
def gpu(monkeypatch):
    """Make a CUDA device of a given capability visible, with both fused kernels installed."""

    def make(capability=(9, 0), flash=True, varlen=True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setitem(kernels._INSTALLED, "flash_attn", lambda: flash)
        monkeypatch.setitem(kernels._INSTALLED, "torch_varlen", lambda: varlen)

    return make


def _q(head_dim: int, dtype=torch.bfloat16):
    """What choose_impl reads of a query ``[T, H, D]`` on a CUDA device."""
    return types.SimpleNamespace(device=torch.device("cuda", 0), dtype=dtype, shape=(16, 4, head_dim))


@pytest.mark.parametrize("kernel", ["flash_attn", "torch_varlen"])
def test_device_dtype_and_installation(gpu, kernel):
    gpu()
    assert kernel_refusal(kernel, "cuda", torch.bfloat16, 64) is None
    assert kernel_refusal(kernel, "cuda:0", torch.float16, 128) is None
    assert kernel_refusal(kernel, "cpu", torch.bfloat16, 64) == f"{kernel} runs on CUDA only, not cpu"
    assert kernel_refusal(kernel, "cuda", torch.float32, 64) == f"{kernel} needs fp16 or bf16, not float32"
    gpu(flash=False, varlen=False)
    assert kernel_refusal(kernel, "cuda", torch.bfloat16) == kernels._NOT_INSTALLED[kernel]


@pytest.mark.parametrize(
    "capability, head_dim, flash, varlen",
    [
        ((9, 0), 64, None, None),
        ((8, 0), 128, None, None),
        ((8, 6), 256, None, None),
        ((7, 5), 64, "needs an sm80+ GPU", "needs an sm80+ GPU"),  # T4
        ((7, 0), 64, "needs an sm80+ GPU", "needs an sm80+ GPU"),  # V100
        ((9, 0), 72, None, None),
        ((9, 0), 100, None, "a multiple of 8, not 100"),  # flash-attn pads the head; torch's kernel does not
        ((9, 0), 4, None, "a multiple of 8, not 4"),  # a tiny test model
        ((9, 0), 320, "at most 256, not 320", "at most 256, not 320"),
    ],
)
def test_limits(gpu, capability, head_dim, flash, varlen):
    gpu(capability)
    for kernel, expected in (("flash_attn", flash), ("torch_varlen", varlen)):
        reason = kernel_refusal(kernel, "cuda", torch.bfloat16, head_dim)
        assert (reason is None) if expected is None else (expected in reason), (kernel, reason)


def test_an_unknown_capability_is_not_held_against_the_kernel(monkeypatch):
    """A collator built on a host without a visible GPU for a later CUDA run: the kernel checks again."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(kernels._INSTALLED, "flash_attn", lambda: True)
    assert kernels.cuda_capability("cuda") is None
    assert kernel_refusal("flash_attn", "cuda", torch.bfloat16, 64) is None
    assert kernel_refusal("flash_attn", "cuda", torch.bfloat16, 512) is not None  # the head is known


@pytest.mark.parametrize(
    "capability, head_dim, flash, expected",
    [
        ((9, 0), 64, True, "flash_attn"),
        ((9, 0), 64, False, "torch_varlen"),
        ((9, 0), 100, False, "grouped_sdpa"),  # torch's kernel: heads of a multiple of 8
        ((9, 0), 100, True, "flash_attn"),
        ((9, 0), 320, True, "grouped_sdpa"),
        ((7, 5), 64, True, "grouped_sdpa"),  # T4: neither fused kernel
        ((7, 0), 128, False, "grouped_sdpa"),  # V100
    ],
)
def test_the_automatic_choice_falls_back_past_the_limits(gpu, capability, head_dim, flash, expected):
    gpu(capability, flash=flash)
    assert choose_impl(_q(head_dim)) == expected
    assert choose_impl(_q(head_dim, torch.float32)) == "grouped_sdpa"


def test_an_explicit_fused_kernel_past_its_limits_raises_naming_the_fallback(gpu):
    from padless.attention.varlen import KERNELS

    gpu((7, 5))
    q = _q(64)
    for name in ("flash_attn", "torch_varlen"):
        with pytest.raises(ValueError, match=rf"impl='{name}' cannot run here: .*sm75; use impl='grouped_sdpa'"):
            KERNELS[name](q, q, q, None, scale=1.0, causal=True, dropout_p=0.0, sliding_window=None, softcap=None)


def test_head_dim_of_configs():
    from transformers import GPT2Config, LlamaConfig

    assert head_dim_of(GPT2Config(n_embd=96, n_head=4)) == 24
    assert head_dim_of(LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=72)) == 72
    assert head_dim_of(LlamaConfig(hidden_size=64, num_attention_heads=4)) == 16
    assert head_dim_of(types.SimpleNamespace(qk_head_dim=192, v_head_dim=128)) == 192
    assert head_dim_of(types.SimpleNamespace(qk_head_dim=64, v_head_dim=320)) == 320
    assert head_dim_of(types.SimpleNamespace()) is None
    assert head_dim_of(None) is None


# ------------------------------------------------------------------- what a model's flash code passes


def test_transformers_models():
    from transformers import (
        FalconForCausalLM,
        GPT2LMHeadModel,
        GPTNeoForCausalLM,
        LlamaForCausalLM,
        StableLmForCausalLM,
    )

    assert flash_boundaries(LlamaForCausalLM) == "cu_seq_lens"  # _supports_attention_backend: kwargs reach the kernel
    assert flash_boundaries(GPT2LMHeadModel) == "cu_seq_lens"
    assert flash_boundaries(GPTNeoForCausalLM) == "none"  # calls _flash_attention_forward with neither
    assert flash_boundaries(FalconForCausalLM) == "position_ids"
    assert flash_boundaries(StableLmForCausalLM) == "undeclared"  # the interface, no promise that kwargs reach it
    assert flash_boundary_refusal(LlamaForCausalLM) is None
    assert flash_boundary_refusal(None) is None
    assert "(_supports_attention_backend)" in flash_boundary_refusal(StableLmForCausalLM)


CALLS = {
    "forwards_kwargs": "_flash_attention_forward(q, k, v, mask, n, is_causal=True, **kwargs)",
    "passes_cu": "modeling_flash_attention_utils._flash_attention_forward(q, k, v, mask, n, cu_seq_lens_q=cu)",
    "positions_by_keyword": "_flash_attention_forward(q, k, v, mask, n, position_ids=pos, is_causal=True)",
    "positions_by_place": "_flash_attention_forward(q, k, v, mask, n, True, 0.0, pos)",
    "neither": "_flash_attention_forward(q, k, v, mask, n, is_causal=True)",
}


def _model_class(tmp_path, monkeypatch, name: str, calls: list[str]) -> type:
    body = "\n".join(
        f"    def f{i}(self, q, k, v, mask, n, cu, pos, **kwargs):\n        return {c}" for i, c in enumerate(calls)
    )
    source = f"class Attention:\n    pass\n{body}\n\nclass Model:\n    _supports_flash_attn = True\n"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(name).Model


@pytest.mark.parametrize(
    "calls, expected",
    [
        (["forwards_kwargs"], "cu_seq_lens"),
        (["passes_cu"], "cu_seq_lens"),
        (["positions_by_keyword"], "position_ids"),
        (["positions_by_place"], "position_ids"),
        (["neither"], "none"),
        (["forwards_kwargs", "positions_by_keyword"], "position_ids"),  # the weakest call decides
        (["passes_cu", "neither", "positions_by_place"], "none"),
        ([], "undeclared"),
    ],
)
def test_read_from_the_calls_in_the_models_source(tmp_path, monkeypatch, calls, expected):
    name = "padless_probe_" + "_".join(calls or ["nothing"])
    model = _model_class(tmp_path, monkeypatch, name, [CALLS[c] for c in calls])
    assert flash_boundaries(model) == expected
    model._supports_attention_backend = True  # the flag promises the kwargs reach the attention interface
    assert flash_boundaries(model) == "cu_seq_lens"
