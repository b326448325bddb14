"""CUDA-only paths, checked on a CPU machine by mocking what a GPU machine would provide: the rank's
device under torchrun + NCCL, a flash-attn wheel that is found but does not import, and soft-capping
with dropout (which flash-attn rejects with a RuntimeError)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from padless.attention.select import check_exact
from padless.attention.varlen import KERNELS, choose_impl, flash_attn_available
from padless.objectives.loss import reduce_device, step_num_items

CUDA_BF16 = types.SimpleNamespace(
    device=torch.device("cuda", 0), dtype=torch.bfloat16, shape=(8, 2, 64)
)  # what choose_impl reads


@pytest.fixture(autouse=True)
def _fresh_flash_check():
    """Each test sees flash-attn as it mocks it; afterwards the process sees the real one again."""
    had = sys.modules.pop("flash_attn", None)
    flash_attn_available.cache_clear()
    yield
    sys.modules.pop("flash_attn", None)
    if had is not None:
        sys.modules["flash_attn"] = had
    flash_attn_available.cache_clear()


def _flash_package(tmp_path, monkeypatch, body: str) -> None:
    """A ``flash_attn`` package on sys.path with ``body`` as its ``__init__``."""
    pkg = tmp_path / "flash_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))


BROKEN = (
    'raise ImportError("flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDevice (built for another torch)")\n'
)
WORKING = """
def flash_attn_varlen_func(q, k, v, *args, dropout_p=0.0, softcap=0.0, **kwargs):
    if softcap and dropout_p:
        raise RuntimeError("Softcapping does not support dropout for now")
    return q
"""


# ------------------------------------------------------------------------------ the rank's device


def test_reduce_device_is_the_labels_device():
    assert reduce_device(torch.device("cuda", 3), "nccl") == torch.device("cuda", 3)
    assert reduce_device(torch.device("cuda", 1), "gloo") == torch.device("cpu")
    assert reduce_device(torch.device("cpu"), "gloo") == torch.device("cpu")
    assert reduce_device(None, "mpi") == torch.device("cpu")


def test_reduce_device_falls_back_to_the_current_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)  # set per rank by set_device
    assert reduce_device(torch.device("cpu"), "nccl") == torch.device("cuda", 2)


def test_step_num_items_reduces_on_the_device_reduce_device_picks(monkeypatch):
    import torch.distributed as dist

    import padless.objectives.loss as loss

    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(loss, "reduce_device", lambda device, backend: calls.append((device, backend)) or device)
    monkeypatch.setattr(dist, "all_reduce", lambda t, *a, **k: t.mul_(2))  # two ranks, same counts
    labels = torch.tensor([[-100, 5, 6, -100], [-100, 7, -100, -100]])  # 3 targets
    assert int(step_num_items([{"labels": labels}, {"labels": labels}])) == 2 * 6
    assert calls == [(labels.device, "nccl")]


@pytest.mark.parametrize(
    "device, local_rank, gpus, expected_set, expected_backend",
    [
        ("auto", "1", 2, [1], "nccl"),
        ("cuda:0", "1", 2, [0], "nccl"),
        ("cpu", "1", 2, [], "gloo"),
        ("auto", "1", 1, [0], "nccl"),
    ],  # a launcher that leaves each rank one visible GPU
)
def test_bench_sets_each_ranks_device_before_nccl(
    monkeypatch, device, local_rank, gpus, expected_set, expected_backend
):
    import torch.distributed as dist

    from padless.bench.parallel import init_distributed

    events = []
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: events.append(("set_device", i)))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **k: events.append(("init", backend)))
    monkeypatch.setattr(dist, "get_rank", lambda *a: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 2)
    assert init_distributed(device) == (1, 2)
    assert events == [*(("set_device", i) for i in expected_set), ("init", expected_backend)]


# ----------------------------------------------------------------- flash-attn found but not importable


def test_flash_attn_that_fails_to_import_is_not_available(tmp_path, monkeypatch):
    _flash_package(tmp_path, monkeypatch, BROKEN)
    import importlib.util

    assert importlib.util.find_spec("flash_attn") is not None  # found, as on the user's machine
    assert not flash_attn_available()
    _gpu(monkeypatch, capability=(7, 5))  # a T4: torch's varlen kernel does not run either
    assert choose_impl(CUDA_BF16) == "grouped_sdpa"  # the auto choice falls back instead of raising
    _gpu(monkeypatch, capability=(9, 0))
    assert choose_impl(CUDA_BF16) == "torch_varlen"
    with pytest.raises(ValueError, match="not installed or fails to import; use backend 'padless'"):
        check_exact(None, "flash_attention_2", device="cuda", dtype=torch.bfloat16)


def test_flash_attn_that_imports_is_chosen(tmp_path, monkeypatch):
    _flash_package(tmp_path, monkeypatch, WORKING)
    assert flash_attn_available()
    assert choose_impl(CUDA_BF16) == "flash_attn"
    check_exact(None, "flash_attention_2", device="cuda", dtype=torch.bfloat16)


# ------------------------------------------------------------------------ soft-capping with dropout


def test_softcap_with_dropout_gets_padless_own_error(tmp_path, monkeypatch):
    _flash_package(tmp_path, monkeypatch, WORKING)  # would raise flash-attn's RuntimeError if reached
    q = CUDA_BF16
    with pytest.raises(ValueError, match="no attention dropout together with logit soft-capping"):
        KERNELS["flash_attn"](q, q, q, None, scale=1.0, causal=True, dropout_p=0.1, sliding_window=None, softcap=30.0)
    assert (
        KERNELS["flash_attn"](
            q,
            q,
            q,
            types.SimpleNamespace(cu_seqlens=None, max_seqlen=4),
            scale=1.0,
            causal=True,
            dropout_p=0.0,
            sliding_window=None,
            softcap=30.0,
        )
        is q
    )


def test_softcap_with_dropout_is_refused_by_the_rule(tmp_path, monkeypatch):
    from transformers import Gemma2Config

    _flash_package(tmp_path, monkeypatch, WORKING)
    config = Gemma2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        attention_dropout=0.1,
    )
    for backend in ("padless", "flash_attention_2"):
        with pytest.raises(
            ValueError, match="no attention dropout together with logit soft-capping.*use backend 'eager'"
        ):
            check_exact(config, backend, device="cuda", dtype=torch.bfloat16)
    config.attention_dropout = 0.0
    for backend in ("padless", "flash_attention_2"):
        check_exact(config, backend, device="cuda", dtype=torch.bfloat16)


# ------------------------------------------- flash_attention_2: only where the model carries the documents


def _gpu(monkeypatch, capability=(9, 0)) -> None:
    """A visible CUDA device of ``capability`` (what the rule asks torch about)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)


def _tiny(kind: str, **extra):
    import transformers

    common = dict(
        vocab_size=64, hidden_size=64, num_attention_heads=4, num_hidden_layers=2, bos_token_id=0, eos_token_id=0
    )
    configs = {
        "llama": lambda: transformers.LlamaConfig(intermediate_size=64, num_key_value_heads=2, **common),
        "gpt_neo": lambda: transformers.GPTNeoConfig(
            vocab_size=64,
            hidden_size=64,
            num_heads=4,
            num_layers=2,
            attention_types=[[["global"], 2]],
            bos_token_id=0,
            eos_token_id=0,
        ),
        "falcon": lambda: transformers.FalconConfig(**common),
    }
    config = configs[kind]()
    for name, value in extra.items():
        setattr(config, name, value)
    return config


@pytest.mark.parametrize(
    "kind, refused, fallback",
    [
        ("gpt_neo", "GPTNeoForCausalLM's flash-attention layers pass neither cu_seq_lens nor position_ids", "eager"),
        ("falcon", "FalconForCausalLM's flash-attention layers pass only position_ids.*one row", "sdpa"),
        ("llama", None, "padless"),
    ],
)
def test_flash_attention_2_only_where_the_model_hands_the_kernel_cu_seq_lens(
    tmp_path, monkeypatch, kind, refused, fallback
):
    _flash_package(tmp_path, monkeypatch, WORKING)
    _gpu(monkeypatch)
    from padless.attention.select import resolve_backend

    config = _tiny(kind)
    if refused is None:
        check_exact(config, "flash_attention_2", device="cuda", dtype=torch.bfloat16)
    else:
        with pytest.raises(ValueError, match=refused):
            check_exact(config, "flash_attention_2", device="cuda", dtype=torch.bfloat16)
    # the automatic choice skips flash_attention_2 for them (padless needs _supports_attention_backend too)
    assert resolve_backend(None, device="cuda", dtype=torch.bfloat16, config=config) == fallback


def test_flash_attention_2_needs_an_ampere_gpu(tmp_path, monkeypatch):
    _flash_package(tmp_path, monkeypatch, WORKING)
    _gpu(monkeypatch, capability=(7, 5))  # a T4
    with pytest.raises(ValueError, match=r"flash_attention_2 needs an sm80\+ GPU .* is sm75; use backend 'padless'"):
        check_exact(_tiny("llama"), "flash_attention_2", device="cuda", dtype=torch.bfloat16)
    check_exact(_tiny("llama"), "padless", device="cuda", dtype=torch.bfloat16)  # its kernel falls back to grouped SDPA


def test_flash_attention_2_heads_of_at_most_256(tmp_path, monkeypatch):
    _flash_package(tmp_path, monkeypatch, WORKING)
    _gpu(monkeypatch)
    wide = _tiny("llama", head_dim=320)
    with pytest.raises(ValueError, match="takes heads of at most 256, not 320; use backend 'padless'"):
        check_exact(wide, "flash_attention_2", device="cuda", dtype=torch.bfloat16)
    check_exact(_tiny("llama", head_dim=256), "flash_attention_2", device="cuda", dtype=torch.bfloat16)


def test_softcap_on_padless_needs_a_flash_kernel_that_runs_here(tmp_path, monkeypatch):
    from transformers import Gemma2Config

    _flash_package(tmp_path, monkeypatch, WORKING)
    config = Gemma2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    _gpu(monkeypatch, capability=(8, 6))
    check_exact(config, "padless", device="cuda", dtype=torch.bfloat16)
    _gpu(monkeypatch, capability=(7, 0))  # a V100: flash-attn 2 does not run, SDPA has no soft-cap
    with pytest.raises(ValueError, match="soft-capping needs flash-attn on CUDA with fp16/bf16, and here .* is sm70"):
        check_exact(config, "padless", device="cuda", dtype=torch.bfloat16)


# -------------------------------------------------------- where training runs, not where the weights sit


@pytest.fixture
def cpu_llama():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(_tiny("llama"))  # fp32, on the CPU: as built before Trainer moves it


def _cuda_autocast(monkeypatch, dtype=torch.bfloat16) -> None:
    """bf16 autocast enabled for CUDA (what Trainer(bf16=True) runs the step in)."""
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type="cuda": device_type == "cuda")
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda device_type: dtype)


def test_a_cpu_fp32_model_is_judged_for_the_cuda_bf16_run(tmp_path, monkeypatch, cpu_llama):
    from padless.attention.select import compute_target

    _flash_package(tmp_path, monkeypatch, WORKING)
    _gpu(monkeypatch)
    assert compute_target(cpu_llama) == (torch.device("cpu"), torch.float32)  # where the weights sit
    with pytest.raises(ValueError, match="flash_attention_2 runs on CUDA only, not cpu"):
        check_exact(cpu_llama, "flash_attention_2")
    with pytest.raises(ValueError, match="flash_attention_2 needs fp16 or bf16, not float32"):
        check_exact(cpu_llama, "flash_attention_2", device="cuda")
    for backend in ("flash_attention_2", "padless"):
        check_exact(cpu_llama, backend, device="cuda", dtype=torch.bfloat16)
    _cuda_autocast(monkeypatch)  # fp32 master weights under bf16 autocast: the compute dtype is bf16
    assert compute_target(cpu_llama, "cuda") == (torch.device("cuda"), torch.bfloat16)
    for backend in ("flash_attention_2", "padless"):
        check_exact(cpu_llama, backend, device="cuda")
        check_exact(cpu_llama, backend, device="cuda", dtype=torch.float32)


def test_cpu_autocast_is_the_compute_dtype(cpu_llama):
    from padless.attention.select import compute_target

    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compute_target(cpu_llama) == (torch.device("cpu"), torch.bfloat16)
    assert compute_target(cpu_llama) == (torch.device("cpu"), torch.float32)
    assert compute_target(cpu_llama.config) == (torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match="dtype must be a torch dtype"):
        compute_target(cpu_llama, dtype="bfloat16")


# ------------------------------------------------------------- grouped-query SDPA on CUDA: no math kernel


@pytest.mark.parametrize(
    "device, dtype, masked, head_dim, shared",
    [
        ("cpu", torch.float32, True, 64, True),  # the CPU takes enable_gqa with a mask
        ("cuda", torch.bfloat16, False, 64, True),  # torch's flash kernel shares K/V heads
        ("cuda", torch.bfloat16, True, 64, False),  # a mask: flash is out, enable_gqa would mean math
        ("cuda", torch.float32, False, 64, False),  # fp32: flash is out
        ("cuda", torch.float16, False, 320, False),  # heads over 256: flash is out
    ],
)
def test_masked_or_fp32_gqa_on_cuda_expands_kv(device, dtype, masked, head_dim, shared):
    from padless.attention.varlen import sdpa_shares_kv_heads

    assert sdpa_shares_kv_heads(device, dtype, masked, head_dim) is shared


@pytest.mark.parametrize("window", [None, 3])
def test_the_expanded_kv_path_equals_the_reference(monkeypatch, window):
    """The branch CUDA takes for masked GQA (K/V expanded), run on the CPU against the dense oracle."""
    import padless.attention.varlen as varlen

    calls = []
    monkeypatch.setattr(varlen, "sdpa_shares_kv_heads", lambda *a: calls.append(a) or False)
    torch.manual_seed(0)
    cu = torch.tensor([0, 5, 6, 13, 20], dtype=torch.int32)
    q, k, v = torch.randn(20, 4, 8), torch.randn(20, 2, 8), torch.randn(20, 2, 8)
    out = varlen.varlen_attention(q, k, v, cu, impl="grouped_sdpa", sliding_window=window)
    ref = varlen.reference_varlen_attention(q, k, v, cu, sliding_window=window)
    assert calls and any(masked for _, _, masked, _ in calls) == (window is not None)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 2])
def test_the_tree_path_expanded_kv_equals_the_reference(monkeypatch, window):
    """Shared-prompt trees always carry a mask: on CUDA their grouped K/V are expanded (the CPU runs it here)."""
    import padless.attention.tree as tree

    calls = []
    monkeypatch.setattr(tree, "sdpa_shares_kv_heads", lambda *a: calls.append(a) or False)
    torch.manual_seed(0)
    cu = torch.tensor([0, 4, 7, 9, 12, 13], dtype=torch.int32)  # a prompt of 4 with two completions; 3 with one
    parents = torch.tensor([-1, 0, 0, -1, 3])
    q, k, v = torch.randn(13, 4, 8), torch.randn(13, 2, 8), torch.randn(13, 2, 8)
    out = tree.tree_attention(q, k, v, cu, parents, sliding_window=window)
    ref = tree.reference_tree_attention(q, k, v, cu, parents, sliding_window=window)
    assert any(masked for _, _, masked, _ in calls)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


# ------------------------------------------------- the collators and PackedTrainer judge where the step runs


def test_for_model_on_a_cpu_fp32_model_for_a_cuda_bf16_run(tmp_path, monkeypatch, cpu_llama):
    from padless.batching.collate import PackingCollator
    from padless.integrations.transformers import exact_collator, training_dtype

    _flash_package(tmp_path, monkeypatch, WORKING)
    _gpu(monkeypatch)
    bf16 = training_dtype(types.SimpleNamespace(bf16=True, fp16=False))
    assert (bf16, training_dtype(types.SimpleNamespace(bf16=False, fp16=True))) == (torch.bfloat16, torch.float16)
    assert training_dtype(types.SimpleNamespace(bf16=False, fp16=False)) is None
    for backend in ("flash_attention_2", "padless"):
        cpu_llama.config._attn_implementation = backend
        collate = PackingCollator.for_model(cpu_llama, device="cuda", dtype=bf16, max_length=32)
        assert collate.attention == "varlen"
        assert exact_collator(cpu_llama, 32, device="cuda", dtype=bf16, pad_token_id=0).attention == "varlen"
    cpu_llama.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="flash_attention_2 needs fp16 or bf16, not float32"):
        exact_collator(cpu_llama, 32, device="cuda", pad_token_id=0)  # no bf16 flag: the fp32 weights compute
    _cuda_autocast(monkeypatch)  # built inside the autocast region the step runs in
    assert PackingCollator.for_model(cpu_llama, device="cuda", max_length=32).attention == "varlen"


def test_packed_trainer_remembers_the_host_copies_when_it_moves_a_batch(tmp_path):
    from transformers import TrainingArguments

    import padless.attention.host as host
    from padless.attention.backend import register_padless_attention
    from padless.integrations.transformers import PackedTrainer
    from padless.models.factory import build_model

    model = build_model("tiny-llama", attn_implementation=register_padless_attention())
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=1)
    feats = [{"input_ids": list(range(1, n))} for n in (20, 9, 5)]
    trainer = PackedTrainer(model=model, args=args, train_dataset=feats, max_length=32)
    batch = trainer.data_collator(feats)
    moved = trainer._prepare_inputs(batch)
    for key in ("cu_seq_lens_q", "cu_seq_lens_k", "position_ids"):
        assert host._remembered(moved[key]) is not None, key
    assert host._remembered(moved["input_ids"]) is None
