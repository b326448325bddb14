"""Host copies of boundary tensors (padless.attention.host): one device-to-host transfer per forward at
most, none for a batch moved with batch_to. A CPU has no device syncs, so the test counts the calls
that would sync on a GPU (``.cpu()``, ``.item()``, ``.tolist()``, ``bool()``, ``nonzero``,
``torch.equal``) made by padless code during a forward."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest
import torch

from padless.attention.backend import (
    cu_seqlens_from_host_positions,
    cu_seqlens_from_position_ids,
    register_padless_attention,
)
from padless.attention.host import host_values, remember_host_copy, remember_moved
from padless.batching.batch import batch_to, forward_inputs
from padless.batching.collate import PackingCollator


class SyncCounter:
    """Counts calls that read a tensor's values on the host, made from padless modules."""

    METHODS = ("cpu", "item", "tolist", "__bool__", "nonzero")

    def __init__(self, monkeypatch) -> None:
        self.calls: list[str] = []
        for name in self.METHODS:
            monkeypatch.setattr(torch.Tensor, name, self._wrap(name, getattr(torch.Tensor, name)))
        for name in ("equal", "nonzero"):
            monkeypatch.setattr(torch, name, self._wrap(f"torch.{name}", getattr(torch, name)))

    def _wrap(self, name, original):
        def counted(*args, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith("padless."):
                self.calls.append(f"{caller}: {name}")
            return original(*args, **kwargs)

        return counted


def test_host_values_fetches_every_unknown_tensor_in_one_transfer(monkeypatch):
    a, b, c = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([[0, 1, 2], [0, 1, 0]]), torch.tensor([5])
    counter = SyncCounter(monkeypatch)
    values = host_values([a, b, c])
    assert counter.calls == ["padless.attention.host: cpu"]
    assert [v.tolist() for v in values] == [[0, 3, 7], [[0, 1, 2], [0, 1, 0]], [5]]
    assert all(v.dtype == np.int64 for v in values)


def test_remembered_copies_are_read_without_a_transfer_until_the_tensor_changes(monkeypatch):
    device_side, host = torch.tensor([0, 4, 9]), torch.tensor([0, 4, 9])
    remember_host_copy(device_side, host)
    host[1] = -7  # the collator's tensor changing later does not change what was remembered
    counter = SyncCounter(monkeypatch)
    assert host_values([device_side])[0].tolist() == [0, 4, 9]
    assert counter.calls == []
    device_side.add_(1)  # changed in place: the remembered copy is stale and forgotten
    assert host_values([device_side])[0].tolist() == [1, 5, 10]
    assert counter.calls == ["padless.attention.host: cpu"]
    with pytest.raises(ValueError, match="does not match the tensor's"):
        remember_host_copy(device_side, np.zeros(4))


def test_a_freed_tensor_is_forgotten():
    import padless.attention.host as host

    t = torch.tensor([0, 2])
    remember_host_copy(t, t.clone())
    key = id(t)
    assert key in host._COPIES
    del t
    gc.collect()
    assert key not in host._COPIES


def test_host_positions_equal_the_device_reference():
    rng = np.random.default_rng(0)
    for batch in (1, 3):
        pos = torch.from_numpy(np.concatenate([np.arange(n) for n in rng.integers(1, 6, 12)])[:20]).repeat(batch, 1)
        assert (
            cu_seqlens_from_host_positions(pos.numpy(), batch).tolist()
            == cu_seqlens_from_position_ids(pos, batch).tolist()
        )
    assert cu_seqlens_from_host_positions(np.array([[0, 1, 0]]), 2).tolist() == [0, 2, 3, 5, 6]


def _model(layers: int = 2):
    from transformers import AutoModelForCausalLM

    from padless.models.factory import tiny_config

    config = tiny_config("llama")
    config.num_hidden_layers = layers
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=register_padless_attention())


FEATURES = [{"input_ids": list(range(1, n + 1))} for n in (7, 3, 12, 5, 9, 1, 4)]


@pytest.mark.parametrize("layers", [2, 4])
def test_one_transfer_per_forward_whatever_the_layers(monkeypatch, layers):
    model = _model(layers)
    batch = PackingCollator.for_model(model, max_length=16)(FEATURES)
    batch["cu_seq_lens_k"] = batch["cu_seq_lens_k"].clone()  # two tensors, as after a device move: checked equal
    counter = SyncCounter(monkeypatch)
    with torch.no_grad():
        model(**forward_inputs(batch))
    assert counter.calls == ["padless.attention.host: cpu"]


def test_no_transfer_for_a_batch_moved_with_batch_to(monkeypatch):
    model = _model()
    collate = PackingCollator.for_model(model, max_length=16)
    features = FEATURES
    moved = batch_to(collate(features), "cpu")
    counter = SyncCounter(monkeypatch)
    with torch.no_grad():
        packed = model(**forward_inputs(moved)).logits
    assert counter.calls == []
    plain = batch_to(collate(features), "cpu")
    for key in ("cu_seq_lens_q", "cu_seq_lens_k", "position_ids"):
        plain[key] = plain[key].clone()  # copies nobody remembered: read with one transfer
    with torch.no_grad():
        torch.testing.assert_close(model(**forward_inputs(plain)).logits, packed, atol=0, rtol=0)
    assert counter.calls == ["padless.attention.host: cpu"]


def test_remember_moved_takes_integer_boundaries_from_the_cpu_only():
    import padless.attention.host as host

    before = {"cu_seq_lens_q": torch.tensor([0, 2]), "position_ids": torch.tensor([[0.0, 1.0]]),
              "input_ids": torch.tensor([[3, 4]])}  # fmt: skip
    after = {k: v.clone() for k, v in before.items()}
    remember_moved(before, after)
    assert id(after["cu_seq_lens_q"]) in host._COPIES
    assert id(after["position_ids"]) not in host._COPIES  # float: not a boundary tensor padless reads
    assert id(after["input_ids"]) not in host._COPIES


def test_shared_prompt_rows_one_transfer_per_forward_and_none_after_batch_to(monkeypatch):
    """The tree path (GRPO groups: a prompt once, its completions after it) reads its tree and
    position ids in one transfer, and from the remembered host copies after batch_to."""
    from padless.batching.preference import RolloutCollator

    model = _model()
    rng = np.random.default_rng(0)
    groups = [
        {
            "prompt_ids": rng.integers(1, 60, int(rng.integers(2, 9))).tolist(),
            "completion_ids": [rng.integers(1, 60, int(rng.integers(1, 6))).tolist() for _ in range(3)],
        }
        for _ in range(4)
    ]
    collate = RolloutCollator.for_model(model, max_length=40)
    batch = collate(groups)
    assert "tree_cu_seqlens" in batch
    counter = SyncCounter(monkeypatch)
    with torch.no_grad():
        plain = model(**forward_inputs(batch)).logits
    assert counter.calls == ["padless.attention.host: cpu"]
    counter.calls.clear()
    moved = batch_to(collate(groups), "cpu")
    with torch.no_grad():
        torch.testing.assert_close(model(**forward_inputs(moved)).logits, plain, atol=0, rtol=0)
    assert counter.calls == []


@pytest.mark.parametrize("compiled", [False, True])
def test_cu_seq_lens_k_unlike_q_is_refused(compiled):
    """Read on the host with the rest of the layout (no torch.equal on the device), eager and through
    compile_layers' wrapper, which hands cu_seq_lens_k to the attention apart from q."""
    from padless.models.compile import _boundaries_out_of_graph

    model = _model()
    batch = PackingCollator.for_model(model, max_length=16)(FEATURES)
    batch["cu_seq_lens_k"] = batch["cu_seq_lens_k"].clone()
    batch["cu_seq_lens_k"][1] += 1
    if compiled:  # the wrapper without torch.compile: what the compiled layer is called through
        for layer in model.model.layers:
            layer._compiled_call_impl = _boundaries_out_of_graph(layer._call_impl, model.config)
    with pytest.raises(ValueError, match="cu_seq_lens_q and cu_seq_lens_k differ"), torch.no_grad():
        model(**forward_inputs(batch))
