"""Context parallelism over packed documents is exact: 4 gloo processes, split as one cp = 4 group and
as two cp = 2 groups (data parallel x context parallel), give the single-process packed run's logits,
loss and every gradient, and each document alone's logits (fp32 1e-5, fp64 1e-10). The rows hold a
document straddling every shard boundary, one spanning every shard, and a padded row end. The negative
controls (the document mask dropped, labels shifted after the split, the loss normalised per rank)
must fail the same comparison."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from padless.attention.context_parallel import (
    LAYOUTS,
    check_context_parallel,
    context_parallel_refusal,
    document_mask,
)
from padless.batching.context_shards import split_row
from padless.layout import IGNORE_INDEX

TOL = {"float32": 1e-5, "float64": 1e-10}
# row 0: a document of 34 spans every shard of cp = 4 (boundaries 12, 24, 36); row 1: a document
# straddles every boundary of cp = 2 and 4; both rows end with 3 padding tokens
ROWS = ([7, 34, 4], [5, 9, 11, 6, 10, 4])
LENGTH, PAD = 48, 3


def _rows(vocab: int):
    gen = torch.Generator().manual_seed(0)
    ids, labels, pos = [], [], []
    for lengths in ROWS:
        docs = [torch.randint(1, vocab, (n,), generator=gen) for n in lengths]
        lab = [d.clone() for d in docs]
        for d in lab:
            d[0] = IGNORE_INDEX  # a document's first label: the previous document predicting it
        ids.append(torch.cat([*docs, torch.zeros(PAD, dtype=torch.long)]))
        labels.append(torch.cat([*lab, torch.full((PAD,), IGNORE_INDEX)]))
        pos.append(torch.cat([torch.arange(n) for n in (*lengths, PAD)]))
    return torch.stack(ids), torch.stack(labels), torch.stack(pos)


def _model(dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    from padless.attention.backend import register_padless_attention

    register_padless_attention()

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, attn_implementation="padless",
    )  # fmt: skip
    return LlamaForCausalLM(config).to(dtype)


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _gap(local, whole, index) -> float:
    """Largest |difference| of a shard's logits from the whole rows' at its global ``index``; tokens past
    the row (a layout whose chunks need the row end padded: striped at cp = 4 pads 48 to 64) are not compared."""
    keep = index < whole.shape[1]
    return float((local[:, keep] - whole[:, index[keep]]).abs().max())


def _snippet() -> str:
    page = Path(__file__).resolve().parents[2] / "docs" / "context-parallel.md"
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)[0]  # the plain loop's


def _reference(dtype, ids, labels, pos):
    """The single-process packed run (padless attention), and each document alone."""
    from padless.objectives.loss import causal_lm_loss, trained_tokens

    model = _model(dtype)
    logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    loss = causal_lm_loss(logits, labels, int(trained_tokens(labels)))
    loss.backward()
    alone = torch.zeros_like(logits)
    for r, lengths in enumerate(ROWS):
        at = 0
        for n in (*lengths, PAD):
            with torch.no_grad():
                alone[r, at : at + n] = model(input_ids=ids[r : r + 1, at : at + n]).logits[0]
            at += n
    return logits.detach(), alone, loss.detach(), _grads(model)


def _cp_run(dtype, ids, labels, pos, group, cp, rank, fault=None, layout="contiguous"):
    """One context-parallel step on this rank: (local logits, summed loss, summed grads)."""
    import torch.distributed as dist

    import padless.attention.context_parallel as cpmod
    from padless.objectives.context_loss import (
        context_parallel_forward,
        context_parallel_loss,
        sync_context_gradients,
    )
    from padless.objectives.loss import causal_lm_loss

    model = _model(dtype)
    model.set_attn_implementation(cpmod.register_context_parallel_attention())
    shard = split_row(ids, labels, pos, cp=cp, rank=rank, layout=layout)
    original = cpmod.document_mask
    if fault == "mask dropped":  # global causal only: documents see each other
        cpmod.document_mask = lambda d, q, k, w=None: original(torch.zeros_like(d), q, k, w)
    try:
        logits = context_parallel_forward(model, shard, group=group)
    finally:
        cpmod.document_mask = original
    if fault == "labels shifted after the split":
        local = labels[:, shard.index]
        loss = causal_lm_loss(logits, local, shard.num_items)
    elif fault == "loss normalised per rank":
        loss = context_parallel_loss(logits, shard.targets, int((shard.targets != IGNORE_INDEX).sum()))
    else:
        loss = context_parallel_loss(logits, shard.targets, shard.num_items)
    loss.backward()
    sync_context_gradients(model, group)
    total = loss.detach().clone()
    dist.all_reduce(total, group=group)
    return logits.detach(), total, _grads(model), shard.index


def _saved_bytes(model, shard, group) -> tuple[int, int]:
    """(bytes of the tensors autograd saves in a context-parallel forward, bytes of the gathered K/V among
    them), parameters not counted."""
    from padless.objectives.context_loss import context_parallel_forward

    params = {p.data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    gathered = [0]
    length = shard.document_ids.shape[1]

    def pack(t):
        if t.data_ptr() not in params and t.data_ptr() not in seen:
            seen[t.data_ptr()] = t.numel() * t.element_size()
            if t.ndim == 4 and t.shape[2] == length and t.shape[1] == 2:  # a gathered [R, Hk, L, D] K or V
                gathered[0] += seen[t.data_ptr()]
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        context_parallel_forward(model, shard, group=group)
    return sum(seen.values()), gathered[0]


def _sliding_window_diffs(group, cp, rank, layout) -> dict:
    """A Mistral with a 5-token window, fp64: logits and grads against the single-process packed run."""
    from transformers import MistralConfig, MistralForCausalLM

    import padless.attention.context_parallel as cpmod
    from padless.objectives.context_loss import context_parallel_step

    ids, labels, pos = _rows(64)
    config = MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=5, attn_implementation="padless",
    )  # fmt: skip
    torch.manual_seed(0)
    ref = MistralForCausalLM(config).double()
    from padless.objectives.loss import causal_lm_loss, trained_tokens

    ref_logits = ref(input_ids=ids, position_ids=pos, use_cache=False).logits
    causal_lm_loss(ref_logits, labels, int(trained_tokens(labels))).backward()
    torch.manual_seed(0)
    model = MistralForCausalLM(config).double()
    model.set_attn_implementation(cpmod.register_context_parallel_attention())
    shard = split_row(ids, labels, pos, cp=cp, rank=rank, layout=layout)
    context_parallel_step(model, shard, group=group)
    from padless.objectives.context_loss import context_parallel_forward

    with torch.no_grad():
        logits = context_parallel_forward(model, shard, group=group)
    return {
        "logits": _gap(logits, ref_logits.detach(), shard.index),
        "grads": _diff(_grads(model), _grads(ref)),
    }


def _three_steps(group, cp, rank, dtype, optimizer, layout) -> float:
    """Max relative parameter difference after 3 optimiser steps: cp ranks vs one process on the same rows."""
    import padless.attention.context_parallel as cpmod
    from padless.objectives.context_loss import context_parallel_step
    from padless.objectives.loss import causal_lm_loss, trained_tokens

    ids, labels, pos = _rows(64)
    one, split = _model(dtype), _model(dtype)
    split.set_attn_implementation(cpmod.register_context_parallel_attention())
    opt_one, opt_split = optimizer(one.parameters()), optimizer(split.parameters())
    shard = split_row(ids, labels, pos, cp=cp, rank=rank, layout=layout)
    for _ in range(3):
        opt_one.zero_grad()
        logits = one(input_ids=ids, position_ids=pos, use_cache=False).logits
        causal_lm_loss(logits, labels, int(trained_tokens(labels))).backward()
        opt_one.step()
        opt_split.zero_grad()
        context_parallel_step(split, shard, group=group)
        opt_split.step()
    return max(
        float(((a - b).abs().max() / b.abs().max()).item()) for a, b in zip(split.parameters(), one.parameters())
    )


def _child(rank: int, world: int, init: str, out: str) -> None:
    import contextlib
    import io

    import torch.distributed as dist

    import padless.attention.context_parallel as cpmod

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    alone = [dist.new_group([r]) for r in range(world)]
    groups = {4: (None, rank), 2: (pairs[rank // 2], rank % 2)}
    results = {}
    ids, labels, pos = _rows(64)
    memory = {}
    for cp, (group, cp_rank) in {1: (alone[rank], 0), **groups}.items():
        model = _model(torch.float32)
        model.set_attn_implementation(cpmod.register_context_parallel_attention())
        memory[cp] = _saved_bytes(model, split_row(ids, labels, pos, cp=cp, rank=cp_rank), group)
    results["memory"] = {str(cp): list(v) for cp, v in memory.items()}
    for cp, (group, cp_rank) in groups.items():
        sgd = lambda params: torch.optim.SGD(params, lr=0.5)  # noqa: E731
        adamw = lambda params: torch.optim.AdamW(params, lr=1e-2)  # noqa: E731
        for layout in LAYOUTS:
            results[f"window cp={cp} {layout}"] = _sliding_window_diffs(group, cp, cp_rank, layout)
            # Adam divides by the root of tiny second moments, so fp32 rounding of near-zero gradients
            # (1e-8) becomes an update: AdamW is held in fp64, SGD in fp32
            results[f"three steps cp={cp} {layout}"] = max(
                _three_steps(group, cp, cp_rank, torch.float32, sgd, layout),
                _three_steps(group, cp, cp_rank, torch.float64, adamw, layout),
            )
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(_snippet(), "docs/context-parallel.md", "exec"), {"__name__": "__doc_snippet__"})
    results["snippet"] = printed.getvalue()
    for dtype in (torch.float32, torch.float64):
        name = str(dtype).removeprefix("torch.")
        ref_logits, alone, ref_loss, ref_grads = _reference(dtype, ids, labels, pos)
        for cp, (group, cp_rank) in groups.items():
            runs = [*((None, layout) for layout in LAYOUTS), ("mask dropped", "zigzag")]
            if dtype == torch.float32:
                runs += [(f, "contiguous") for f in ("mask dropped", "labels shifted after the split", "loss normalised per rank")]  # fmt: skip
            for fault, layout in runs:
                logits, loss, grads, cut = _cp_run(dtype, ids, labels, pos, group, cp, cp_rank, fault, layout)
                results[f"{name} cp={cp} {fault} {layout}"] = {
                    "logits": _gap(logits, ref_logits.detach(), cut),
                    "alone": _gap(logits, alone, cut),
                    "loss": abs(float(loss - ref_loss)),
                    "grads": _diff(grads, ref_grads),
                }
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    if os.environ.get("PADLESS_CP_PRINT") and rank == 0:
        print(json.dumps(results, indent=1))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def cp_results(tmp_path_factory) -> dict:
    import torch.multiprocessing as mp

    tmp = tmp_path_factory.mktemp("cp")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_child, args=(4, f"file://{tmp / 'init'}", str(tmp)), nprocs=4, join=True)
    return {r: json.loads((tmp / f"rank{r}.json").read_text()) for r in range(4)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cp", [2, 4])
def test_context_parallel_equals_one_process_and_documents_alone(cp_results, cp: int, dtype: str, layout: str) -> None:
    for rank, results in cp_results.items():
        got = results[f"{dtype} cp={cp} None {layout}"]
        assert max(got.values()) < TOL[dtype], (rank, got)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cp", [2, 4])
def test_sliding_windows_are_honoured_in_the_global_mask(cp_results, cp: int, layout: str) -> None:
    for rank, results in cp_results.items():
        got = results[f"window cp={cp} {layout}"]
        assert max(got.values()) < TOL["float64"], (rank, got)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cp", [2, 4])
def test_three_steps_reach_the_one_process_parameters(cp_results, cp: int, layout: str) -> None:
    worst = max(r[f"three steps cp={cp} {layout}"] for r in cp_results.values())
    assert worst < 1e-5, worst


@pytest.mark.parametrize("cp", [2, 4])
def test_activation_memory_per_rank_is_near_one_over_cp_but_the_gathered_kv(cp_results, cp: int) -> None:
    for results in cp_results.values():
        whole, _ = results["memory"]["1"]
        saved, gathered = results["memory"][str(cp)]
        assert gathered > 0
        assert (saved - gathered) / whole < 1.2 / cp, results["memory"]


def test_the_docs_snippet_trains_two_steps(cp_results) -> None:
    out = cp_results[0]["snippet"]
    assert re.search(r"^cp=4 step 2: loss \d+\.\d+, \d+ trained tokens$", out, flags=re.M), out


@pytest.mark.parametrize(
    ("fault", "layout"),
    [
        ("mask dropped", "contiguous"),
        ("mask dropped", "zigzag"),
        ("labels shifted after the split", "contiguous"),
        ("loss normalised per rank", "contiguous"),
    ],
)
@pytest.mark.parametrize("cp", [2, 4])
def test_negative_controls_fail(cp_results, cp: int, fault: str, layout: str) -> None:
    worst = max(max(r[f"float32 cp={cp} {fault} {layout}"].values()) for r in cp_results.values())
    assert worst > 1e3 * TOL["float32"], (fault, worst)


def test_the_rows_cover_every_boundary_case() -> None:
    ids, labels, pos = _rows(64)
    for cp in (2, 4):
        shard = split_row(ids, labels, pos, cp=cp, rank=0)
        docs = shard.document_ids
        bounds = [b * LENGTH // cp for b in range(1, cp)]
        for row in docs:  # every boundary straddled by a document, in each row
            assert all(row[b - 1] == row[b] for b in bounds)
        width = LENGTH // cp  # one document has tokens in every shard
        assert all(bool((docs[0, b * width : (b + 1) * width] == docs[0, 7]).any()) for b in range(cp))
    assert bool((labels[:, -PAD:] == IGNORE_INDEX).all())  # a padded row end, never trained


def test_document_mask_uses_global_indices_and_windows() -> None:
    docs = torch.tensor([[0, 0, 0, 1, 1, 1]])
    keys = torch.arange(6)
    mask = document_mask(docs, torch.tensor([2, 3]), keys)  # queries 2 and 3 of the row
    assert mask[0].int().tolist() == [[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0]]
    assert document_mask(docs, torch.tensor([2]), keys, window=2)[0, 0].int().tolist() == [0, 1, 1, 0, 0, 0]
    shuffled = torch.tensor([5, 0, 3, 1, 4, 2])  # keys in a gathered order: the mask follows their global indices
    assert document_mask(docs, torch.tensor([4]), shuffled)[0, 0].int().tolist() == [0, 0, 1, 0, 1, 0]


def test_zigzag_shards_cover_the_row_once_with_heads_and_tails_paired() -> None:
    ids, labels, pos = _rows(64)
    for cp in (2, 4):
        shards = [split_row(ids, labels, pos, cp=cp, rank=r, layout="zigzag") for r in range(cp)]
        index = torch.cat([s.index for s in shards])
        assert sorted(index.tolist()) == list(range(LENGTH))
        chunk = LENGTH // (2 * cp)
        assert shards[0].index.tolist() == [*range(chunk), *range(LENGTH - chunk, LENGTH)]
        for s in shards:
            assert torch.equal(s.input_ids, ids[:, s.index]) and torch.equal(s.position_ids, pos[:, s.index])
    odd = split_row(ids[:, :45], labels[:, :45], pos[:, :45], cp=4, rank=3, layout="zigzag")  # padded to 48
    assert odd.document_ids.shape[1] == 48 and odd.index.numel() == 12
    with pytest.raises(ValueError, match="layout must be one of contiguous, zigzag, striped"):
        split_row(ids, labels, pos, cp=2, rank=0, layout="ring")


def test_models_it_cannot_make_exact_are_refused_by_name() -> None:
    from transformers import MambaConfig, MambaForCausalLM

    assert context_parallel_refusal(_model(torch.float32)) is None
    torch.manual_seed(0)
    mamba = MambaForCausalLM(MambaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, state_size=8))
    with pytest.raises(ValueError, match="not attention \\(mamba"):
        check_context_parallel(mamba)


def _reference_varlen(
    q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=None, causal=True, window_size=None
):
    """flash-attn's ``flash_attn_varlen_func`` contract, in sdpa: each sequence's queries aligned to its keys'
    end (bottom-right causal), an optional left window ``window_size[0]``."""
    out = torch.empty_like(q)
    for i in range(cu_q.numel() - 1):
        qa, qb, ka, kb = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        qpos = torch.arange(qb - qa) + (kb - ka) - (qb - qa)  # bottom-right: the last query sees the last key
        gap = qpos[:, None] - torch.arange(kb - ka)[None, :]
        mask = gap >= 0
        if window_size is not None:
            mask &= gap <= window_size[0]
        out[qa:qb] = torch.nn.functional.scaled_dot_product_attention(
            q[qa:qb].transpose(0, 1), k[ka:kb].transpose(0, 1), v[ka:kb].transpose(0, 1), attn_mask=mask,
            scale=softmax_scale, enable_gqa=True,
        ).transpose(0, 1)  # fmt: skip
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("window", [None, 5])
def test_the_cuda_varlen_pieces_equal_the_global_mask(monkeypatch, layout: str, window) -> None:
    """The flash-attn path's per-rank pieces (run on CUDA only) against the masked sdpa path, here with a
    stand-in for ``flash_attn_varlen_func`` that follows its documented contract."""
    import sys
    import types

    import padless.attention.context_parallel as cpmod

    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(flash_attn_varlen_func=_reference_varlen))
    ids, labels, pos = _rows(64)
    docs = split_row(ids, labels, pos, cp=4, rank=0, layout=layout).document_ids  # the row end padded as needed
    length = docs.shape[1]
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, length, 8, generator=gen, dtype=torch.float64), torch.randn(2, 2, length, 8, generator=gen, dtype=torch.float64)  # fmt: skip
    v = torch.randn(2, 2, length, 8, generator=gen, dtype=torch.float64)
    for cp in (2, 4):
        order = torch.cat([cpmod.shard_index(length, cp, r, layout) for r in range(cp)])
        for rank in range(cp):
            index = order.reshape(cp, -1)[rank]
            state = cpmod.ContextParallelState(docs, index, order, layout, None)
            got = cpmod._flash_varlen(q[:, :, index], k, v, docs, state, None, 0.0, window)
            mask = document_mask(docs, index, torch.arange(length), window)[:, None]
            want = torch.nn.functional.scaled_dot_product_attention(
                q[:, :, index], k, v, attn_mask=mask, enable_gqa=True
            )
            assert (got - want.transpose(1, 2)).abs().max() < 1e-12, (cp, rank)
