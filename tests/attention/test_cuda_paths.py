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

CUDA_BF16 = types.SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16)  # what choose_impl reads


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


BROKEN = 'raise ImportError("flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDevice (built for another torch)")\n'
WORKING = '''
def flash_attn_varlen_func(q, k, v, *args, dropout_p=0.0, softcap=0.0, **kwargs):
    if softcap and dropout_p:
        raise RuntimeError("Softcapping does not support dropout for now")
    return q
'''


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
    [("auto", "1", 2, [1], "nccl"), ("cuda:0", "1", 2, [0], "nccl"), ("cpu", "1", 2, [], "gloo"),
     ("auto", "1", 1, [0], "nccl")],  # a launcher that leaves each rank one visible GPU
)
def test_bench_sets_each_ranks_device_before_nccl(monkeypatch, device, local_rank, gpus, expected_set,
                                                  expected_backend):
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
    assert choose_impl(CUDA_BF16) == "grouped_sdpa"  # the auto choice falls back instead of raising
    import padless.attention.varlen as varlen

    monkeypatch.setattr(varlen, "torch_varlen_available", lambda device=None: True)
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
    q = types.SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="no attention dropout together with logit soft-capping"):
        KERNELS["flash_attn"](q, q, q, None, scale=1.0, causal=True, dropout_p=0.1, sliding_window=None,
                                 softcap=30.0)  # fmt: skip
    assert KERNELS["flash_attn"](q, q, q, types.SimpleNamespace(cu_seqlens=None, max_seqlen=4), scale=1.0,
                                    causal=True, dropout_p=0.0, sliding_window=None, softcap=30.0) is q  # fmt: skip


def test_softcap_with_dropout_is_refused_by_the_rule(tmp_path, monkeypatch):
    from transformers import Gemma2Config

    _flash_package(tmp_path, monkeypatch, WORKING)
    config = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, attention_dropout=0.1)  # fmt: skip
    for backend in ("padless", "flash_attention_2"):
        with pytest.raises(ValueError, match="no attention dropout together with logit soft-capping.*use backend 'eager'"):
            check_exact(config, backend, device="cuda", dtype=torch.bfloat16)
    config.attention_dropout = 0.0
    for backend in ("padless", "flash_attention_2"):
        check_exact(config, backend, device="cuda", dtype=torch.bfloat16)
