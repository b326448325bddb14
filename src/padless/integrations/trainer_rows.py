"""The packed rows a padless trainer trains: the plan's sampler and row view over the dataset, the
collator fitted to the model, the loader Trainer iterates, and what the plan did to the sequences.

Shared by :class:`padless.integrations.transformers.PackedTrainer` and padless' ``SFTTrainer``
(:mod:`padless.integrations.trl`); the first builds them from its own arguments, the second from TRL's
``SFTConfig``. Every rank plans the same rows from (lengths, seed, epoch) and trains its share
(:class:`padless.DistributedPackedBatchSampler`); a dataset packed beforehand (``seq_lengths``) keeps
its rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from padless.batching.collate import PackingCollator
from padless.batching.rows import PackedRowView
from padless.batching.samplers import DistributedPackedBatchSampler
from padless.layout import IGNORE_INDEX
from padless.planning.balance import BALANCES, check_balance, cost_a_from_config
from padless.planning.checks import OVERLONG_DEFAULT, check_choice, check_int
from padless.planning.schedule import RowKey


class EpochDataLoader(DataLoader):
    """A DataLoader that passes ``set_epoch`` (Trainer calls it every epoch) to its batch sampler."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


class PrepackedRows:
    """A dataset of rows packed beforehand (``input_ids``, ``labels``, ``seq_lengths`` per row) seen
    through row keys: key ``((i, 0, n),)`` is row ``i`` with its own documents; ``()`` is an empty row."""

    def __init__(self, dataset: Any, *, pad_token_id: int = 0) -> None:
        self.dataset = dataset
        self.pad_token_id = pad_token_id

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: RowKey) -> dict[str, np.ndarray]:
        if not key:
            return {
                "input_ids": np.array([self.pad_token_id]),
                "labels": np.array([IGNORE_INDEX]),
                "seq_lengths": np.array([1]),
            }
        if len(key) != 1 or key[0][1] != 0:
            raise ValueError(f"a pre-packed row is read whole, got the pieces {key}")
        from padless.batching.vision import ALL_VISION_KEYS

        row = self.dataset[int(key[0][0])]
        ids = np.asarray(row["input_ids"], dtype=np.int64)
        labels = row.get("labels")
        return {
            "input_ids": ids,
            "labels": ids if labels is None else np.asarray(labels, dtype=np.int64),
            "seq_lengths": np.asarray(row["seq_lengths"], dtype=np.int64),
            # a row packed with its images (padless pack, pack_dataset) keeps them, in document order
            **{k: row[k] for k in ALL_VISION_KEYS if row.get(k) is not None},
        }


def is_prepacked(dataset: Any) -> bool:
    """Whether ``dataset`` holds packed rows (a ``seq_lengths`` column or key)."""
    if hasattr(dataset, "column_names"):
        return "seq_lengths" in dataset.column_names
    return len(dataset) > 0 and isinstance(dataset[0], Mapping) and "seq_lengths" in dataset[0]


def packed_batches(
    dataset: Any,
    max_length: int,
    rows_per_batch: int,
    *,
    world_size: int,
    rank: int,
    seed: int,
    strategy: str = "best_fit_decreasing",
    overlong: str = OVERLONG_DEFAULT,
    remainder: str = "empty",
    pad_token_id: int = 0,
    balance: str = "tokens",
    cost_a: float | None = None,
    max_image_patches: int | None = None,
) -> tuple[DistributedPackedBatchSampler, Any]:
    """The batch sampler of this rank's packed rows and the view that turns its keys into rows.

    Sequences are planned into rows of ``max_length`` tokens (re-planned every epoch); a dataset packed
    beforehand keeps its rows (one per key, each at most ``max_length`` tokens). ``balance``/``cost_a``:
    what each step's deal to the ranks evens out (:func:`balance_options`). ``max_image_patches``: a
    second limit per row, the vision-encoder patches of its documents' images
    (:func:`dataset_image_patches`), so that one row does not collect every large image."""
    from padless.integrations.datasets import sequence_lengths

    lengths = sequence_lengths(dataset)
    common: dict[str, Any] = dict(num_replicas=world_size, rank=rank, seed=seed, remainder=remainder, balance=balance,
                                  cost_a=cost_a)  # fmt: skip
    if max_image_patches is not None:
        check_int(max_image_patches, "max_image_patches")
        if is_prepacked(dataset):
            raise ValueError(
                "max_image_patches plans rows; rows packed beforehand (seq_lengths) keep theirs: bound them when "
                "packing (padless.PackedRows(max_image_patches=...)) or pass the sequences unpacked"
            )
        common.update(costs=dataset_image_patches(dataset), max_cost=max_image_patches)
    if is_prepacked(dataset):
        if balance == "cost":  # the schedule sees one length per row: it would price a row as one document
            raise ValueError(
                "balance='cost' prices a row by its documents, and rows packed beforehand (seq_lengths) "
                "are dealt as one length each; pass the sequences unpacked (the trainer plans the "
                "rows), or balance='tokens'"
            )
        if lengths.size and int(lengths.max()) > max_length:
            row = int(np.argmax(lengths))
            raise ValueError(f"packed row {row} holds {int(lengths[row])} tokens, more than max_length={max_length}")
        sampler = DistributedPackedBatchSampler(lengths, max_length, rows_per_batch, max_per_row=1, **common)
        view: Any = PrepackedRows(dataset, pad_token_id=pad_token_id)
    else:
        sampler = DistributedPackedBatchSampler(
            lengths, max_length, rows_per_batch, strategy=strategy, overlong=overlong, **common
        )
        view = PackedRowView(dataset, pad_token_id=pad_token_id)
    sampler.schedule()  # plan now: an overlong sequence fails here, not at the first step
    return sampler, view


def dataset_image_patches(dataset: Any) -> np.ndarray:
    """``[n]`` int64: the vision-encoder patches of every sequence's images (0 for text), read from the
    ``image_grid_thw`` / ``video_grid_thw`` columns where a ``datasets.Dataset`` has them (no pixels read),
    else per feature (:func:`padless.batching.vision.image_patches`)."""
    from padless.batching.vision import image_patches

    columns = getattr(dataset, "column_names", None) or []
    grids = [c for c in ("image_grid_thw", "video_grid_thw") if c in columns]
    if grids:
        total = np.zeros(len(dataset), dtype=np.int64)
        for column in grids:
            for i, grid in enumerate(dataset[column]):
                if grid:
                    total[i] += int(np.asarray(grid, dtype=np.int64).reshape(-1, 3).prod(axis=1).sum())
        return total
    return np.fromiter((image_patches(dataset[i]) for i in range(len(dataset))), dtype=np.int64, count=len(dataset))


def balance_options(model: Any, balance: object, cost_a: Any) -> dict[str, Any]:
    """``balance`` and ``cost_a`` for :class:`padless.DistributedPackedBatchSampler`, checked
    (:func:`padless.planning.balance.check_balance`): ``"tokens"`` with no ``cost_a``, or ``"cost"`` with
    ``cost_a`` a number, else read once from ``model``'s config (``12 * hidden_size``:
    :func:`padless.planning.balance.cost_a_from_config`; a PEFT model's base model). ``ValueError`` names
    ``balance`` or ``cost_a``."""
    from padless.attention.adapters import base_model_of

    check_choice(balance, BALANCES, "balance")
    if balance == "cost" and cost_a is None:
        cost_a = cost_a_from_config(base_model_of(model).config)
    return {"balance": balance, "cost_a": check_balance(balance, cost_a)}


def balance_said(options: Mapping[str, Any]) -> str:
    """What the start line adds for :func:`balance_options`' ``options``: nothing for ``"tokens"`` (the
    default), else ``", ranks balanced by cost a*l + l**2 (a=768)"``; and ``", at most 1024 image patches
    per row"`` with ``max_image_patches``."""
    images = (
        f", at most {options['max_image_patches']:,} image patches per row" if options.get("max_image_patches") else ""
    )
    if options.get("balance", "tokens") == "tokens":
        return images
    return f", ranks balanced by cost a*l + l**2 (a={options['cost_a']:g}){images}"


def exact_collator(
    model: Any, max_length: int | None, *, device: Any, pad_token_id: int, dtype: Any = None, **kwargs: Any
) -> PackingCollator:
    """A :class:`padless.PackingCollator` fitted to ``model`` (:meth:`padless.PackingCollator.for_model`:
    the exactness rule asked once, its verdict held as the collator's ``verdict``, else ``ValueError`` naming
    a backend that is exact) for the device training runs on, its compute ``dtype`` (``None``: the
    model's, an FSDP2 model's ``param_dtype`` included: :func:`padless.devices.compute_target`; see
    :func:`training_dtype`) and the row length. The model may still sit on the CPU in fp32: what
    counts is where the step runs."""
    return PackingCollator.for_model(
        model, device=device, dtype=dtype, max_length=max_length, pad_token_id=pad_token_id, **kwargs
    )


def training_dtype(args: Any) -> Any:
    """The compute dtype of a Trainer step: bf16 or fp16 autocast over the weights when ``args.bf16`` or
    ``args.fp16`` is set (fp32 master weights train in the half dtype), else ``None`` (the model's)."""
    if getattr(args, "bf16", False):
        return torch.bfloat16
    if getattr(args, "fp16", False):
        return torch.float16
    return None


def pad_token_id_for(model: Any, processing_class: Any = None) -> int:
    """An id to fill row ends with (never attended to, never trained): the tokenizer's or the model's
    pad token, else its EOS, else 0."""
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    for candidate in (
        getattr(tokenizer, "pad_token_id", None),
        getattr(model.config, "pad_token_id", None),
        getattr(model.config, "eos_token_id", None),
    ):
        if isinstance(candidate, list):
            candidate = candidate[0] if candidate else None
        if isinstance(candidate, int):
            return candidate
    return 0


def loader_for(trainer: Any, view: Any, sampler: DistributedPackedBatchSampler) -> EpochDataLoader:
    """The training loader over ``sampler``'s rows with the trainer's collator and worker settings."""
    args = trainer.args
    workers = args.dataloader_num_workers
    return EpochDataLoader(
        view,
        batch_sampler=sampler,
        collate_fn=trainer.data_collator,
        num_workers=workers,
        pin_memory=args.dataloader_pin_memory,
        persistent_workers=args.dataloader_persistent_workers and workers > 0,
    )


def planned_documents_per_row(dataset: Any, sampler: DistributedPackedBatchSampler) -> float:
    """Mean documents per row of ``sampler``'s current plan, every rank's rows (a piece of a split
    sequence trains as a document and counts as one); for rows packed beforehand, their ``seq_lengths``."""
    from padless.integrations.datasets import sequence_lengths

    if is_prepacked(dataset):
        docs = sequence_lengths(dataset, "seq_lengths")
        return float(docs.mean()) if docs.size else 0.0
    plan = sampler.schedule().plan
    return plan.index.size / max(plan.num_rows, 1)


def plan_said(dataset: Any, sampler: DistributedPackedBatchSampler, max_length: int) -> tuple[str, str]:
    """What the start line says of the rows planned for ``dataset``: documents per row (every rank's rows,
    :func:`planned_documents_per_row`) and how full the rows are (real tokens over ``rows x max_length``);
    then, apart (the trainer puts it last), every sequence the plan truncated, split or dropped, never
    silent::

        ("2.5 documents per row (planned rows), rows 78.1% full",
         "; 7 of 40 sequences truncated to 32 tokens (312 tokens cut)")
    """
    from padless.integrations.datasets import sequence_lengths

    per_row = planned_documents_per_row(dataset, sampler)
    said = f"{per_row:.1f} documents per row (planned rows)"
    if is_prepacked(dataset):
        lengths = sequence_lengths(dataset)
        fill = float(lengths.sum()) / max(lengths.size * max_length, 1)
        return f"{said}, rows {100 * fill:.1f}% full", ""
    stats = sampler.schedule().plan.stats
    said += f", rows {100 * stats.efficiency:.1f}% full"
    n = stats.num_sequences
    lost = []
    if stats.truncated_sequences:
        lost.append(
            f"{stats.truncated_sequences} of {n} sequences truncated to {max_length} tokens "
            f"({stats.truncated_tokens:,} tokens cut)"
        )
    if stats.split_sequences:
        lost.append(f"{stats.split_sequences} of {n} sequences split across rows (each piece trains as a document)")
    if stats.dropped_sequences:
        lost.append(f"{stats.dropped_sequences} of {n} sequences dropped ({stats.dropped_tokens:,} tokens)")
    return said, "".join(f"; {x}" for x in lost)
