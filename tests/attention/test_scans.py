"""The document-aware chunked scans (padless.attention.scans) against each document run alone through
transformers' own torch functions (Qwen3.5's convolution and gated delta rule, Bamba's Mamba2 SSD):
outputs and gradients, fp64 (1e-10) and fp32 (1e-5), with documents of one token, of exactly one chunk,
straddling chunk edges, starting a row, and several rows."""

from __future__ import annotations

import pytest
import torch
from transformers.models.bamba import modeling_bamba
from transformers.models.qwen3_5 import modeling_qwen3_5

from padless.attention import scans

CHUNK = 4
LAYOUTS = {
    # rows of document lengths (one list per row; rows of equal total length)
    "one_token_documents": [[1, 1, 3, 1, 2]],
    "exactly_one_chunk": [[4, 4, 1, 3]],
    "straddling_edges": [[3, 6, 2, 5]],
    "long_and_short": [[11, 1, 2]],
    "two_rows": [[5, 2, 3], [1, 9]],
}
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


def _doc(rows: list[list[int]]) -> torch.Tensor:
    ids, start = [], 0
    for row in rows:
        ids.append(torch.repeat_interleave(torch.arange(start, start + len(row)), torch.tensor(row)))
        start += len(row)
    return torch.stack(ids)  # [B, L]


def _spans(rows: list[list[int]]):
    """(row, start, length) of each document."""
    for r, row in enumerate(rows):
        at = 0
        for n in row:
            yield r, at, n
            at += n


def _check(packed, alone_fn, inputs, rows, dtype, time_dim=1):
    """``packed`` [B, L, ...] output (time on ``time_dim``) against ``alone_fn`` applied to each document's
    slice of ``inputs``; then the gradients of a random projection of both."""
    tol = TOLERANCE[dtype]
    weight = torch.randn_like(packed)
    (packed * weight).sum().backward()
    got = [x.grad.clone() for x in inputs]
    for x in inputs:
        x.grad = None
    total = 0
    for r, at, n in _spans(rows):
        part = [x[r : r + 1].narrow(time_dim, at, n) for x in inputs]
        alone = alone_fn(*part)
        want = packed[r : r + 1].narrow(time_dim, at, n)
        torch.testing.assert_close(want, alone, atol=tol, rtol=tol)
        total = total + (alone * weight[r : r + 1].narrow(time_dim, at, n)).sum()
    total.backward()
    for g, x in zip(got, inputs, strict=True):
        torch.testing.assert_close(g, x.grad, atol=tol, rtol=tol)


def _leaf(*shape, dtype, scale=1.0, generator):
    return (torch.randn(*shape, dtype=dtype, generator=generator) * scale).requires_grad_()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_causal_conv1d_equals_each_document_alone(layout, dtype):
    rows = LAYOUTS[layout]
    g = torch.Generator().manual_seed(0)
    length = sum(rows[0])
    x = _leaf(len(rows), 6, length, dtype=dtype, generator=g)
    weight = torch.randn(6, 4, dtype=dtype, generator=g)
    bias = torch.randn(6, dtype=dtype, generator=g)
    packed = scans.causal_conv1d(x, weight, bias, "silu", _doc(rows))

    def alone(part):
        return modeling_qwen3_5.causal_conv1d_fn(part, weight, bias, activation="silu")

    _check(packed, alone, [x], rows, dtype, time_dim=2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_gated_delta_rule_equals_each_document_alone(layout, dtype):
    rows = LAYOUTS[layout]
    g = torch.Generator().manual_seed(1)
    batch, length = len(rows), sum(rows[0])
    q = _leaf(batch, length, 2, 8, dtype=dtype, generator=g)
    k = _leaf(batch, length, 2, 8, dtype=dtype, generator=g)
    v = _leaf(batch, length, 4, 8, dtype=dtype, generator=g)  # grouped: 2 value heads per key head
    decay = (-torch.rand(batch, length, 4, dtype=dtype, generator=g) * 2).requires_grad_()
    beta = torch.rand(batch, length, 4, dtype=dtype, generator=g).requires_grad_()
    doc = _doc(rows)
    if dtype is torch.float64:  # transformers' function computes in fp32; compare fp64 with fp64 math
        own = _delta_rule_fp64
    else:

        def own(*p):
            return modeling_qwen3_5.torch_chunk_gated_delta_rule(*p, chunk_size=CHUNK, use_qk_l2norm_in_kernel=True)[0]

    packed = scans.chunk_gated_delta_rule(q, k, v, decay, beta, doc, chunk_size=CHUNK, use_qk_l2norm_in_kernel=True)
    _check(packed, own, [q, k, v, decay, beta], rows, dtype)


def _delta_rule_fp64(q, k, v, decay, beta):
    """The gated delta rule token by token in fp64 (transformers' recurrent form, without its fp32 cast)."""
    heads_v = v.shape[2]
    q = q.repeat_interleave(heads_v // q.shape[2], dim=2)
    k = k.repeat_interleave(heads_v // k.shape[2], dim=2)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * q.shape[-1] ** -0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    state = q.new_zeros(q.shape[0], heads_v, q.shape[-1], v.shape[-1])
    out = []
    for t in range(q.shape[1]):
        state = state * decay[:, t].exp()[..., None, None]
        kv = (state * k[:, t, :, :, None]).sum(-2)
        delta = (v[:, t] - kv) * beta[:, t, :, None]
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        out.append((state * q[:, t, :, :, None]).sum(-2))
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_mamba2_scan_equals_each_document_alone(layout, dtype):
    rows = LAYOUTS[layout]
    g = torch.Generator().manual_seed(2)
    batch, length = len(rows), sum(rows[0])
    x = _leaf(batch, length, 4, 3, dtype=dtype, generator=g)
    dt = _leaf(batch, length, 4, dtype=dtype, generator=g)
    B = _leaf(batch, length, 2, 5, dtype=dtype, generator=g)
    C = _leaf(batch, length, 2, 5, dtype=dtype, generator=g)
    A = -torch.rand(4, dtype=dtype, generator=g) * 3
    D = torch.randn(4, dtype=dtype, generator=g)
    dt_bias = torch.randn(4, dtype=dtype, generator=g)
    options = dict(D=D, dt_bias=dt_bias, dt_softplus=True)

    def own(*p):
        out = modeling_bamba.mamba2_chunk_scan(*p[:2], A, *p[2:], chunk_size=CHUNK, **options)
        return out.to(dtype)

    packed = scans.mamba2_chunk_scan(x, dt, A, B, C, CHUNK, _doc(rows), **options)
    if dtype is torch.float64:  # transformers' scan casts to fp32: compare with its math in fp64
        own = _ssd_fp64(A, D, dt_bias)
    _check(packed.to(dtype), own, [x, dt, B, C], rows, dtype)


def _ssd_fp64(A, D, dt_bias):
    """Mamba2's recurrence token by token in fp64."""

    def run(x, dt, B, C):
        dt = torch.nn.functional.softplus(dt + dt_bias)
        heads = x.shape[2]
        B = B.repeat_interleave(heads // B.shape[2], dim=2)
        C = C.repeat_interleave(heads // C.shape[2], dim=2)
        state = x.new_zeros(x.shape[0], heads, x.shape[-1], B.shape[-1])
        out = []
        for t in range(x.shape[1]):
            state = (
                state * (A * dt[:, t]).exp()[..., None, None]
                + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, :, None, :]
            )
            out.append((state * C[:, t, :, None, :]).sum(-1) + D[:, None] * x[:, t])
        return torch.stack(out, dim=1)

    return run


def test_document_index_from_offsets():
    cu = torch.tensor([0, 3, 5, 6, 10, 12], dtype=torch.int32)
    assert scans.document_index(cu, 2, 6).tolist() == [[0, 0, 0, 1, 1, 2], [3, 3, 3, 3, 4, 4]]


def test_no_nan_from_strong_decays_in_fp32():
    """Decays of -80 per token (exp underflows to 0) across boundaries: masks, not -inf decays, so no NaN."""
    rows = [[3, 5]]
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 8, 2, 4, generator=g) for _ in range(3))
    decay = torch.full((1, 8, 2), -80.0)
    beta = torch.rand(1, 8, 2, generator=g)
    out = scans.chunk_gated_delta_rule(q, k, v, decay, beta, _doc(rows), chunk_size=CHUNK)
    assert torch.isfinite(out).all()


def test_without_the_masks_documents_mix():
    """Negative control: the same rows scanned as one document differ from each document alone."""
    rows = LAYOUTS["straddling_edges"]
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 16, 2, 4, generator=g) for _ in range(3))
    decay, beta = -torch.rand(1, 16, 2, generator=g), torch.rand(1, 16, 2, generator=g)
    masked = scans.chunk_gated_delta_rule(q, k, v, decay, beta, _doc(rows), chunk_size=CHUNK)
    one = scans.chunk_gated_delta_rule(q, k, v, decay, beta, torch.zeros(1, 16, dtype=torch.long), chunk_size=CHUNK)
    assert torch.equal(masked[:, :3], one[:, :3])  # the first document reads nothing before it either way
    assert (masked[:, 3:] - one[:, 3:]).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("family", "said"),
    [
        ("qwen3_5_text", "gated_deltanet layer: one chunked scan"),
        ("bamba", "mamba2 layer: one chunked scan"),
        ("lfm2", "short_conv layer: one chunked scan"),
        ("kimi_linear", "kimi_delta_attention layer: each document alone (regrouped"),
    ],
)
def test_the_verdict_says_which_path_each_mixer_kind_takes(family, said):
    from test_mixers import build

    import padless

    model = build(family, "sdpa")
    padless.PackingCollator.for_model(model, max_length=32)
    verdict = padless.check_exact(model, "sdpa", max_length=32)
    assert said in verdict.mixers


@pytest.mark.parametrize("family", ["qwen3_5_text", "bamba", "lfm2"])
def test_row_padding_never_enters_a_mixer(family, monkeypatch):
    """Rows of one micro-batch filled unequally: the collator sends each row's trailing padding, the hook
    takes the key out of the call, and the scans run the real tokens only (one sequence), packed == alone."""
    from test_mixers import EXACT, VOCAB, alone_logits, build, packed_logits

    import padless
    from conftest import make_features
    from padless.layout import ROW_PADDING

    model = build(family, "sdpa")
    batch = padless.PackingCollator.for_model(model, max_length=24)(make_features([20, 3, 9, 17], vocab_size=VOCAB))
    rows, width = batch["input_ids"].shape
    assert rows > 1 and int(batch[ROW_PADDING].sum()) > 0
    seen = []
    conv = scans.causal_conv1d
    monkeypatch.setattr(scans, "causal_conv1d", lambda x, *a: seen.append(x.shape[-1] * x.shape[0]) or conv(x, *a))
    with torch.no_grad():
        diff = packed_logits(model, batch, "sdpa") - alone_logits(model, batch)
    real = torch.arange(width)[None, :] < (width - batch[ROW_PADDING])[:, None]  # the padding is no document
    assert diff[real].abs().max().item() <= EXACT
    assert seen and set(seen) == {rows * width - int(batch[ROW_PADDING].sum())}  # no padding token scanned


@pytest.mark.parametrize("reentrant", [False, True])
def test_row_padding_skipped_under_gradient_checkpointing(reentrant):
    """The recomputation in backward skips the same padding (carried with the layer's documents): the
    gradients equal those without checkpointing."""
    from test_mixers import VOCAB, build

    import padless
    from conftest import make_features

    grads = []
    for checkpointing in (False, True):
        model = build("bamba", "sdpa").train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        batch = padless.PackingCollator.for_model(model, max_length=24)(make_features([20, 3, 9, 17], vocab_size=VOCAB))
        model(**{k: v for k, v in batch.items() if k != "labels"}).logits.square().mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5)
