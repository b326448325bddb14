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
    "plan_packs": "padless.planning.plan",
    "PackPlan": "padless.planning.plan",
    "PlanStats": "padless.planning.plan",
    "STRATEGIES": "padless.planning.plan",
    "OVERLONG_POLICIES": "padless.planning.plan",
    "validate_lengths": "padless.planning.plan",
    # statistics of lengths and padding
    "summarize_lengths": "padless.planning.lengths",
    "LengthSummary": "padless.planning.lengths",
    "padding_fraction_pad_to_longest": "padless.planning.lengths",
    "padding_fraction_bucketed": "padless.planning.lengths",
    "synthetic_lengths": "padless.planning.lengths",
    # layout of packed rows
    "IGNORE_INDEX": "padless.layout",
    "position_ids_from_lengths": "padless.layout",
    "cu_seqlens_from_lengths": "padless.layout",
    "document_ids_from_lengths": "padless.layout",
    "lengths_from_position_ids": "padless.layout",
    # masks
    "block_causal_mask": "padless.attention.masks",
    "additive_block_causal_mask": "padless.attention.masks",
    # collators and samplers
    "PaddingCollator": "padless.batching.collate",
    "PackingCollator": "padless.batching.collate",
    "FeatureSpec": "padless.batching.collate",
    "LengthGroupedBatchSampler": "padless.batching.samplers",
    "PackedRows": "padless.batching.rows",
    "PreferenceCollator": "padless.batching.preference",
    "RolloutCollator": "padless.batching.preference",
    "share_prompt": "padless.batching.preference",
    "shared_prompt_refusal": "padless.attention.tree",
    "dpo_loss": "padless.objectives.dpo",
    "tree_attention": "padless.attention.tree",
    "additive_tree_mask": "padless.attention.tree",
    # loss
    "causal_lm_loss": "padless.objectives.loss",
    "model_loss": "padless.objectives.loss",
    "step_num_items": "padless.objectives.loss",
    "trained_tokens": "padless.objectives.loss",
    "sequence_logprobs": "padless.objectives.logprobs",
    "packed_eval_loss": "padless.objectives.evaluation",
    "IsolationGuard": "padless.isolation.guard",
    "IsolationError": "padless.isolation.guard",
    "EvalLoss": "padless.objectives.evaluation",
    # verification
    "verify_isolation": "padless.isolation.verify",
    "VerifyReport": "padless.isolation.verify",
    "TOLERANCES": "padless.isolation.verify",
    # attention backends
    "register_padless_attention": "padless.attention.backend",
    "resolve_backend": "padless.attention.select",
    "check_exact": "padless.attention.select",
    "backend_inputs": "padless.attention.select",
    "varlen_attention": "padless.attention.varlen",
    "reference_varlen_attention": "padless.attention.varlen",
    "padless_attention": "padless.attention.backend",
    "packed_documents": "padless.attention.backend",
    "BACKENDS": "padless.attention.select",
    # data
    "load_tokenizer": "padless.data.tokenizer",
    "load_corpus": "padless.data.load",
    "corpus_lengths": "padless.data.load",
    "TokenizedCorpus": "padless.data.load",
    "CorpusReport": "padless.data.load",
    "CORPORA": "padless.data.corpora",
    "RecordError": "padless.data.records",
    # streaming and offline packing
    "PackedStream": "padless.batching.stream",
    "PackedIterableDataset": "padless.batching.stream",
    "StreamOptions": "padless.planning.buffered",
    "compare_stream_to_offline": "padless.planning.buffered",
    "pack_to_parquet": "padless.export.parquet",
    "pack_dataset": "padless.integrations.datasets",
    # distributed training
    "DistributedPackedBatchSampler": "padless.batching.samplers",
    "PackedRowView": "padless.batching.rows",
    "schedule_epoch": "padless.planning.schedule",
    "world_info": "padless.batching.samplers",
    "init_distributed": "padless.models.fsdp",
    "shard_model": "padless.models.fsdp",
    "sync_gradients": "padless.models.fsdp",
    "full_tensors": "padless.models.fsdp",
    # models
    "build_model": "padless.models.factory",
    "load_tokenizer_for": "padless.models.factory",
    "tokenizer_name_for": "padless.models.factory",
    # benchmark results
    "BenchResults": "padless.bench.results",
    "load_results": "padless.bench.results",
    "write_report": "padless.bench.report",
    # torch.compile
    "compile_layers": "padless.models.compile",
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
    from padless.attention.backend import packed_documents, padless_attention, register_padless_attention
    from padless.attention.masks import additive_block_causal_mask, block_causal_mask
    from padless.attention.select import backend_inputs, BACKENDS, check_exact, resolve_backend
    from padless.attention.varlen import reference_varlen_attention, varlen_attention
    from padless.batching.collate import FeatureSpec, PackingCollator, PaddingCollator
    from padless.batching.preference import PreferenceCollator, RolloutCollator, share_prompt
    from padless.attention.tree import additive_tree_mask, shared_prompt_refusal, tree_attention
    from padless.objectives.dpo import dpo_loss
    from padless.batching.rows import PackedRows, PackedRowView
    from padless.batching.samplers import DistributedPackedBatchSampler, LengthGroupedBatchSampler, world_info
    from padless.batching.stream import PackedIterableDataset, PackedStream
    from padless.bench.report import write_report
    from padless.bench.results import BenchResults, load_results
    from padless.models.compile import compile_layers
    from padless.models.fsdp import full_tensors, init_distributed, shard_model, sync_gradients
    from padless.data.corpora import CORPORA
    from padless.data.load import corpus_lengths, CorpusReport, load_corpus, TokenizedCorpus
    from padless.data.records import RecordError
    from padless.data.tokenizer import load_tokenizer
    from padless.export.parquet import pack_to_parquet
    from padless.layout import cu_seqlens_from_lengths, document_ids_from_lengths, IGNORE_INDEX, lengths_from_position_ids, position_ids_from_lengths
    from padless.objectives.evaluation import EvalLoss, packed_eval_loss
    from padless.isolation.guard import IsolationError, IsolationGuard
    from padless.objectives.logprobs import sequence_logprobs
    from padless.integrations.datasets import pack_dataset
    from padless.objectives.loss import causal_lm_loss, model_loss, step_num_items, trained_tokens
    from padless.models.factory import build_model, load_tokenizer_for, tokenizer_name_for
    from padless.planning.buffered import compare_stream_to_offline, StreamOptions
    from padless.planning.lengths import LengthSummary, padding_fraction_bucketed, padding_fraction_pad_to_longest, summarize_lengths, synthetic_lengths
    from padless.planning.plan import OVERLONG_POLICIES, PackPlan, plan_packs, PlanStats, STRATEGIES, validate_lengths
    from padless.planning.schedule import schedule_epoch
    from padless.isolation.verify import TOLERANCES, verify_isolation, VerifyReport
