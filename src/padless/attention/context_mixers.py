"""Token-mixing layers that are not attention, run head-parallel inside a context-parallel forward.

Gated DeltaNet, Mamba2 mixers and short convolutions carry a state along the row, so a rank holding
``L / cp`` tokens cannot run them on its shard. Inside a :func:`padless.attention.context_parallel.context_parallel`
forward, a layer patched by :func:`padless.attention.mixers.enable_per_document_mixers` whose kind has
document-aware scans (:data:`padless.attention.mixers._SCAN_FUNCTIONS`) runs its OWN forward on the
local tokens (projections, norms and gates act per token), while the functions it calls for its
sequence mixing are swapped, for that forward only, for head-parallel ones (Ulysses style)::

    [R, L/cp, H, d]  --all-to-all-->  [R, L, H/cp, d]  (whole rows, in the row's global order)
                                       scan over the rows' documents (state.document_ids)
    [R, L/cp, H, d]  <--all-to-all--  [R, L, H/cp, d]

The depthwise causal convolution splits its channels the same way, each rank convolving its
``D / cp`` channels with its slice of the weight and bias; Mamba2's ``B`` / ``C`` split with the heads
when their groups divide by ``cp``, else they are gathered over the sequence (:func:`gather_rows`) and
each rank keeps its heads' copies. Every exchange is differentiable: the all-to-all's backward is the
reverse all-to-all, and a parameter slice's gradient lands in its slice, so summing parameter
gradients over the cp group (:func:`padless.objectives.context_loss.sync_context_gradients`) gives the
single-process gradient. Documents come from the active context's WHOLE-row ids, never from the
shard's positions (a zigzag shard's positions jump). The one collective is ``all_to_all_single``,
which gloo and nccl both have; the gather is built from it too.

:func:`padless.attention.context_parallel.context_parallel_refusal` refuses by name what this cannot
run: heads or channels that do not divide by ``cp`` (:func:`split_counts`), layers without scans
(Mamba1, Kimi delta attention, ...) and unpatched layers; :func:`head_parallel_forward` raises the
same ``ValueError`` if it meets one. This module imports nothing of padless but the scans, and holds
the running context (:func:`active_context`): the mixers call it, and the context-parallel module
reads the mixers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from padless.attention import scans

_ACTIVE: ContextVar[Any] = ContextVar("padless_context_parallel", default=None)
"""The enclosing :func:`padless.attention.context_parallel.context_parallel`'s
:class:`padless.attention.context_parallel.ContextParallelState` (``None`` outside one); it lives here
because the mixers read it and the context-parallel module imports the mixers."""


def active_context() -> Any:
    """The enclosing :func:`padless.attention.context_parallel.context_parallel` state (``None`` outside one)."""
    return _ACTIVE.get()


def _exchange(x: torch.Tensor, split_dim: int, cat_dim: int, group: Any) -> torch.Tensor:
    """Cut ``x`` into ``cp`` equal parts along ``split_dim``, send part ``j`` to rank ``j``, and join the
    parts received along ``cat_dim`` in rank order."""
    world = dist.get_world_size(group)
    send = torch.stack(x.chunk(world, dim=split_dim)).contiguous()  # [cp, ...]: part j goes to rank j
    got = torch.empty_like(send)
    dist.all_to_all_single(got, send, group=group)
    return torch.cat(got.unbind(0), dim=cat_dim)


class _AllToAll(torch.autograd.Function):
    """:func:`_exchange`, differentiable: the backward is the reverse exchange (split along ``cat_dim``,
    join along ``split_dim``), which returns each gradient part to the rank it came from."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, split_dim: int, cat_dim: int, group: Any) -> torch.Tensor:
        ctx.reverse = (cat_dim, split_dim, group)
        return _exchange(x, split_dim, cat_dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _exchange(grad, *ctx.reverse), None, None, None


def to_heads(x: torch.Tensor, state: Any, seq_dim: int = 1, head_dim: int = 2) -> torch.Tensor:
    """This rank's shard ``[.., L/cp (seq_dim), .., H (head_dim), ..]`` -> this rank's ``H / cp`` heads of
    the whole rows ``[.., L, .., H/cp, ..]``, in the row's global order."""
    return state.in_row_order(_AllToAll.apply(x, head_dim, seq_dim, state.group), seq_dim)


def to_sequence(x: torch.Tensor, state: Any, seq_dim: int = 1, head_dim: int = 2) -> torch.Tensor:
    """The inverse of :func:`to_heads`: ``[.., L, .., H/cp, ..]`` in global order -> ``[.., L/cp, .., H, ..]``."""
    if state.layout != "contiguous":
        x = x.index_select(seq_dim, state.order.to(x.device))  # global order -> gathered (rank) order
    return _AllToAll.apply(x, seq_dim, head_dim, state.group)


def _documents(state: Any, device: torch.device) -> torch.Tensor:
    """``[R, L]`` document index for the scans, distinct across rows (the scans run the rows as one
    sequence, so row ``r``'s last document must not continue into row ``r + 1``'s first)."""
    ids = state.document_ids.to(device)
    return ids + torch.arange(ids.shape[0], device=device)[:, None] * state.length


def gather_rows(x: torch.Tensor, state: Any, seq_dim: int = 1) -> torch.Tensor:
    """This rank's shard ``[.., L/cp (seq_dim), ..]`` -> the whole rows ``[.., L, ..]`` in global order:
    an all-gather built from the all-to-all (the same shard sent to every rank), so its backward sums
    each shard's gradient over the ranks (the expand) and returns it to the owner (the reverse exchange)."""
    cp = dist.get_world_size(state.group)
    copies = x.unsqueeze(0).expand(cp, *x.shape)  # [cp, ...]: copy j goes to rank j
    whole = _AllToAll.apply(copies, 0, seq_dim + 1, state.group)  # [1, .., L, ..]
    return state.in_row_order(whole.squeeze(0), seq_dim)


def _no_state(name: str, given: bool) -> None:
    if given:
        raise ValueError(f"{name} was handed a recurrent state or asked for one in a context-parallel forward")


def _split(what: str, count: int, cp: int) -> None:
    if count % cp:
        raise ValueError(f"context parallel: {what} ({count}) do not divide by the cp group's size {cp}")


def _mine(t: torch.Tensor | None, cp: int, rank: int, dim: int = 0) -> torch.Tensor | None:
    """This rank's ``1 / cp`` slice of a per-head (or per-channel) tensor; its gradient reaches that slice."""
    return None if t is None else t.chunk(cp, dim=dim)[rank]


def _conv(state: Any) -> Any:
    def causal_conv1d_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
        rank, cp = dist.get_rank(state.group), dist.get_world_size(state.group)
        _split("channels of the depthwise convolution", hidden_states.shape[1], cp)
        x = to_heads(hidden_states, state, seq_dim=2, head_dim=1)  # [R, D/cp, L]
        doc = _documents(state, x.device)
        out = scans.causal_conv1d(x, _mine(weight, cp, rank), _mine(bias, cp, rank), activation, doc)
        return to_sequence(out, state, seq_dim=2, head_dim=1)

    return causal_conv1d_fn


def _delta_rule(state: Any) -> Any:
    def torch_chunk_gated_delta_rule(
        query,
        key,
        value,
        g,
        beta,
        chunk_size=64,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        **kwargs,
    ):
        _no_state("the gated delta rule", initial_state is not None or output_final_state)
        cp = dist.get_world_size(state.group)
        heads_k, heads_v = key.shape[2], value.shape[2]
        _split("value heads of the gated delta rule", heads_v, cp)
        if heads_k % cp:  # each rank gets its value heads' own copies of the query/key heads
            query = query.repeat_interleave(heads_v // heads_k, dim=2)
            key = key.repeat_interleave(heads_v // heads_k, dim=2)
        q, k, v, gate, b = (to_heads(t, state) for t in (query, key, value, g, beta))
        doc = _documents(state, v.device)
        out = scans.chunk_gated_delta_rule(q, k, v, gate, b, doc, chunk_size, use_qk_l2norm_in_kernel)
        return to_sequence(out, state), None

    return torch_chunk_gated_delta_rule


def _ssd(state: Any) -> Any:
    def mamba2_chunk_scan(
        hidden_states,
        dt,
        A,
        B,
        C,
        chunk_size,
        D=None,
        dt_bias=None,
        initial_states=None,
        dt_softplus=False,
        dt_limit=(0.0, float("inf")),
        return_final_states=False,
        **kwargs,
    ):
        _no_state("Mamba2's scan", initial_states is not None or return_final_states)
        rank, cp = dist.get_rank(state.group), dist.get_world_size(state.group)
        heads, groups = hidden_states.shape[2], B.shape[2]
        _split("heads of the Mamba2 scan", heads, cp)
        x, step = to_heads(hidden_states, state), to_heads(dt, state)
        if groups % cp == 0:  # a rank's heads read exactly its groups
            b, c = to_heads(B, state), to_heads(C, state)
        else:  # the whole sequence of every group, then each of this rank's heads its group's copy
            bc = gather_rows(torch.stack([B, C]), state, seq_dim=2)  # [2, R, L, G, N]
            bc = _mine(bc.repeat_interleave(heads // groups, dim=3), cp, rank, dim=3)
            b, c = bc.unbind(0)
        doc = _documents(state, x.device)
        a, d, bias = (_mine(t, cp, rank) for t in (A, D, dt_bias))
        out = scans.mamba2_chunk_scan(x, step, a, b, c, chunk_size, doc, d, bias, dt_softplus, dt_limit)
        return to_sequence(out, state)

    return mamba2_chunk_scan


def _unfused(state: Any) -> Any:
    def mamba2_split_conv1d_scan_combined(*args, **kwargs):
        return None  # the fused kernel is not head-parallel: the layer goes on to its convolution and scan

    return mamba2_split_conv1d_scan_combined


_HEAD_PARALLEL = {
    "causal_conv1d_fn": _conv,
    "torch_chunk_gated_delta_rule": _delta_rule,
    "mamba2_chunk_scan": _ssd,
    "mamba2_split_conv1d_scan_combined": _unfused,
}
"""The head-parallel stand-in for each function :data:`padless.attention.mixers._SCAN_FUNCTIONS` names."""


@contextmanager
def _head_parallel_scans(home: ModuleType, names: tuple[str, ...], state: Any) -> Iterator[None]:
    """For one layer's forward, the functions ``names`` of its module ``home`` are the head-parallel ones."""
    saved = {name: getattr(home, name) for name in names}
    for name in names:
        setattr(home, name, _HEAD_PARALLEL[name](state))
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(home, name, function)


def split_counts(module: Any, kind: str) -> dict[str, int]:
    """What of ``module`` (a ``kind`` layer) is split over the cp ranks, by name: value heads, scan
    heads, convolution channels (the attributes transformers' layers keep them in; absent ones omitted)."""
    counts = {}
    heads = getattr(module, "num_v_heads", None) if kind == "gated_deltanet" else getattr(module, "num_heads", None)
    if isinstance(heads, int):
        counts["value heads" if kind == "gated_deltanet" else "heads"] = heads
    conv = next((m for m in module.modules() if isinstance(m, torch.nn.Conv1d) and m.groups == m.in_channels > 1), None)
    if conv is not None:
        counts["convolution channels"] = conv.in_channels
    return counts


def head_parallel_forward(
    run: Callable[[], Any],
    layer: Any,
    kind: str,
    home: ModuleType,
    names: tuple[str, ...],
    hidden: torch.Tensor,
    state: Any,
) -> Any:
    """``run()``: ``layer``'s own forward on this rank's tokens ``hidden`` ``[R, L/cp, D]`` (a ``kind``
    layer of module ``home``), with the functions ``names`` it calls for its scans head-parallel over
    the whole rows of the active context ``state`` (module docstring). ``names`` empty: the layer has no
    scan to run head-parallel, and the model is refused."""
    layer_name = getattr(type(layer), "_padless_base", type(layer)).__name__  # the class before patching
    if not names:
        raise ValueError(
            f"{layer_name} ({kind}) has no document-aware scan to run head-parallel; the model cannot run "
            "context-parallel (padless.attention.context_parallel.check_context_parallel)"
        )
    if tuple(hidden.shape[:2]) != (state.document_ids.shape[0], state.local):
        raise ValueError(
            f"{layer_name} got {tuple(hidden.shape[:2])} tokens but the context holds rows of "
            f"{tuple(state.document_ids.shape)} split into shards of {state.local}"
        )
    cp = dist.get_world_size(state.group)
    for what, count in split_counts(layer, kind).items():
        _split(f"{what} of {layer_name}", count, cp)
    with _head_parallel_scans(home, names, state):
        return run()
