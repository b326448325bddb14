"""Chunked scans over a whole packed row that take its document boundaries: the short causal
convolution, the gated delta rule (Qwen3.5, Qwen3-Next, OLMo-hybrid) and Mamba2's SSD (Bamba, Granite 4,
Nemotron-H, Falcon-H1, Zamba2). The row's chunks run once; boundaries enter as masks, never as
``-inf`` decays (``exp(-inf - -inf)`` is NaN in fp32)::

    doc       0 0 0 1 1 | 1 1 2 2 2 | 2 3 3 3 3      row of 15 tokens, chunks of 5
    same      a token reads earlier tokens of its own document inside its chunk
    carry-in  chunk 2 reads the state entering it for its tokens of document 1 only (0 0 ... for doc 2)
    carry-out the state leaving chunk 2 holds document 2's tokens only (document 1 ended inside it)

Rows are flattened to one sequence (documents never cross a row end), so one scan covers a batch.
Each function has the signature of the torch fallback transformers calls in the family's module
(``causal_conv1d_fn``, ``torch_chunk_gated_delta_rule``, ``mamba2_chunk_scan``) plus ``doc``: ``[B, L]``
document index of each token. tests/attention/test_scans.py holds each against every document run
alone through the model's own function, fp32 and fp64, outputs and gradients.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

NO_DOCUMENT = -1
"""Document index of the tokens that pad a sequence to whole chunks."""


def document_index(cu_seqlens: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """``[B, L]`` document index of each token of ``B`` rows of ``L`` tokens from ``[N + 1]`` offsets
    over the flat tokens."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    index = torch.repeat_interleave(torch.arange(lengths.numel(), device=cu_seqlens.device), lengths)
    return index.reshape(batch, length)


def _activation(name: str | None) -> Callable[[torch.Tensor], torch.Tensor]:
    if name is None:
        return lambda x: x
    from transformers.activations import ACT2FN

    return ACT2FN[name]


def causal_conv1d(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    doc: torch.Tensor,
) -> torch.Tensor:
    """Depthwise causal convolution ``[B, D, L]`` -> ``[B, D, L]`` (``weight`` ``[D, K]``) in which a token
    reads the ``K - 1`` tokens before it only where they belong to its document: tap ``j`` (the token
    ``j`` back) is masked where ``doc`` differs."""
    batch, dim, length = hidden_states.shape
    kernel = weight.shape[-1]
    x = hidden_states.to(weight.dtype)
    out = x * weight[:, kernel - 1, None]
    for back in range(1, min(kernel, length)):
        shifted = F.pad(x[..., : length - back], (back, 0))  # [B, D, L]: token t - back at t
        same = torch.zeros(batch, length, dtype=torch.bool, device=doc.device)
        same[:, back:] = doc[:, back:] == doc[:, : length - back]
        out = out + shifted * weight[:, kernel - 1 - back, None] * same[:, None, :].to(x.dtype)
    if bias is not None:
        out = out + bias[:, None]
    return _activation(activation)(out).to(hidden_states.dtype)


def _chunked(doc: torch.Tensor, chunk: int) -> tuple[torch.Tensor, ...]:
    """Masks of a flat ``[T]`` document index cut into ``n`` chunks of ``chunk`` (``T`` a multiple):
    ``same [n, C, C]`` (query i, key j of one document), ``carry_in [n, C]`` (token reads the state
    entering its chunk), ``carry_out [n, C]`` (token's document is the chunk's last, whose state leaves
    it), ``through [n]`` (the entering state survives the whole chunk)."""
    d = doc.reshape(-1, chunk)  # [n, C]
    before = torch.cat([d.new_full((1,), -2), d[:-1, -1]])  # [n]: document of the token before each chunk
    same = d[:, :, None] == d[:, None, :]
    carry_in = (d == before[:, None]) & (d != NO_DOCUMENT)
    carry_out = d == d[:, -1:]
    return same, carry_in, carry_out, carry_in[:, -1]


def _flat(x: torch.Tensor) -> torch.Tensor:
    """``[B, L, ...]`` -> ``[1, B * L, ...]``: rows one after another."""
    return x.reshape(1, x.shape[0] * x.shape[1], *x.shape[2:])


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """fp32 for fp32 and half-precision inputs (transformers' torch paths compute in fp32), fp64 for fp64."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunk_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    doc: torch.Tensor,
    chunk_size: int = 64,
    use_qk_l2norm_in_kernel: bool = False,
) -> torch.Tensor:
    """The gated delta rule over packed documents. ``query``/``key`` ``[B, L, Hk, dk]``, ``value``
    ``[B, L, Hv, dv]``, ``g`` (log decay, <= 0) and ``beta`` ``[B, L, Hv]`` -> ``[B, L, Hv, dv]``; the state
    ``[Hv, dk, dv]`` starts at zero at every document. Computed in fp32 as transformers' torch path is
    (fp64 inputs in fp64)."""
    batch, length, heads_k, _ = key.shape
    heads_v, dim_v = value.shape[-2:]
    if heads_k != heads_v:  # each query/key head serves heads_v // heads_k value heads
        query = query.repeat_interleave(heads_v // heads_k, dim=2)
        key = key.repeat_interleave(heads_v // heads_k, dim=2)
    compute = _compute_dtype(value)
    q, k, v, b, decay = (_flat(x).transpose(1, 2).to(compute).contiguous() for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    q = q * q.shape[-1] ** -0.5
    total = batch * length
    pad = (chunk_size - total % chunk_size) % chunk_size
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    b, decay = (F.pad(x, (0, pad)) for x in (b, decay))
    flat_doc = F.pad(doc.reshape(-1), (0, pad), value=NO_DOCUMENT)
    same, carry_in, carry_out, through = _chunked(flat_doc, chunk_size)

    chunk = lambda x: x.reshape(1, heads_v, -1, chunk_size, x.shape[-1])  # noqa: E731 [1, H, n, C, d]
    q, k, v_beta, k_beta = chunk(q), chunk(k), chunk(v * b[..., None]), chunk(k * b[..., None])
    cum = decay.reshape(1, heads_v, -1, chunk_size).cumsum(-1)  # [1, H, n, C]
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    pairwise = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp() * same
    system = (k_beta @ k.transpose(-1, -2)) * pairwise  # unit lower triangular where it is solved
    intra = (q @ k.transpose(-1, -2)) * pairwise
    read = carry_in[..., None].float()  # [n, C, 1]: tokens that read the state entering their chunk
    new_values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_read = torch.linalg.solve_triangular(
        system, k_beta * cum.exp()[..., None] * read, upper=False, unitriangular=True
    )
    q_read = q * cum.exp()[..., None] * read
    k_write = k * (cum[..., -1:] - cum).exp()[..., None] * carry_out[..., None].float()
    keep = cum[..., -1].exp() * through.float()  # [1, H, n]

    state = q.new_zeros(1, heads_v, k.shape[-1], dim_v)
    outs = []
    # chunks taken with unbind and outputs stacked once: indexing a chunk of a graph tensor in the loop
    # would make backward fill a whole-row gradient per chunk (quadratic in the chunks of a row)
    steps = zip(*(t.unbind(2) for t in (new_values, k_read, q_read, intra, k_write, keep)), strict=True)
    for values, reads, queries, within, writes, kept in steps:
        v_new = values - reads @ state
        outs.append(queries @ state + within @ v_new)
        state = state * kept[..., None, None] + writes.transpose(-1, -2) @ v_new
    out = torch.stack(outs, dim=2).reshape(1, heads_v, -1, dim_v)[:, :, :total].transpose(1, 2)
    return out.reshape(batch, length, heads_v, dim_v).to(query.dtype)


def _segment_sum(x: torch.Tensor) -> torch.Tensor:
    """``[..., C]`` -> ``[..., C, C]``: entry ``(i, j)`` the sum of ``x[j + 1 .. i]`` for ``j <= i``, ``-inf``
    above the diagonal (summed in place, not as a difference of cumsums, for precision)."""
    size = x.shape[-1]
    x = x[..., None].expand(*x.shape, size)
    x = x.masked_fill(~torch.ones(size, size, dtype=torch.bool, device=x.device).tril(-1), 0)
    out = x.cumsum(dim=-2)
    return out.masked_fill(~torch.ones(size, size, dtype=torch.bool, device=x.device).tril(0), float("-inf"))


def mamba2_chunk_scan(
    hidden_states: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    doc: torch.Tensor,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
) -> torch.Tensor:
    """Mamba2's SSD over packed documents. ``hidden_states`` ``[B, L, H, P]``, ``dt`` ``[B, L, H]``, ``A``
    ``[H]``, ``B``/``C`` ``[B, L, G, N]`` -> ``[B, L, H, P]`` (fp32 as transformers' torch path, fp64 inputs in fp64); the state
    ``[H, P, N]`` starts at zero at every document."""
    batch, length, heads, head_dim = hidden_states.shape
    groups = B.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1])
    compute = _compute_dtype(hidden_states)
    x = _flat(hidden_states).to(compute)
    dt, B, C = _flat(dt).to(compute), _flat(B).to(compute), _flat(C).to(compute)
    B = B.repeat_interleave(heads // groups, dim=2, output_size=heads)
    C = C.repeat_interleave(heads // groups, dim=2, output_size=heads)
    total = batch * length
    pad = (chunk_size - total % chunk_size) % chunk_size
    residual = None if D is None else D[..., None] * F.pad(x, (0, 0, 0, 0, 0, pad))
    x = x * dt[..., None]
    a = A.to(x.dtype) * dt  # [1, T, H]
    x, a, B, C = (F.pad(t, (0, 0) * (t.ndim - 2) + (0, pad)) for t in (x, a, B, C))
    flat_doc = F.pad(doc.reshape(-1), (0, pad), value=NO_DOCUMENT)
    same, carry_in, carry_out, _ = _chunked(flat_doc, chunk_size)
    n = x.shape[1] // chunk_size
    x, B, C = (t.reshape(1, n, chunk_size, *t.shape[2:]) for t in (x, B, C))  # [1, n, C, H, .]
    a = a.reshape(1, n, chunk_size, heads).permute(0, 3, 1, 2)  # [1, H, n, C]
    a_cum = a.cumsum(-1)

    # inside each chunk: attention-like weights between tokens of one document
    decay = _segment_sum(a).exp() * same  # [1, H, n, C, C]
    weights = torch.einsum("bclhn,bcshn->bclsh", C, B) * decay.permute(0, 2, 3, 4, 1)
    y_diag = torch.einsum("bclsh,bcshp->bclhp", weights, x)
    # each chunk's end state, from its last document's tokens
    to_end = (a_cum[..., -1:] - a_cum).exp() * carry_out  # [1, H, n, C]
    states = torch.einsum("bclhn,bclhp->bchpn", B * to_end.permute(0, 2, 3, 1)[..., None], x)
    # between chunks: an end state reaches a later chunk's start only inside one document
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)  # [1, n + 1, H, P, N]
    d = flat_doc.reshape(n, chunk_size)
    end_doc = torch.cat([d.new_full((1,), -2), d[:, -1]])  # document of each state's source (0: none)
    start_doc = torch.cat([d[:, 0], d[-1:, -1]])  # document each target state belongs to
    link = (end_doc[:, None] == start_doc[None, :]).T  # [target, source]
    chunk_decay = _segment_sum(F.pad(a_cum[..., -1], (1, 0))).exp() * link  # [1, H, n + 1, n + 1]
    starts = torch.einsum("bhcz,bzhpn->bchpn", chunk_decay, states)[:, :-1]  # [1, n, H, P, N]
    from_start = a_cum.exp() * carry_in  # [1, H, n, C]
    y_off = torch.einsum("bclhn,bchpn->bclhp", C, starts) * from_start.permute(0, 2, 3, 1)[..., None]
    out = (y_diag + y_off).reshape(1, n * chunk_size, heads, head_dim)
    if residual is not None:
        out = out + residual
    return out[:, :total].reshape(batch, length, heads, head_dim).contiguous()  # callers .view() it (Falcon-H1)
