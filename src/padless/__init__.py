"""padless: exact, fast sequence packing for fine-tuning language models.

The public API is listed in ``__all__``. Names are resolved lazily from their modules so that
``import padless`` stays cheap (the planners need numpy only; torch loads with the collators).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # planning (numpy only)
    "plan_packs": "padless.plan",
    "PackPlan": "padless.plan",
    "PlanStats": "padless.plan",
    "STRATEGIES": "padless.plan",
    "OVERLONG_POLICIES": "padless.plan",
    "validate_lengths": "padless.plan",
    # statistics of lengths and padding
    "summarize_lengths": "padless.stats",
    "LengthSummary": "padless.stats",
    "padding_fraction_pad_to_longest": "padless.stats",
    "padding_fraction_bucketed": "padless.stats",
    "synthetic_lengths": "padless.stats",
    # layout of packed rows
    "IGNORE_INDEX": "padless.layout",
    "position_ids_from_lengths": "padless.layout",
    "cu_seqlens_from_lengths": "padless.layout",
    "document_ids_from_lengths": "padless.layout",
    "lengths_from_position_ids": "padless.layout",
    # masks
    "block_causal_mask": "padless.masks",
    "additive_block_causal_mask": "padless.masks",
    # collators and samplers
    "PaddingCollator": "padless.collate",
    "PackingCollator": "padless.collate",
    "FeatureSpec": "padless.collate",
    "LengthGroupedBatchSampler": "padless.sampling",
    "PackedRows": "padless.sampling",
    # loss
    "causal_lm_loss": "padless.loss",
    "model_loss": "padless.loss",
    "step_num_items": "padless.loss",
    "trained_tokens": "padless.loss",
    # verification
    "verify_isolation": "padless.verify",
    "VerifyReport": "padless.verify",
    "TOLERANCES": "padless.verify",
    # attention backends
    "register_padless_attention": "padless.attention",
    "resolve_backend": "padless.attention",
    "backend_inputs": "padless.attention",
    "varlen_attention": "padless.varlen",
    "reference_varlen_attention": "padless.varlen",
    "padless_attention": "padless.attention",
    "packed_documents": "padless.attention",
    "BACKENDS": "padless.attention",
    # data
    "load_tokenizer": "padless.data.tokenizer",
    "load_corpus": "padless.data.load",
    "corpus_lengths": "padless.data.load",
    "TokenizedCorpus": "padless.data.load",
    "CorpusReport": "padless.data.load",
    "CORPORA": "padless.data.corpora",
    "RecordError": "padless.data.records",
    # streaming and offline packing
    "PackedStream": "padless.stream",
    "PackedIterableDataset": "padless.stream",
    "StreamOptions": "padless.buffered",
    "compare_stream_to_offline": "padless.buffered",
    "pack_to_parquet": "padless.shards",
    "pack_dataset": "padless.integrations.datasets",
    # distributed training
    "DistributedPackedBatchSampler": "padless.distributed",
    "PackedRowView": "padless.distributed",
    "schedule_epoch": "padless.distributed",
    "world_info": "padless.distributed",
    # models
    "build_model": "padless.models",
    "load_tokenizer_for": "padless.models",
    "tokenizer_name_for": "padless.models",
    # benchmark results
    "BenchResults": "padless.bench.results",
    "load_results": "padless.bench.results",
    "write_report": "padless.bench.report",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'padless' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolve once
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - static view of the lazy exports
    from padless.attention import BACKENDS, backend_inputs, packed_documents, padless_attention, register_padless_attention, resolve_backend
    from padless.bench.report import write_report
    from padless.bench.results import BenchResults, load_results
    from padless.buffered import compare_stream_to_offline, StreamOptions
    from padless.collate import FeatureSpec, PackingCollator, PaddingCollator
    from padless.data.corpora import CORPORA
    from padless.data.load import corpus_lengths, CorpusReport, load_corpus, TokenizedCorpus
    from padless.data.records import RecordError
    from padless.data.tokenizer import load_tokenizer
    from padless.integrations.datasets import pack_dataset
    from padless.distributed import DistributedPackedBatchSampler, PackedRowView, schedule_epoch, world_info
    from padless.layout import IGNORE_INDEX, cu_seqlens_from_lengths, document_ids_from_lengths, lengths_from_position_ids, position_ids_from_lengths
    from padless.loss import causal_lm_loss, model_loss, step_num_items, trained_tokens
    from padless.masks import additive_block_causal_mask, block_causal_mask
    from padless.models import build_model, load_tokenizer_for, tokenizer_name_for
    from padless.plan import OVERLONG_POLICIES, STRATEGIES, PackPlan, plan_packs, PlanStats, validate_lengths
    from padless.sampling import LengthGroupedBatchSampler, PackedRows
    from padless.shards import pack_to_parquet
    from padless.stats import LengthSummary, padding_fraction_bucketed, padding_fraction_pad_to_longest, summarize_lengths, synthetic_lengths
    from padless.stream import PackedIterableDataset, PackedStream
    from padless.varlen import reference_varlen_attention, varlen_attention
    from padless.verify import TOLERANCES, verify_isolation, VerifyReport
