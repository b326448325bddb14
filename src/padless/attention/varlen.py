"""Exact causal attention over packed documents, with cost that follows the documents.

A packed row of ``L`` tokens holding documents of lengths ``l_i`` needs only ``sum(l_i^2)`` score
entries, not ``L^2``. :func:`varlen_attention` takes the flash-attn "varlen" layout: every token of
the batch on one axis, and ``cu_seqlens`` giving the document boundaries on that axis::

    q, k, v     [T, H, D]         T = total tokens (B * L for a packed batch), H heads, D head dim
    cu_seqlens  [N + 1]           0 = c_0 < c_1 < ... < c_N = T; document i is tokens c_i .. c_{i+1}-1

Kernels (one table, :data:`KERNELS`, chosen by ``impl``):

- ``grouped_sdpa`` (any device, any dtype): sort documents by length, cut the sorted list into
  buckets by a small dynamic program over a cost model (:class:`BucketCost`), pad each document to
  its bucket's longest and run one causal SDPA call per bucket. Padding sits at the end of a
  document, so causal attention never lets a real token see it; padded rows are dropped and get a
  zero gradient. Chosen by measurement (``benchmarks/attention.py``, 2 CPU cores, torch 2.13): it
  beats one SDPA call per document (per-call overhead) and the dense mask (``L^2`` work). Nested
  (jagged) tensors were tried too: torch 2.13's SDPA refuses them with ``is_causal=True`` on CPU.
- ``flash_attn`` (CUDA, fp16/bf16): ``flash_attn.flash_attn_varlen_func`` when flash-attn is
  installed; supports dropout, sliding windows and logit soft-capping.
- ``torch_varlen`` (CUDA sm80+, fp16/bf16): ``torch.nn.attention.varlen.varlen_attn`` (shipped by torch 2.13);
  no dropout, no soft-capping.

``auto`` picks flash_attn, then torch_varlen, then grouped_sdpa, skipping any that cannot run the
call exactly or whose limits (sm80+, head size: :mod:`padless.attention.kernels`) the call exceeds. :func:`reference_varlen_attention` is the slow dense oracle the tests hold them to.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from padless.attention.host import host_values, to_device
from padless.attention.kernels import flash_attn_installed, kernel_refusal
from padless.devices import is_half_precision
from padless.planning.partition import optimal_length_partition

VarlenImpl = Literal["auto", "grouped_sdpa", "flash_attn", "torch_varlen"]
IMPLS: tuple[str, ...] = ("auto", "grouped_sdpa", "flash_attn", "torch_varlen")


@dataclass(frozen=True)
class BucketCost:
    """Cost model used to cut sorted documents into SDPA buckets; only the ratios matter.

    A bucket of ``n`` documents padded to ``m`` tokens costs ``call + n * m * (token + pair * m) * w``
    with ``w = heads * head_dim / 768``. Fitted on 2 CPU cores (torch 2.13, fwd+bwd, 12 x 64 fp32).
    """

    call: float = 2e-4
    """Fixed cost of one bucket (an SDPA call, its gathers and launches)."""
    token: float = 3.3e-6
    """Cost per padded token (projections of the gathered rows, softmax bookkeeping)."""
    pair: float = 7.4e-8
    """Cost per padded (query, key) pair."""


CPU_COST = BucketCost()
# Not measured (no GPU here): launches dominate on a GPU, so buckets are fewer and wider.
CUDA_COST = BucketCost(call=5e-5, token=2e-9, pair=2e-11)


def bucket_documents(lengths: np.ndarray, cost: BucketCost = CPU_COST, width: int = 768) -> list[np.ndarray]:
    """Cut documents into buckets of similar length; returns each bucket's document indices, sorted by
    length (longest last). Optimal for ``cost`` among cuts of the length-sorted list: O(k^2) in the
    number ``k`` of distinct lengths, vectorised over the cut position."""
    scale = width / 768.0
    return optimal_length_partition(lengths, lambda n, m: cost.call + n * m * (cost.token + cost.pair * m) * scale)


@dataclass(frozen=True)
class VarlenLayout:
    """Validated document boundaries of a packed batch, shared by every layer of one forward."""

    cu_seqlens: torch.Tensor
    """``[N + 1]`` int32 offsets on the device of the inputs."""
    lengths: np.ndarray
    """``[N]`` document lengths on the host."""
    max_seqlen: int
    """Longest document."""


@dataclass(frozen=True)
class _GroupPlan:
    buckets: tuple[tuple[int, int], ...]
    """(documents, padded length) per bucket, in slot order."""
    gather: torch.Tensor | None
    """``[P]`` source token of every padded slot; None when the tokens already form equal rows."""
    scatter: torch.Tensor | None
    """``[T]`` slot holding every token."""
    key_lengths: tuple[torch.Tensor | None, ...]
    """Per bucket, ``[n]`` true lengths when some document is padded (to mask padded keys when
    attention is not causal), else None."""


class _LastValue:
    """One-entry cache keyed on a tensor's identity and version: every layer of a forward passes the
    same boundary tensor, so boundaries are validated and buckets planned once per forward."""

    def __init__(self) -> None:
        self._key: tuple[weakref.ref, int, object] | None = None
        self._value: object = None

    def get(self, tensor: torch.Tensor, extra: object, make: Callable[[], object]) -> object:
        key = self._key
        if key is not None and key[0]() is tensor and key[1] == tensor._version and key[2] == extra:
            return self._value
        value = make()
        self._key, self._value = (weakref.ref(tensor), tensor._version, extra), value
        return value


_LAYOUTS = _LastValue()
_PLANS = _LastValue()


def layout_from_cu_seqlens(cu_seqlens: torch.Tensor, total: int, max_seqlen: int | None, device) -> VarlenLayout:
    """Check ``cu_seqlens`` against ``total`` tokens (at most one host sync, none for a tensor with a
    remembered host copy: :mod:`padless.attention.host`; cached per tensor)."""

    def make() -> VarlenLayout:
        if cu_seqlens.ndim != 1 or cu_seqlens.numel() < 2:
            raise ValueError(f"cu_seqlens must be 1-D with at least 2 entries, got shape {tuple(cu_seqlens.shape)}")
        if cu_seqlens.dtype.is_floating_point:
            raise ValueError(f"cu_seqlens must hold integers, got {cu_seqlens.dtype}")
        (cu,) = host_values([cu_seqlens])
        return layout_from_host(cu, total, max_seqlen, device, on_device=cu_seqlens)

    return _LAYOUTS.get(cu_seqlens, (total, None if max_seqlen is None else int(max_seqlen), str(device)), make)


def layout_from_host(cu: np.ndarray, total: int, max_seqlen: int | None, device, on_device=None) -> VarlenLayout:
    """A :class:`VarlenLayout` from host offsets ``cu`` ``[N + 1]`` checked against ``total`` tokens;
    ``on_device``: the same offsets already on a device (else copied there without blocking)."""
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {int(cu[0])}")
    if cu[-1] != total:
        raise ValueError(f"cu_seqlens ends at {int(cu[-1])} but the inputs hold {total} tokens")
    lengths = np.diff(cu)
    if lengths.min() < 1:
        i = int(np.argmin(lengths))
        raise ValueError(f"cu_seqlens gives document {i} length {int(lengths[i])}; every document needs a token")
    longest = int(lengths.max())
    if max_seqlen is not None and int(max_seqlen) < longest:
        raise ValueError(f"max_seqlen={int(max_seqlen)} is below the longest document ({longest} tokens)")
    if on_device is None or on_device.device.type != torch.device(device).type:
        on_device = to_device(cu.astype(np.int32), device)
    return VarlenLayout(on_device.to(device=device, dtype=torch.int32), lengths, longest)


def _group_plan(layout: VarlenLayout, cost: BucketCost, width: int, device) -> _GroupPlan:

    lengths = layout.lengths
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    if np.all(lengths == lengths[0]):
        # Equal documents already form rows of the flat axis: view them, no gather (the unpacked case).
        return _GroupPlan(((lengths.size, int(lengths[0])),), None, None, (None,))
    buckets, gathers, key_lengths = [], [], []
    scatter = np.empty(int(lengths.sum()), dtype=np.int64)
    slot = 0
    for docs in bucket_documents(lengths, cost, width):
        lens = lengths[docs]
        m = int(lens.max())
        steps = np.arange(m)
        # Padded slots repeat the document's last token: causal attention never shows them to a real
        # query, and their outputs are dropped, so any finite values would do.
        gathers.append((starts[docs][:, None] + np.minimum(steps[None, :], lens[:, None] - 1)).ravel())
        rows = slot + np.arange(docs.size) * m
        tokens = np.repeat(starts[docs], lens) + _ranges(lens)
        scatter[tokens] = np.repeat(rows, lens) + _ranges(lens)
        buckets.append((int(docs.size), m))
        key_lengths.append(to_device(lens, device) if lens.min() < m else None)
        slot += docs.size * m
    gather = to_device(np.concatenate(gathers), device)
    return _GroupPlan(tuple(buckets), gather, to_device(scatter, device), tuple(key_lengths))


def _ranges(lengths: np.ndarray) -> np.ndarray:
    """``[sum(lengths)]`` concatenated ``arange(l)`` for each length."""
    ends = np.cumsum(lengths)
    return np.arange(int(ends[-1]) if lengths.size else 0) - np.repeat(ends - lengths, lengths)


def _sdpa_supports_gqa() -> bool:
    return torch.__version__ >= (2, 5)


def sdpa_shares_kv_heads(device_type: str, dtype: torch.dtype, masked: bool, head_dim: int) -> bool:
    """Whether a grouped-query SDPA call should pass ``enable_gqa=True`` (the kernel shares each K/V
    head among its query heads) rather than K/V expanded to the query heads (``repeat_interleave``).

    On CUDA only torch's flash kernel takes grouped K/V, and it takes no mask, no fp32 and heads of at
    most 256: a masked call (a sliding window, a non-causal bucket's key padding) or fp32 inputs with
    ``enable_gqa=True`` fall to the math kernel, which holds ``L x L`` scores per head. There K/V are
    expanded, so the memory-efficient kernel runs instead (what transformers' ``use_gqa_in_sdpa``
    decides for its own SDPA path). On other devices (the CPU) ``enable_gqa`` is kept."""
    if not _sdpa_supports_gqa():
        return False
    if device_type != "cuda":
        return True
    return not masked and is_half_precision(dtype) and head_dim <= 256


def _grouped_sdpa(q, k, v, layout: VarlenLayout, *, scale, causal, dropout_p, sliding_window, softcap):
    if softcap is not None:
        raise ValueError(
            "logit soft-capping is not supported by the grouped_sdpa kernel (SDPA has no soft-cap); "
            "use impl='flash_attn' on CUDA with fp16/bf16, or attn_implementation='eager' with a 4D mask"
        )
    if sliding_window is not None and not causal:
        raise ValueError("sliding_window with causal=False is not supported by grouped_sdpa")
    _, hq, d = q.shape
    hk = k.shape[1]
    cost = CUDA_COST if q.device.type == "cuda" else CPU_COST
    plan = _PLANS.get(layout.cu_seqlens, (cost, hq * d), lambda: _group_plan(layout, cost, hq * d, q.device))
    assert isinstance(plan, _GroupPlan)
    if plan.gather is not None:
        q, k, v = (x.index_select(0, plan.gather) for x in (q, k, v))  # [P, H, D] padded slots
    # torch.split, not slicing: a slice's backward writes a zero tensor of the full size per bucket.
    sizes = [n * m for n, m in plan.buckets]
    q_parts, k_parts, v_parts = (x.split(sizes) for x in (q, k, v))
    outs = []
    for (n, m), key_len, *parts in zip(plan.buckets, plan.key_lengths, q_parts, k_parts, v_parts):
        size = n * m
        qb, kb, vb = (x.reshape(n, m, x.shape[1], d).transpose(1, 2) for x in parts)  # [n, H, m, D]
        mask = None
        if not causal and key_len is not None:
            steps = torch.arange(m, device=q.device)
            mask = (steps[None, :] < key_len[:, None])[:, None, None, :]  # [n, 1, 1, m] real keys
        elif causal and sliding_window is not None and sliding_window < m:
            steps = torch.arange(m, device=q.device)
            gap = steps[:, None] - steps[None, :]
            mask = (gap >= 0) & (gap < sliding_window)  # [m, m] causal band
        gqa: dict = {}
        if hq != hk:
            if sdpa_shares_kv_heads(q.device.type, q.dtype, mask is not None, d):
                gqa = {"enable_gqa": True}
            else:
                kb, vb = kb.repeat_interleave(hq // hk, dim=1), vb.repeat_interleave(hq // hk, dim=1)  # [n, Hq, m, D]
        out = F.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=mask, dropout_p=dropout_p, is_causal=causal and mask is None, scale=scale, **gqa
        )  # [n, H, m, D]
        outs.append(out.transpose(1, 2).reshape(size, hq, d))
    out = outs[0] if len(outs) == 1 else torch.cat(outs)  # [P, H, D]
    return out if plan.scatter is None else out.index_select(0, plan.scatter)  # [T, H, D]


def _require_kernel(q, name: str) -> None:
    reason = kernel_refusal(name, q.device, q.dtype, q.shape[-1])
    if reason is not None:
        raise ValueError(f"impl={name!r} cannot run here: {reason}; use impl='grouped_sdpa'")


def _require_cuda_half(q, name: str) -> None:

    if q.device.type != "cuda":
        raise ValueError(f"impl={name!r} needs CUDA tensors, got device {q.device}; use impl='grouped_sdpa'")
    if not is_half_precision(q.dtype):
        raise ValueError(f"impl={name!r} needs fp16 or bf16, got {q.dtype}; use impl='grouped_sdpa'")


flash_attn_available = flash_attn_installed
"""Whether flash-attn imports and exposes ``flash_attn_varlen_func`` (:func:`padless.attention.kernels.flash_attn_installed`)."""


def torch_varlen_available(device=None) -> bool:
    """Whether torch ships ``torch.nn.attention.varlen.varlen_attn`` and ``device`` (default: the current
    CUDA device) is a GPU its flash kernel runs on (sm80+; :data:`padless.attention.kernels.LIMITS`)."""
    if not torch.cuda.is_available():
        return False
    return kernel_refusal("torch_varlen", "cuda" if device is None else device, torch.bfloat16) is None


def _flash_attn(q, k, v, layout: VarlenLayout, *, scale, causal, dropout_p, sliding_window, softcap):
    _require_cuda_half(q, "flash_attn")
    _require_kernel(q, "flash_attn")
    if softcap is not None and dropout_p:
        # flash-attn itself raises "Softcapping does not support dropout for now" (a RuntimeError)
        raise ValueError(
            "impl='flash_attn' has no attention dropout together with logit soft-capping; set dropout_p=0 "
            "(attention_dropout=0) or use attn_implementation='eager' with a 4D mask"
        )
    from flash_attn import flash_attn_varlen_func

    extra: dict = {}
    if sliding_window is not None:
        extra["window_size"] = (sliding_window - 1, 0 if causal else sliding_window - 1)
    if softcap is not None:
        extra["softcap"] = float(softcap)
    cu = layout.cu_seqlens
    m = layout.max_seqlen
    return flash_attn_varlen_func(
        q, k, v, cu, cu, m, m, dropout_p=dropout_p, softmax_scale=scale, causal=causal, **extra
    )  # [T, H, D]


def _torch_varlen(q, k, v, layout: VarlenLayout, *, scale, causal, dropout_p, sliding_window, softcap):
    _require_cuda_half(q, "torch_varlen")
    if dropout_p:
        raise ValueError("impl='torch_varlen' has no attention dropout; use impl='flash_attn' or 'grouped_sdpa'")
    if softcap is not None:
        raise ValueError("impl='torch_varlen' has no logit soft-capping; use impl='flash_attn'")
    _require_kernel(q, "torch_varlen")
    from torch.nn.attention.varlen import varlen_attn

    # flash convention: (left, right) keys visible around each query; -1 = unbounded.
    left = -1 if sliding_window is None else sliding_window - 1
    window = (left, 0) if causal else (left, left)
    cu = layout.cu_seqlens
    m = layout.max_seqlen
    return varlen_attn(q, k, v, cu, cu, m, m, scale=scale, window_size=window, enable_gqa=q.shape[1] != k.shape[1])


KERNELS: dict[str, Callable[..., torch.Tensor]] = {
    "grouped_sdpa": _grouped_sdpa,
    "flash_attn": _flash_attn,
    "torch_varlen": _torch_varlen,
}
"""Kernel name (``impl``) -> function ``(q, k, v, layout, *, scale, causal, dropout_p, sliding_window, softcap)``."""


def choose_impl(q: torch.Tensor, *, dropout_p: float = 0.0, softcap: float | None = None) -> str:
    """The fastest kernel that runs this call exactly (what ``impl='auto'`` uses): a fused kernel only
    where its limits allow (CUDA capability, dtype, head size: :func:`padless.attention.kernels.kernel_refusal`),
    else the grouped SDPA path."""
    if q.device.type == "cuda" and is_half_precision(q.dtype):
        head_dim = q.shape[-1]
        if kernel_refusal("flash_attn", q.device, q.dtype, head_dim) is None:
            return "flash_attn"
        if not dropout_p and softcap is None and kernel_refusal("torch_varlen", q.device, q.dtype, head_dim) is None:
            return "torch_varlen"
    return "grouped_sdpa"


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor | VarlenLayout,
    max_seqlen: int | None = None,
    *,
    scale: float | None = None,
    causal: bool = True,
    dropout_p: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    impl: VarlenImpl = "auto",
) -> torch.Tensor:
    """Attention inside each document of a packed batch; differentiable in q, k and v.

    ``q`` is ``[T, Hq, D]``, ``k`` and ``v`` are ``[T, Hk, D]`` with ``Hq % Hk == 0`` (GQA/MQA),
    ``cu_seqlens`` is ``[N + 1]`` (see the module docstring) or a :class:`VarlenLayout` checked
    beforehand (:func:`layout_from_host`: how the padless backend skips a device sync), ``max_seqlen`` the longest document
    (computed when None). Returns ``[T, Hq, D]`` in q's dtype. ``scale`` defaults to ``D ** -0.5``;
    ``dropout_p`` drops attention probabilities (exact in distribution, not the dense path's random
    stream); ``sliding_window = w`` lets a query see the ``w`` most recent keys of its document
    (itself included, transformers' convention); ``softcap`` applies ``c * tanh(s / c)`` to the scores
    (flash_attn only). Raises ``ValueError`` for anything the chosen kernel cannot do exactly.
    """
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; choose one of {', '.join(IMPLS)}")
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"q, k, v must be [T, H, D], got shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(
            f"k and v must be [T, Hk, D] matching q {tuple(q.shape)}, got {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}")
    if isinstance(cu_seqlens, VarlenLayout):
        layout = cu_seqlens
        if int(layout.lengths.sum()) != q.shape[0]:
            raise ValueError(f"the layout covers {int(layout.lengths.sum())} tokens but the inputs hold {q.shape[0]}")
    else:
        layout = layout_from_cu_seqlens(cu_seqlens, q.shape[0], max_seqlen, q.device)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    name = choose_impl(q, dropout_p=dropout_p, softcap=softcap) if impl == "auto" else impl
    return KERNELS[name](
        q, k, v, layout, scale=scale, causal=causal, dropout_p=dropout_p, sliding_window=sliding_window, softcap=softcap
    )


def reference_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = True,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """The slow oracle: dense ``[T, T]`` document mask, scores and softmax in float32 (float64 if the
    inputs are), same shapes and conventions as :func:`varlen_attention` (no dropout)."""
    t, hq, d = q.shape
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    kk = k.to(work).repeat_interleave(hq // k.shape[1], dim=1)
    vv = v.to(work).repeat_interleave(hq // v.shape[1], dim=1)
    lengths = torch.diff(cu_seqlens.to(device=q.device, dtype=torch.long))
    doc = torch.repeat_interleave(torch.arange(lengths.numel(), device=q.device), lengths)  # [T]
    idx = torch.arange(t, device=q.device)
    allowed = doc[:, None] == doc[None, :]  # [T, T] query rows, key columns
    if causal:
        allowed &= idx[None, :] <= idx[:, None]
    if sliding_window is not None:
        allowed &= (idx[:, None] - idx[None, :]).abs() < sliding_window
    scores = torch.einsum("qhd,khd->hqk", q.to(work), kk) * (d**-0.5 if scale is None else scale)  # [H, T, T]
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, vv).to(q.dtype)  # [T, H, D]
