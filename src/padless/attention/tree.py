"""Shared-prefix (tree) attention: one prompt, several completions that attend to it and not to each other.

A row is cut into *segments*; each segment has a parent segment earlier in the same row (or none,
``-1``). A token attends causally to its own segment and to every ancestor segment. A prompt ``p p p``
with two completions ``a a`` and ``b`` (segments ``[3, 2, 1]``, parents ``[-1, 0, 0]``)::

        k: p p p a a b
    q p    1 . . . . .
    q p    1 1 . . . .
    q p    1 1 1 . . .
    q a    1 1 1 1 . .
    q a    1 1 1 1 1 .
    q b    1 1 1 . . 1     b sees the prompt, never the sibling completion a

Positions continue from the ancestors: a segment starts at ``its parent's start + the parent's
length`` (``p 0 1 2 | a 3 4 | b 3``), so RoPE and learned positions see exactly what each
``prompt + completion`` sequence alone would see. Plain packing is the tree with every parent ``-1``.

Three implementations, each held to the dense boolean reference :func:`tree_causal_mask`:

- :func:`additive_tree_mask`: the ``[B, 1, L, L]`` float mask for sdpa/eager in transformers;
- :func:`tree_attention`: padless attention over the flat ``[T, H, D]`` axis. Every segment becomes a
  virtual document ``ancestors ++ segment`` whose keys are gathered (prompt K/V copied in front of each
  completion; gradients of the copies sum back), queries are the segment's own tokens; documents are
  bucketed by length (:func:`padless.attention.varlen.bucket_documents`) and each bucket is one SDPA
  call with a bottom-right causal mask. Work follows ``sum(n_s * (A_s + n_s))``, not ``L^2``.
- :func:`reference_tree_attention`: the slow dense oracle for it.

A batch carries the tree to padless attention as two kwargs (see :data:`TREE_KWARGS`):
``tree_cu_seqlens`` ``[S + 1]`` (segment offsets over the flat ``B * L`` tokens) and ``tree_parents``
``[S]`` (global segment index of the parent, ``-1`` for none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from padless.attention.host import host_values, remember_host_copy, to_device
from padless.attention.varlen import CPU_COST, CUDA_COST, _LastValue, bucket_documents, sdpa_shares_kv_heads

TREE_KWARGS = ("tree_cu_seqlens", "tree_parents")
"""Batch keys that carry a shared-prefix tree to padless attention."""


SHARED_PROMPT_BACKENDS: tuple[str, ...] = ("padless", "sdpa", "eager")
"""Attention backends that can express the shared-prompt tree exactly."""


def shared_prompt_refusal(backend: str) -> str | None:
    """Why ``backend`` cannot run the shared-prompt layout exactly (None: it can): this layout's part of
    the exact-or-refused rule, asked together with the backend's plain-packing refusal
    (:func:`padless.attention.select.resolve_backend`)."""
    if backend in SHARED_PROMPT_BACKENDS:
        return None
    if backend == "flash_attention_2":
        return (
            "flash_attention_2 in transformers takes one contiguous span per document (cu_seq_lens), so two "
            "completions cannot share a prompt that sits before both; use 'padless', 'sdpa' or 'eager'"
        )
    if backend == "flex_attention":
        return "flex_attention in transformers builds its own document mask from position_ids; use 'padless', 'sdpa' or 'eager'"
    return f"backend {backend!r} has no way to receive a shared-prompt (tree) mask; use 'padless', 'sdpa' or 'eager'"


def _check_tree(lengths: np.ndarray, parents: np.ndarray) -> None:
    if lengths.ndim != 1 or parents.shape != lengths.shape:
        raise ValueError(f"segment lengths {lengths.shape} and parents {parents.shape} must be 1-D of equal size")
    if lengths.size and lengths.min() < 1:
        raise ValueError(f"segment {int(np.argmin(lengths))} is empty; every segment needs a token")
    own = np.arange(parents.size)
    bad = np.flatnonzero((parents < -1) | (parents >= own))
    if bad.size:
        s = int(bad[0])
        raise ValueError(f"segment {s} has parent {int(parents[s])}; a parent must be -1 or an earlier segment")


def ancestors(parents: np.ndarray) -> list[list[int]]:
    """Per segment, its ancestors root first (parents must precede their children)."""
    chains: list[list[int]] = []
    for p in parents.tolist():
        chains.append([] if p < 0 else [*chains[p], p])
    return chains


def tree_positions(lengths: Sequence[int] | np.ndarray, parents: Sequence[int] | np.ndarray) -> np.ndarray:
    """``[sum(lengths)]`` position ids: each segment continues from its parent's last position."""
    lengths, parents = np.asarray(lengths, dtype=np.int64), np.asarray(parents, dtype=np.int64)
    _check_tree(lengths, parents)
    first = np.zeros(lengths.size, dtype=np.int64)
    for s, p in enumerate(parents.tolist()):
        if p >= 0:
            first[s] = first[p] + lengths[p]
    starts = np.repeat(np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return np.arange(int(lengths.sum()), dtype=np.int64) - starts + np.repeat(first, lengths)


def tree_causal_mask(lengths: Sequence[int] | np.ndarray, parents: Sequence[int] | np.ndarray) -> np.ndarray:
    """Dense boolean ``[T, T]`` mask (query rows, key columns): token i may attend to token j iff
    ``j <= i`` and j's segment is i's segment or one of its ancestors. The reference."""
    lengths, parents = np.asarray(lengths, dtype=np.int64), np.asarray(parents, dtype=np.int64)
    _check_tree(lengths, parents)
    seen = np.eye(lengths.size, dtype=bool)  # seen[s, a]: segment s may attend to segment a
    for s, chain in enumerate(ancestors(parents)):
        seen[s, chain] = True
    seg = np.repeat(np.arange(lengths.size), lengths)
    return seen[seg[:, None], seg[None, :]] & np.tril(np.ones((seg.size, seg.size), dtype=bool))


def additive_tree_mask(
    rows: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``[B, 1, L, L]`` float mask for rows given as ``(segment lengths, row-local parents)``; every row
    sums to the same ``L``. 0 where attention is allowed, ``finfo(dtype).min`` elsewhere (the model's
    dtype: sdpa adds it to the scores; eager ignores a bool mask)."""
    dtype = dtype or torch.float32
    if not rows:
        raise ValueError("additive_tree_mask needs at least one row")
    totals = {int(np.sum(lengths)) for lengths, _ in rows}
    if len(totals) != 1:
        raise ValueError(f"every row must hold the same number of tokens, got totals {sorted(totals)}")
    allowed = torch.from_numpy(np.stack([tree_causal_mask(lengths, parents) for lengths, parents in rows]))
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed.to(device), torch.finfo(dtype).min)
    return mask[:, None]  # [B, 1, L, L]: broadcast over heads


# ----------------------------------------------------------------------------- padless attention


@dataclass(frozen=True)
class TreePlan:
    """Buckets of virtual documents (ancestors ++ segment) for one forward, built once on the host."""

    buckets: tuple[tuple[int, int, int], ...]
    """(documents, padded query length, padded key length) per bucket, in slot order."""
    q_gather: torch.Tensor
    """``[Pq]`` source token of every padded query slot."""
    k_gather: torch.Tensor
    """``[Pk]`` source token of every padded key slot (ancestors first, then the segment)."""
    prefix: tuple[torch.Tensor | None, ...]
    """Per bucket, ``[n]`` ancestor tokens of each document (None when all are 0: plain causal)."""
    scatter: torch.Tensor
    """``[T]`` query slot of every token."""
    first_position: np.ndarray
    """``[S]`` position id each segment must start at (checked against ``position_ids``)."""


def plan_tree(cu: np.ndarray, parents: np.ndarray, device: Any, width: int = 768) -> TreePlan:
    """Validate a flat tree (``cu`` ``[S + 1]`` offsets, ``parents`` ``[S]``) and bucket its virtual documents."""
    if cu.ndim != 1 or cu.size < 2 or cu[0] != 0:
        raise ValueError(f"tree_cu_seqlens must be 1-D offsets starting at 0, got {cu.tolist()[:8]}")
    lengths = np.diff(cu)
    _check_tree(lengths, parents)
    chains = ancestors(parents)
    prefix = np.array([int(lengths[c].sum()) for c in chains], dtype=np.int64)  # A_s
    first = np.zeros(lengths.size, dtype=np.int64)
    for s, p in enumerate(parents.tolist()):
        if p >= 0:
            first[s] = first[p] + lengths[p]
    total_keys = prefix + lengths
    cost = CUDA_COST if torch.device(device).type == "cuda" else CPU_COST
    buckets, q_gather, k_gather, prefixes = [], [], [], []
    scatter = np.empty(int(cu[-1]), dtype=np.int64)
    slot = 0
    # Roots (prompts, plain documents) and children (completions) are bucketed apart: a bucket pads its
    # queries to its longest segment, and a short completion must not be padded to a long prompt.
    roots = np.flatnonzero(parents < 0)
    children = np.flatnonzero(parents >= 0)
    groups = [*(roots[b] for b in bucket_documents(total_keys[roots], cost, width)),
              *(children[b] for b in bucket_documents(total_keys[children], cost, width))]  # fmt: skip
    for docs in groups:
        mq, mk = int(lengths[docs].max()), int(total_keys[docs].max())
        for i, s in enumerate(docs.tolist()):
            own = np.arange(cu[s], cu[s + 1])
            keys = np.concatenate([*(np.arange(cu[a], cu[a + 1]) for a in chains[s]), own])
            # Padded slots repeat the last token: a real query never sees a padded key (its keys end at
            # A_s + its index), and padded queries' outputs are dropped.
            q_gather.append(np.concatenate([own, np.full(mq - own.size, own[-1])]))
            k_gather.append(np.concatenate([keys, np.full(mk - keys.size, keys[-1])]))
            scatter[own] = slot + i * mq + np.arange(own.size)
        buckets.append((int(docs.size), mq, mk))
        a = prefix[docs]
        plain = not a.any() and mq == mk
        prefixes.append(None if plain else to_device(a, device))
        slot += docs.size * mq
    to = lambda x: to_device(np.concatenate(x), device)  # noqa: E731
    return TreePlan(tuple(buckets), to(q_gather), to(k_gather), tuple(prefixes), to_device(scatter, device), first)


_TREE_PLANS = _LastValue()
_TREE_CHECKED = _LastValue()


def tree_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tree_cu_seqlens: torch.Tensor,
    tree_parents: torch.Tensor,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal attention over a shared-prefix tree on the flat axis; differentiable in q, k, v.

    ``q`` ``[T, Hq, D]``, ``k``/``v`` ``[T, Hk, D]`` (``Hq % Hk == 0``), ``tree_cu_seqlens`` ``[S + 1]``,
    ``tree_parents`` ``[S]`` (see the module docstring). ``sliding_window = w``: a query sees the ``w``
    most recent positions of its virtual document (itself included). Returns ``[T, Hq, D]``.
    """
    if q.ndim != 3 or k.shape != v.shape or k.shape[0] != q.shape[0] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} must be [T, H, D] with Hq % Hk == 0"
        )
    t, hq, d = q.shape
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}")

    def make() -> TreePlan:
        cu, parents = host_values([tree_cu_seqlens, tree_parents])  # read once by the row check: no second sync
        if cu.size and cu[-1] != t:
            raise ValueError(f"tree_cu_seqlens ends at {int(cu[-1])} but the inputs hold {t} tokens")
        return plan_tree(cu, parents, q.device, hq * d)

    plan = _TREE_PLANS.get(tree_cu_seqlens, (id(tree_parents), tree_parents._version, hq * d, str(q.device)), make)
    assert isinstance(plan, TreePlan)
    qs = q.index_select(0, plan.q_gather).split([n * mq for n, mq, _ in plan.buckets])
    ks, vs = (x.index_select(0, plan.k_gather).split([n * mk for n, _, mk in plan.buckets]) for x in (k, v))
    outs = []
    for (n, mq, mk), prefix, qb, kb, vb in zip(plan.buckets, plan.prefix, qs, ks, vs):
        qb = qb.reshape(n, mq, hq, d).transpose(1, 2)  # [n, Hq, mq, D]
        kb, vb = (x.reshape(n, mk, x.shape[1], d).transpose(1, 2) for x in (kb, vb))  # [n, Hk, mk, D]
        mask = None
        if prefix is not None or sliding_window is not None:
            a = prefix if prefix is not None else torch.zeros(n, dtype=torch.long, device=q.device)
            gap = (
                a[:, None, None]
                + torch.arange(mq, device=q.device)[None, :, None]
                - torch.arange(mk, device=q.device)[None, None, :]
            )  # [n, mq, mk] query pos - key pos  #
            mask = gap >= 0
            if sliding_window is not None:
                mask &= gap < sliding_window
            mask = mask[:, None]  # [n, 1, mq, mk]
        gqa: dict = {}
        if hq != kb.shape[1]:  # grouped K/V with a mask on CUDA: expanded, or SDPA falls to its math kernel
            if sdpa_shares_kv_heads(q.device.type, q.dtype, mask is not None, d):
                gqa = {"enable_gqa": True}
            else:
                kb, vb = kb.repeat_interleave(hq // kb.shape[1], dim=1), vb.repeat_interleave(hq // vb.shape[1], dim=1)
        out = F.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None, scale=scale, **gqa
        )  # [n, Hq, mq, D]
        outs.append(out.transpose(1, 2).reshape(n * mq, hq, d))
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out.index_select(0, plan.scatter)  # [T, Hq, D]


def reference_tree_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tree_cu_seqlens: torch.Tensor,
    tree_parents: torch.Tensor,
    *,
    scale: float | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """The slow oracle: the dense :func:`tree_causal_mask` over all ``T`` tokens, float32 scores."""
    t, hq, d = q.shape
    cu = tree_cu_seqlens.cpu().numpy().astype(np.int64)
    parents = tree_parents.cpu().numpy().astype(np.int64)
    allowed = torch.from_numpy(tree_causal_mask(np.diff(cu), parents)).to(q.device)
    if sliding_window is not None:
        pos = torch.from_numpy(tree_positions(np.diff(cu), parents)).to(q.device)
        allowed &= (pos[:, None] - pos[None, :]) < sliding_window
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    kk = k.to(work).repeat_interleave(hq // k.shape[1], dim=1)
    vv = v.to(work).repeat_interleave(hq // v.shape[1], dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.to(work), kk) * (d**-0.5 if scale is None else scale)
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, vv).to(q.dtype)


def padless_tree_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None, dropout: float, kwargs: dict
) -> torch.Tensor:
    """The shared-prefix branch of :func:`padless.attention.backend.padless_attention`: ``query``
    ``[B, Hq, L, D]`` -> ``[B, L, Hq, D]``. Checks once per forward that the tree stays inside rows and
    that ``position_ids`` continue from each segment's ancestors, so a batch whose positions and tree
    disagree is refused instead of computed."""

    batch, heads, length, dim = query.shape
    cu, parents = kwargs.get("tree_cu_seqlens"), kwargs.get("tree_parents")
    if parents is None:
        raise ValueError("padless attention got tree_cu_seqlens without tree_parents; send both")
    if kwargs.get("cu_seq_lens_q") is not None:
        raise ValueError("a batch carries either a shared-prefix tree or cu_seq_lens_q/k, not both")
    if kwargs.get("softcap") is not None:
        raise ValueError("padless shared-prefix attention has no logit soft-capping; use attn_implementation='eager'")
    pos = kwargs.get("position_ids")
    _TREE_CHECKED.get(cu, (id(parents), id(pos), batch, length), lambda: _check_rows(cu, parents, pos, batch, length))
    q = query.transpose(1, 2).reshape(batch * length, heads, dim)  # [T, Hq, D]
    k = key.transpose(1, 2).reshape(batch * length, key.shape[1], dim)
    v = value.transpose(1, 2).reshape(batch * length, value.shape[1], dim)
    out = tree_attention(
        q, k, v, cu, parents, scale=scaling, dropout_p=dropout, sliding_window=kwargs.get("sliding_window")
    )
    return out.reshape(batch, length, heads, dim)


def _check_rows(cu_t: torch.Tensor, parents_t: torch.Tensor, pos: torch.Tensor | None, batch: int, length: int) -> None:
    # one transfer for the three; the tree's host values are remembered for tree_attention's plan
    cu, parents, *got = host_values([cu_t, parents_t, *([] if pos is None else [pos])])
    remember_host_copy(cu_t, cu)
    remember_host_copy(parents_t, parents)
    if cu.ndim != 1 or cu.size < 2 or cu[0] != 0 or cu[-1] != batch * length or np.any(np.diff(cu) < 1):
        raise ValueError(f"tree_cu_seqlens must rise strictly from 0 to the batch's {batch * length} tokens")
    _check_tree(np.diff(cu), parents)
    row = cu[:-1] // length
    if np.any((cu[1:] - 1) // length != row):
        raise ValueError("a tree segment crosses a row boundary; every segment must lie inside one row")
    child = np.flatnonzero(parents >= 0)
    if np.any(row[parents[child]] != row[child]):
        raise ValueError("a tree segment's parent lies in another row")
    if pos is None:
        raise ValueError("a shared-prefix batch needs position_ids (each completion continues from its prompt)")
    want = tree_positions(np.diff(cu), parents)
    got = np.broadcast_to(got[0], (batch, length)).reshape(-1)
    if not np.array_equal(got, want):
        bad = int(np.flatnonzero(got != want)[0])
        raise ValueError(
            f"position_ids disagree with the shared-prefix tree at flat token {bad} "
            f"({int(got[bad])}, expected {int(want[bad])}); the batch was not built for this tree"
        )
