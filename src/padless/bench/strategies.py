"""The batching strategies the benchmark compares, as one table: name -> how a step's examples become
micro-batches, and which attention implementation the model runs with.

Every strategy receives the same examples for a step (``same-examples`` mode) and must train on all
of them; the loss is normalised by the step's trained tokens (:mod:`padless.objectives.loss`), so the strategies
differ in speed, not in what the step learns:

- ``padding``: micro-batches of ``batch_size`` examples in order, padded to the longest (SDPA).
- ``bucketing``: the step's examples sorted by length and split into micro-batches of similar
  lengths (:func:`bucket_partition`); in ``token-budget`` mode, length-grouped batches over the
  whole dataset (:class:`padless.batching.samplers.LengthGroupedBatchSampler`).
- ``packing``: padless. The step's examples packed into rows (one padding-free row when
  ``max_length`` is ``None``), attention by the fastest exact backend (padless varlen on CPU).
- ``flattening``: the peer, transformers' ``DataCollatorWithFlattening`` on SDPA as its users run it
  under ``Trainer`` (``use_cache=False``, so transformers detects the packed row from position ids).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any  # torch is imported where used: `padless bench --help` imports this module

Feature = Mapping[str, Any]
Batcher = Callable[[Sequence[Feature]], list[dict[str, Any]]]


@dataclass(frozen=True)
class BatchingOptions:
    """What every strategy needs to cut a step into micro-batches."""

    batch_size: int
    """Examples per micro-batch for padding and flattening; the budget unit for bucketing."""
    max_length: int | None
    """Packed row length; ``None`` packs each micro-batch's examples into one padding-free row."""
    pad_token_id: int
    """Id written into padding."""
    vocab_size: int
    """Token ids are checked against it."""
    bucket_overhead_tokens: int = 256
    """Bucketing's price of one more micro-batch, in padded tokens (a forward pass has a fixed cost)."""
    pad_to_multiple_of: int | None = None
    """Round every row length up to a multiple of this, the same way for every strategy (stable shapes
    for torch.compile)."""


@dataclass(frozen=True)
class BatchingStrategy:
    """A batching strategy of the benchmark: the model's attention implementation and a batcher factory."""

    name: str
    """The strategy's name in results and reports."""
    attn_implementation: str
    """transformers attention implementation (``padless`` is resolved per model and device by
    :func:`packing_attention`)."""
    make_batcher: Callable[[BatchingOptions, Any], Batcher]
    """``(options, model) -> batcher``: a function from a step's features to its micro-batches."""


def _chunks(items: Sequence[Feature], size: int) -> list[Sequence[Feature]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _padding_collator(opts: BatchingOptions) -> Any:
    from padless.batching.collate import FeatureSpec, PaddingCollator

    return PaddingCollator(
        pad_token_id=opts.pad_token_id,
        pad_to_multiple_of=opts.pad_to_multiple_of,
        features=FeatureSpec(vocab_size=opts.vocab_size),
    )


def _padding(opts: BatchingOptions, model: Any) -> Batcher:
    collate = _padding_collator(opts)
    return lambda feats: [collate(c) for c in _chunks(feats, opts.batch_size)]


def bucket_partition(lengths: Sequence[int], overhead_tokens: int) -> list[list[int]]:
    """Split examples into length-sorted micro-batches minimising padded tokens plus a fixed cost of
    ``overhead_tokens`` per micro-batch (a forward pass is not free): the exact optimum
    (:func:`padless.planning.partition.optimal_length_partition`). Returns index lists, shortest
    micro-batch first."""
    import numpy as np

    from padless.planning.partition import optimal_length_partition

    groups = optimal_length_partition(np.asarray(lengths, dtype=np.int64), lambda n, m: overhead_tokens + n * m)
    return [g.tolist() for g in groups]


def _bucketing(opts: BatchingOptions, model: Any) -> Batcher:
    collate = _padding_collator(opts)

    def batcher(feats: Sequence[Feature]) -> list[dict[str, Any]]:
        lengths = [len(f["input_ids"]) for f in feats]
        groups = bucket_partition(lengths, overhead_tokens=opts.bucket_overhead_tokens)
        return [collate([feats[i] for i in g]) for g in groups]

    return batcher


def _packing(opts: BatchingOptions, model: Any) -> Batcher:
    from padless.batching.collate import PackingCollator

    collate = PackingCollator.for_model(
        model, max_length=opts.max_length, pad_token_id=opts.pad_token_id, pad_to_multiple_of=opts.pad_to_multiple_of
    )
    return lambda feats: [collate(c) for c in _chunks(feats, opts.batch_size)]


def _flattening(opts: BatchingOptions, model: Any) -> Batcher:
    from transformers import DataCollatorWithFlattening

    collate = DataCollatorWithFlattening()

    def batcher(feats: Sequence[Feature]) -> list[dict[str, Any]]:
        plain = [{"input_ids": list(f["input_ids"]), "labels": list(f["labels"])} for f in feats]
        rows = [collate(c) for c in _chunks(plain, opts.batch_size)]
        return [{**_round_row(r, opts.pad_to_multiple_of, opts.pad_token_id), "use_cache": False} for r in rows]

    return batcher


def _round_row(batch: dict[str, Any], multiple: int | None, pad_token_id: int) -> dict[str, Any]:
    """A flattened ``[1, T]`` row padded at the end to a multiple of ``multiple``: the pad restarts
    its positions at 0, so transformers reads it as a document of its own, and is never trained."""
    import torch

    from padless.layout import IGNORE_INDEX

    width = batch["input_ids"].shape[1]
    extra = -width % multiple if multiple else 0
    if not extra:
        return batch
    fill = {"input_ids": torch.full((1, extra), pad_token_id), "labels": torch.full((1, extra), IGNORE_INDEX),
            "position_ids": torch.arange(extra)[None]}  # fmt: skip
    return {k: torch.cat([v, fill[k].to(v.dtype)], dim=1) if k in fill else v for k, v in batch.items()}


def packing_attention(model_name: str, device: Any, dtype: Any) -> str:
    """The attention implementation padless packs with: the fastest backend that isolates documents
    for this model, device and dtype (:func:`padless.attention.select.resolve_backend`; padless varlen on a
    CPU, flash-attn varlen on CUDA where installed)."""
    from padless.attention.select import resolve_backend
    from padless.models.factory import model_config

    return resolve_backend(None, device=device, dtype=dtype, config=model_config(model_name))


BENCH_STRATEGIES: dict[str, BatchingStrategy] = {
    "padding": BatchingStrategy("padding", "sdpa", _padding),
    "bucketing": BatchingStrategy("bucketing", "sdpa", _bucketing),
    "packing": BatchingStrategy("packing", "padless", _packing),
    "flattening": BatchingStrategy("flattening", "sdpa", _flattening),
}
"""Benchmark strategy name -> :class:`BatchingStrategy`, in the order a run takes them."""


def parse_strategies(text: str) -> list[str]:
    """``"packing,padding"`` -> validated names (in the given order)."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [n for n in names if n not in BENCH_STRATEGIES]
    if unknown or not names:
        raise ValueError(
            f"unknown strategy {unknown[0] if unknown else text!r}; choose from {', '.join(BENCH_STRATEGIES)}"
        )
    return names
