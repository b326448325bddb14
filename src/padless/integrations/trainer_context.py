"""Context parallelism in padless' trainers: ``PackedTrainer(context_parallel=cp)`` and ``SFTTrainer(context_parallel=cp)``.

Under ``torchrun`` with ``W`` processes, ``context_parallel=cp`` makes ``W / cp`` data-parallel
replicas of ``cp`` ranks each (ranks ``[d cp, (d + 1) cp)`` form replica ``d``'s cp group):

1. **Rows.** The packed-row sampler deals the plan to the ``W / cp`` replicas, not to the ``W``
   processes: every rank of a cp group trains the same rows.
2. **Balance.** Each step's rows are reordered by the balance planner before the split
   (:func:`padless.planning.context_balance.balance_row`: documents ordered so that the shards' causal
   attention work evens out; no token added, at most one document cut at each shard boundary), in the
   layout chosen once for the run from the planned rows (``context_layout="auto"``: the one with the
   lowest mean max/mean shard work; or ``"contiguous"``, ``"zigzag"`` or ``"striped"`` as given). All ranks of a group
   compute the same order from the same rows.
3. **Split and forward.** Positions, document ids and shifted targets are computed on the whole row, then
   each rank keeps its shard (:func:`padless.batching.context_shards.split_row`) and runs the model on it
   inside :func:`padless.attention.context_parallel.context_parallel`: every attention layer gathers the
   keys and values of the whole row over the cp group and masks by global indices. The model's attention
   implementation is switched to ``"padless_cp"``, which outside a cp forward is padless' own attention, so
   evaluation, ``generate`` and the plain forward run as before.
4. **Loss.** Each rank's loss is its shard's cross-entropy sum over the step's trained tokens of every
   replica (Trainer's ``num_items_in_batch``, which counts each cp group's rows ``cp`` times, divided by
   ``cp``), times ``W``: DDP and FSDP2 average gradients over all ``W`` ranks, so the average is exactly the
   gradient of one process over every replica's rows (the cp ranks' shares of a row add up through the
   all-gather's backward and the average).

What is refused, by name, before any step: a model context parallelism cannot make exact
(:func:`padless.attention.context_parallel.check_context_parallel`), a world that ``cp`` does not divide,
a batch carrying inputs the split does not cut (images, token types: refused, never dropped), and a step
without a trained-token count (``average_tokens_across_devices=False``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from padless.attention.context_parallel import (
    LAYOUTS,
    check_context_parallel,
    context_parallel,
    keep_context_in_checkpoints,
    register_context_parallel_attention,
)
from padless.batching.context_shards import split_row
from padless.objectives.context_loss import context_parallel_loss
from padless.planning.checks import check_int
from padless.planning.context_balance import balance_row, imbalance, shard_work

CONTEXT_LAYOUTS = ("auto", *LAYOUTS)
"""``context_layout=`` choices: ``"auto"`` (the planner picks from the planned rows) or a layout."""

SPLIT_KEYS = frozenset({"input_ids", "labels", "position_ids"})
"""What a context-parallel step splits over the cp group."""
BOUNDARY_KEYS = frozenset(
    {
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "use_cache",
        "seq_lengths",
        "padless_row_padding",
    }
)
"""What a packed batch carries that the split recomputes from the whole rows (document ids, positions)."""


@dataclass(frozen=True)
class ContextGroups:
    """This process's place in ``dp x cp``."""

    cp: int
    dp: int
    cp_rank: int
    dp_rank: int
    world: int
    group: Any
    """This rank's cp process group."""
    layout: str
    """``context_layout`` as given (``"auto"`` until :func:`choose_layout` resolves it)."""


def context_groups(cp: int, layout: str, args: Any) -> ContextGroups | None:
    """The cp groups of the job (a collective: every rank builds every group, in order), or ``None`` for
    ``cp == 1``. ``args``: the trainer's ``TrainingArguments`` (world size and rank)."""
    check_int(cp, "context_parallel")
    if layout not in CONTEXT_LAYOUTS:
        raise ValueError(f"context_layout must be one of {', '.join(CONTEXT_LAYOUTS)}, got {layout!r}")
    if cp == 1:
        return None
    import torch.distributed as dist

    world, rank = int(args.world_size), int(args.process_index)
    if not (dist.is_available() and dist.is_initialized()) or world % cp:
        raise ValueError(
            f"context_parallel={cp} splits each row over {cp} ranks and needs a process group whose size it "
            f"divides; this run has {world} process(es){'' if dist.is_initialized() else ' and no process group'}: "
            f"launch with `torchrun --nproc-per-node {cp}` (or a multiple of {cp} for data parallel x context parallel)"
        )
    groups = [dist.new_group(list(range(d * cp, (d + 1) * cp))) for d in range(world // cp)]
    return ContextGroups(cp, world // cp, rank % cp, rank // cp, world, groups[rank // cp], layout)


def prepare_model(model: Any, ctx: ContextGroups) -> None:
    """Refuse what cp cannot make exact (by name), then switch the model's attention to ``"padless_cp"``."""
    from padless.attention.adapters import base_model_of

    try:
        check_context_parallel(model, ctx.cp)
    except ValueError as err:
        raise ValueError(f"context_parallel={ctx.cp}: {err}") from None
    implementation = register_context_parallel_attention()
    for target in {id(model): model, id(base_model_of(model)): base_model_of(model)}.values():
        target.set_attn_implementation(implementation)


def row_works(rows: list[list[int]], row_length: int, cp: int, layout: str) -> tuple[float, float]:
    """Mean max/mean shard work of ``rows`` (document lengths per row) as planned and after
    :func:`balance_row` in ``layout``."""
    before, after = [], []
    for lengths in rows:
        if not lengths:
            continue
        before.append(imbalance(shard_work(lengths, row_length, cp, layout=layout)))
        after.append(imbalance(balance_row(lengths, row_length, cp, layout=layout).after))
    return (float(np.mean(before)) if before else 1.0), (float(np.mean(after)) if after else 1.0)


def choose_layout(
    ctx: ContextGroups, rows: list[list[int]], row_length: int, mixers: str = ""
) -> tuple[ContextGroups, str]:
    """``ctx`` with its layout resolved from the planned ``rows`` and what the start line says of it: for
    ``"auto"``, the layout whose balanced rows have the lowest mean max/mean shard work (on a tie the
    earlier of :data:`LAYOUTS`, which cuts fewer pieces)."""
    from dataclasses import replace

    sample = rows[:64]  # the plan's first rows: the figure the start line gives, bounded in cost
    works = {layout: row_works(sample, row_length, ctx.cp, layout) for layout in LAYOUTS}
    layout = ctx.layout
    if layout == "auto":
        layout = min(LAYOUTS, key=lambda name: (round(works[name][1], 4), LAYOUTS.index(name)))
    before = works["contiguous"][0]
    after = works[layout][1]
    chosen = "auto: " if ctx.layout == "auto" else ""
    said = (
        f"context parallel {ctx.dp} x {ctx.cp} ranks (data x context), {layout} shards ({chosen}max/mean shard "
        f"attention work {before:.3f} as planned -> {after:.3f} balanced, mean of {len(sample)} rows), "
        "keys and values gathered over each cp group"
    )
    if mixers:
        said += f", token mixers head-parallel ({mixers}: all-to-all over each cp group)"
    return replace(ctx, layout=layout), said


def _balanced(inputs: dict[str, Any], cp: int, layout: str) -> tuple[torch.Tensor, ...]:
    """``(input_ids, labels, position_ids)`` of the batch with each row's documents reordered by
    :func:`balance_row` (the boundaries read from the positions the collator restarted per document)."""
    from padless.attention.accept import row_documents

    ids, labels, pos = (inputs[k] for k in ("input_ids", "labels", "position_ids"))
    length = int(ids.shape[1])
    order_rows = []
    for lengths in row_documents(inputs):
        balanced = balance_row(lengths, length, cp, layout=layout)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        pieces = [np.arange(starts[i], starts[i] + lengths[i]) for i in balanced.order]
        order_rows.append(np.concatenate([*pieces, np.arange(int(np.sum(lengths)), length)]))
    index = torch.as_tensor(np.stack(order_rows), device=ids.device)
    return tuple(t.gather(1, index) for t in (ids, labels, pos))


def _same_rows(ctx: ContextGroups, input_ids: torch.Tensor) -> None:
    """Raise on every rank of the cp group unless all of them hold the same rows (shape and a checksum,
    one small all-gather): shards of different rows would gather keys that belong to no row."""
    import torch.distributed as dist

    weights = torch.arange(1, input_ids.numel() + 1, dtype=torch.float64, device=input_ids.device)
    mine = torch.tensor(
        [float(input_ids.shape[0]), float(input_ids.shape[1]), float((input_ids.reshape(-1).double() * weights).sum())],
        dtype=torch.float64,
        device=input_ids.device,
    )
    every = [torch.empty_like(mine) for _ in range(ctx.cp)]
    dist.all_gather(every, mine, group=ctx.group)
    if any(not torch.equal(x, every[0]) for x in every):
        raise ValueError(
            f"context_parallel={ctx.cp}: the ranks of a cp group hold different rows ({[tuple(x.tolist()[:2]) for x in every]} "
            "rows x tokens); each cp group must train the same rows (the trainers deal the plan to the data-parallel "
            "replicas: padless.integrations.trainer_context.data_parallel_place)"
        )


def context_loss(trainer: Any, ctx: ContextGroups, model: Any, inputs: dict[str, Any], num_items_in_batch: Any) -> Any:
    """This rank's loss of one micro-batch (module docstring, 4), its forward run on its shard of the
    balanced rows."""
    extra = sorted(k for k, v in inputs.items() if v is not None and k not in SPLIT_KEYS | BOUNDARY_KEYS)
    if extra:
        raise ValueError(
            f"context_parallel={ctx.cp}: the batch carries {', '.join(extra)}, which the split over ranks does "
            "not cut; context parallelism trains token rows (input_ids, labels, position_ids) only"
        )
    missing = sorted(SPLIT_KEYS - set(inputs))
    if missing:
        raise ValueError(f"context_parallel={ctx.cp}: the batch has no {', '.join(missing)}; use padless' collator")
    if num_items_in_batch is None:
        raise ValueError(
            f"context_parallel={ctx.cp} normalises the loss by the step's trained tokens over every rank; "
            "Trainer counts them only with TrainingArguments(average_tokens_across_devices=True)"
        )
    _same_rows(ctx, inputs["input_ids"])
    ids, labels, pos = _balanced(inputs, ctx.cp, ctx.layout)
    shard = split_row(
        ids, labels, pos, cp=ctx.cp, rank=ctx.cp_rank, pad_id=trainer.data_collator.pad_token_id, layout=ctx.layout
    )
    keep_context_in_checkpoints(model)  # a checkpointed layer recomputes inside the cp state of its forward
    with context_parallel(shard.document_ids, group=ctx.group, layout=ctx.layout):
        out = model(input_ids=shard.input_ids, position_ids=shard.position_ids, use_cache=False)
    num_items = num_items_in_batch / ctx.cp  # every rank of a cp group counted the same rows
    return context_parallel_loss(out.logits, shard.targets, num_items) * ctx.world


def use_padless_attention(model: Any) -> None:
    """Set ``model``'s attention to padless' (before its collator is fitted), so that the rows' collator
    sends boundaries, not ``[R, 1, L, L]`` masks a long row cannot afford; the cp backend takes over after."""
    from padless.attention.adapters import base_model_of
    from padless.attention.backend import register_padless_attention

    name = register_padless_attention()
    for target in {id(model): model, id(base_model_of(model)): base_model_of(model)}.values():
        target.set_attn_implementation(name)


def data_parallel_place(ctx: ContextGroups | None, args: Any) -> tuple[int, int]:
    """``(replicas, this rank's replica)`` the packed-row sampler deals to: the ``dp`` replicas under cp
    (every rank of a cp group trains the same rows), else every process."""
    if ctx is None:
        return int(args.world_size), int(args.process_index)
    return ctx.dp, ctx.dp_rank


def resolve_layout(
    ctx: ContextGroups, dataset: Any, sampler: Any, row_length: int, model: Any = None
) -> tuple[ContextGroups, str]:
    """:func:`choose_layout` over the documents of ``sampler``'s planned rows (rows packed beforehand:
    their ``seq_lengths``); ``model``: its token mixers are named."""
    from padless.attention.mixers import mixer_layers
    from padless.integrations.trainer_rows import is_prepacked

    if is_prepacked(dataset):
        rows = [[int(n) for n in record["seq_lengths"]] for record in itertools.islice(dataset, 64)]
    else:
        plan = sampler.schedule().plan
        rows = [plan.row(r)[2].tolist() for r in range(min(plan.num_rows, 64))]
    kinds = sorted({m.kind for m in mixer_layers(model)}) if model is not None else []
    return choose_layout(ctx, rows, row_length, ", ".join(kinds))


def context_step_loss(trainer: Any, model: Any, inputs: dict[str, Any], num_items_in_batch: Any) -> Any:
    """A trainer's ``compute_loss`` for a training step under ``context_parallel``: the layout resolved
    once (:func:`resolve_layout`, what the start line said), the guard's windows checked after the step's
    forward on the whole rows outside the cp group (:func:`padless.integrations.first_step.guarded_loss`),
    and :func:`context_loss`."""
    from padless.integrations.first_step import guarded_loss

    if trainer.padless_context.layout == "auto":
        sampler, _ = trainer._packed_rows()
        trainer.padless_context, _ = resolve_layout(
            trainer.padless_context, trainer.train_dataset, sampler, int(inputs["input_ids"].shape[1])
        )
    ctx = trainer.padless_context

    def compute(model: Any, inputs: Any, return_outputs: bool, num_items_in_batch: Any) -> Any:
        return context_loss(trainer, ctx, model, inputs, num_items_in_batch)

    return guarded_loss(trainer.padless_guard, compute, model, inputs, False, num_items_in_batch, has_logits=False)
