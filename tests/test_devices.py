"""padless.devices: device and dtype from their names; a bare ``cuda`` under a launcher (torch.cuda mocked)."""

from __future__ import annotations

import pytest
import torch

from padless.devices import dtype_name, is_half_precision, resolve_device, resolve_dtype


def _gpus(monkeypatch, count: int, current: int = 0) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)


@pytest.mark.parametrize("count, local_rank, current, expected", [
    (4, "3", 0, 3),  # torchrun on a 4-GPU node: every rank sees all four, takes its own
    (1, "3", 0, 0),  # a launcher left rank 3 one visible GPU: it is cuda:0 there
    (2, "5", 1, 1),  # fewer visible than LOCAL_RANK: the device the process already chose
    (2, None, 0, 0),  # outside torchrun
])  # fmt: skip
def test_bare_cuda_takes_local_rank_only_where_that_many_gpus_are_visible(
    monkeypatch, count, local_rank, current, expected
):
    _gpus(monkeypatch, count, current)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert resolve_device("cuda") == torch.device("cuda", expected)
    assert resolve_device("auto") == torch.device("cuda", expected)


def test_an_explicit_index_is_kept_or_refused(monkeypatch):
    _gpus(monkeypatch, 1)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="has 1 CUDA device"):
        resolve_device("cuda:2")


def test_cpu_names_and_dtypes():
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="not a device name"):
        resolve_device("gpu0")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16
    with pytest.raises(ValueError, match="not a torch floating dtype"):
        resolve_dtype("int8", torch.device("cpu"))
    assert (
        dtype_name(torch.bfloat16) == "bfloat16" and is_half_precision("float16") and not is_half_precision("float32")
    )
