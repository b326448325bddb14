"""Token-mixing layers that are not attention run head-parallel inside a context-parallel forward, exactly:
4 gloo processes, split as one cp = 4 group and as two cp = 2 groups, give the single-process packed run's
logits, loss and every parameter gradient, and each document alone's logits, for a gated-DeltaNet hybrid
(Qwen3.5 text: 4 value heads over 2 key heads, so cp = 4 splits copies of the key heads), a Mamba2
hybrid (Bamba with 2 groups: split with the heads at cp = 2, gathered at cp = 4) and LFM2 (short
convolutions), every layout (contiguous, zigzag, striped), fp32 (1e-5) and fp64 (1e-10). The rows hold a document spanning
every shard and one straddling each boundary. The negative control (each shard scanned alone, no
all-to-all) must fail; heads that do not divide by cp and layers without scans are refused by name."""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager

import pytest
import torch
import transformers as T

from padless.attention.context_parallel import LAYOUTS, check_context_parallel, context_parallel_refusal
from padless.attention.mixers import enable_per_document_mixers
from padless.batching.context_shards import split_row
from padless.layout import IGNORE_INDEX

TOL = {"float32": 1e-5, "float64": 1e-10}
VOCAB = 64
# row 0: a document of 34 spans every shard of cp = 4 (boundaries 12, 24, 36); row 1: a document
# straddles every boundary of cp = 2 and 4; both rows end with 3 padding tokens
ROWS = ([7, 34, 4], [5, 9, 11, 6, 10, 4])
PAD = 3
_COMMON = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
    num_hidden_layers=2, initializer_range=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)  # fmt: skip
CONFIGS = {
    "qwen3_5_text": lambda: T.Qwen3_5TextConfig(
        **_COMMON,
        layer_types=["linear_attention", "full_attention"],
        head_dim=8,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
    ),  # fmt: skip
    "bamba": lambda: T.BambaConfig(
        **_COMMON,
        attn_layer_indices=[1],
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_d_state=8,
        mamba_n_groups=2,
        mamba_chunk_size=8,
        mamba_expand=2,
    ),  # fmt: skip
    "lfm2": lambda: T.Lfm2Config(**_COMMON, layer_types=["conv", "full_attention"], conv_L_cache=3),
}
FP64 = set(CONFIGS)  # families also checked in fp64
FP32_INSIDE = {"qwen3_5_text": r"norm\.weight$"}
"""Parameters whose gradient the model's own code computes in fp32 even in an fp64 model (Qwen3.5's RMSNorm
casts to fp32): summed over a shard's tokens then over ranks, they round differently from one process's
sum, so they are held to the fp32 tolerance; every other gradient to the fp64 one."""
OWN_FP32 = {"qwen3_5_text", "bamba"}
"""Families whose own torch fallbacks (the reference for each document alone) compute the decay in fp32
(``a.float()``, ``A_log.float()``): their documents alone are held to the fp32 tolerance in fp64 too."""


def _rows():
    gen = torch.Generator().manual_seed(0)
    ids, labels, pos = [], [], []
    for lengths in ROWS:
        docs = [torch.randint(3, VOCAB, (n,), generator=gen) for n in lengths]
        lab = [d.clone() for d in docs]
        for d in lab:
            d[0] = IGNORE_INDEX
        ids.append(torch.cat([*docs, torch.zeros(PAD, dtype=torch.long)]))
        labels.append(torch.cat([*lab, torch.full((PAD,), IGNORE_INDEX)]))
        pos.append(torch.cat([torch.arange(n) for n in (*lengths, PAD)]))
    return torch.stack(ids), torch.stack(labels), torch.stack(pos)


def _model(family: str, dtype, attn: str = "padless"):
    from padless.attention.backend import register_padless_attention

    register_padless_attention()
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(CONFIGS[family](), attn_implementation=attn).to(dtype).eval()
    enable_per_document_mixers(model)
    return model


def _grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _diff(a: dict, b: dict, keep=lambda name: True) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max((float((a[k] - b[k]).abs().max()) for k in a if keep(k)), default=0.0)


def _reference(family, dtype, ids, labels, pos):
    """The single-process packed run (padless attention and scans), and each document alone."""
    from padless.objectives.loss import causal_lm_loss, trained_tokens

    model = _model(family, dtype)
    logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    loss = causal_lm_loss(logits, labels, int(trained_tokens(labels)))
    loss.backward()
    alone = torch.zeros_like(logits)
    for r, lengths in enumerate(ROWS):
        at = 0
        for n in (*lengths, PAD):
            with torch.no_grad():
                alone[r, at : at + n] = model(input_ids=ids[r : r + 1, at : at + n], use_cache=False).logits[0]
            at += n
    return logits.detach(), alone, loss.detach(), _grads(model)


@contextmanager
def _local_scans(home, names, state):
    """The negative control: each shard scanned on its own tokens only (padless' per-row scans over
    the shard's documents), no all-to-all."""
    from padless.attention import mixers

    ids = state.document_ids[:, state.index]
    local = ids + torch.arange(ids.shape[0])[:, None] * state.length
    saved = {name: getattr(home, name) for name in names}
    for name in names:
        setattr(home, name, mixers._SCANS[name](local))
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(home, name, function)


def _gap(local, whole, index) -> float:
    """Largest |difference| of a shard's logits from the whole rows' at its global ``index``; tokens past
    the row (striped chunks at cp = 4 pad the 48-token rows to 64) are not compared."""
    keep = index < whole.shape[1]
    return float((local[:, keep] - whole[:, index[keep]]).abs().max())


def _cp_run(family, dtype, ids, labels, pos, group, cp, rank, layout, fault=None):
    import torch.distributed as dist

    import padless.attention.context_parallel as cpmod
    from padless.attention import context_mixers
    from padless.objectives.context_loss import context_parallel_forward, context_parallel_loss, sync_context_gradients

    model = _model(family, dtype)
    model.set_attn_implementation(cpmod.register_context_parallel_attention())
    if fault == "checkpointed":  # not a fault: every layer recomputed in the backward, inside the cp state
        model.train()
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    shard = split_row(ids, labels, pos, cp=cp, rank=rank, layout=layout)
    original = context_mixers._head_parallel_scans
    if fault == "shard scanned alone":
        context_mixers._head_parallel_scans = _local_scans
    try:
        logits = context_parallel_forward(model, shard, group=group)
    finally:
        context_mixers._head_parallel_scans = original
    loss = context_parallel_loss(logits, shard.targets, shard.num_items)
    loss.backward()
    sync_context_gradients(model, group)
    total = loss.detach().clone()
    dist.all_reduce(total, group=group)
    return logits.detach(), total, _grads(model), shard.index


def _uneven_heads(group, rank: int, ids, labels, pos) -> list[str]:
    """On a cp = 3 group (Qwen3.5's 4 value heads do not split in 3): ``context_parallel_forward``'s
    refusal before the forward, and the layer's own error when the model runs in the context directly."""
    import padless.attention.context_parallel as cpmod
    from padless.objectives.context_loss import context_parallel_forward

    model = _model("qwen3_5_text", torch.float32)
    model.set_attn_implementation(cpmod.register_context_parallel_attention())
    shard = split_row(ids, labels, pos, cp=3, rank=rank)
    said = []
    for run in (
        lambda: context_parallel_forward(model, shard, group=group),
        lambda: _in_context(model, shard, group),
    ):
        try:
            run()
            said.append("")
        except ValueError as error:
            said.append(str(error))
    return said


def _in_context(model, shard, group):
    import padless.attention.context_parallel as cpmod

    with cpmod.context_parallel(shard.document_ids, group=group):
        model(input_ids=shard.input_ids, position_ids=shard.position_ids, use_cache=False)


def _child(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    three = dist.new_group([0, 1, 2])
    groups = {4: (None, rank), 2: (pairs[rank // 2], rank % 2)}
    ids, labels, pos = _rows()
    results = {}
    if rank < 3:
        results["uneven"] = _uneven_heads(three, rank, ids, labels, pos)
    dist.barrier()
    for family in CONFIGS:
        for dtype in (torch.float32, torch.float64) if family in FP64 else (torch.float32,):
            name = str(dtype).removeprefix("torch.")
            ref_logits, alone, ref_loss, ref_grads = _reference(family, dtype, ids, labels, pos)
            fp32_inside = FP32_INSIDE.get(family, "^$")
            for cp, (group, cp_rank) in groups.items():
                runs = [(layout, None) for layout in LAYOUTS]
                if dtype == torch.float32:
                    runs.append(("contiguous", "shard scanned alone"))
                else:
                    runs.append(("zigzag", "checkpointed"))
                for layout, fault in runs:
                    logits, loss, grads, cut = _cp_run(
                        family, dtype, ids, labels, pos, group, cp, cp_rank, layout, fault
                    )
                    results[f"{family} {name} cp={cp} {layout} {fault}"] = {
                        "logits": _gap(logits, ref_logits, cut),
                        "alone": _gap(logits, alone, cut),
                        "loss": abs(float(loss - ref_loss)),
                        "grads": _diff(grads, ref_grads, lambda k: not re.search(fp32_inside, k)),
                        "fp32 grads": _diff(grads, ref_grads, lambda k: bool(re.search(fp32_inside, k))),
                    }
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    if os.environ.get("PADLESS_CP_PRINT") and rank == 0:
        print("\n".join(f"{k}: {json.dumps(v)}" for k, v in results.items()))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def cp_results(tmp_path_factory) -> dict:
    import torch.multiprocessing as mp

    tmp = tmp_path_factory.mktemp("cp_mixers")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_child, args=(4, f"file://{tmp / 'init'}", str(tmp)), nprocs=4, join=True)
    return {r: json.loads((tmp / f"rank{r}.json").read_text()) for r in range(4)}


CASES = [(f, d) for f in CONFIGS for d in ("float32", "float64") if d == "float32" or f in FP64]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize(("family", "dtype"), CASES)
def test_head_parallel_mixers_equal_one_process_and_documents_alone(cp_results, family, dtype, cp, layout) -> None:
    for rank, results in cp_results.items():
        got = dict(results[f"{family} {dtype} cp={cp} {layout} None"])
        assert got.pop("fp32 grads") < TOL["float32"], (rank, got)
        assert got.pop("alone") < TOL["float32" if family in OWN_FP32 else dtype], (rank, got)
        assert max(got.values()) < TOL[dtype], (rank, got)


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("family", sorted(FP64))
def test_activation_checkpointing_recomputes_inside_the_context(cp_results, family, cp) -> None:
    """Every layer checkpointed (transformers' non-reentrant default): the backward recomputes attention and
    scans after the context closed, and must gather and all-to-all as the forward did (fp64, zigzag)."""
    for rank, results in cp_results.items():
        got = dict(results[f"{family} float64 cp={cp} zigzag checkpointed"])
        assert got.pop("fp32 grads") < TOL["float32"], (rank, got)
        got.pop("alone")
        assert max(got.values()) < TOL["float64"], (rank, got)


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("family", list(CONFIGS))
def test_scanning_each_shard_alone_fails(cp_results, family, cp) -> None:
    worst = max(
        max(r[f"{family} float32 cp={cp} contiguous shard scanned alone"].values()) for r in cp_results.values()
    )
    assert worst > 1e2 * TOL["float32"], worst


def test_the_forward_refuses_heads_that_do_not_divide_by_cp(cp_results) -> None:
    for rank in range(3):
        before, inside = cp_results[rank]["uneven"]
        assert (
            "has 4 value heads in model.layers.0.linear_attn (Qwen3_5GatedDeltaNet) (gated_deltanet), which do not divide by cp=3"
            in before
        ), before
        assert "value heads of Qwen3_5GatedDeltaNet (4) do not divide by the cp group's size 3" in inside, inside


def test_scanned_mixers_are_accepted_and_uneven_heads_refused_by_name() -> None:
    for family in CONFIGS:
        model = _model(family, torch.float32)
        for cp in (None, 2, 4):
            assert context_parallel_refusal(model, cp) is None, (family, cp)
    qwen = _model("qwen3_5_text", torch.float32)
    with pytest.raises(ValueError, match=r"has 4 value heads in model\.layers\.0\.linear_attn .* cp=3"):
        check_context_parallel(qwen, cp=3)
    bamba = _model("bamba", torch.float32)
    with pytest.raises(ValueError, match=r"has 4 heads in model\.layers\.0\.mamba .* cp=8"):
        check_context_parallel(bamba, cp=8)
    lfm2 = _model("lfm2", torch.float32)
    with pytest.raises(ValueError, match=r"has 32 convolution channels in .* cp=3"):
        check_context_parallel(lfm2, cp=3)


def test_unpatched_mixers_and_layers_without_scans_are_refused_by_name() -> None:
    torch.manual_seed(0)
    plain = T.AutoModelForCausalLM.from_config(CONFIGS["lfm2"]())
    with pytest.raises(ValueError, match="unpatched; call padless.attention.mixers.enable_per_document_mixers"):
        check_context_parallel(plain)
    mamba = T.MambaForCausalLM(T.MambaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, state_size=8))
    enable_per_document_mixers(mamba)
    with pytest.raises(ValueError, match=r"not attention \(mamba: backbone\.layers\.0\.mixer \(MambaMixer\)\)"):
        check_context_parallel(mamba, cp=2)


def test_scan_documents_never_run_from_one_row_into_the_next() -> None:
    from types import SimpleNamespace

    from padless.attention.context_mixers import _documents

    state = SimpleNamespace(document_ids=torch.tensor([[0, 0, 0, 0], [0, 0, 1, 1]]), length=4)
    doc = _documents(state, torch.device("cpu")).reshape(-1)  # the rows as the scans see them: one sequence
    assert doc[3] != doc[4] and doc[4] == doc[5] and doc[5] != doc[6], doc.tolist()
