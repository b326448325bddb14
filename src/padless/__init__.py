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
    # planning (numpy only): planners, plan statistics, length statistics, streaming and per-epoch schedules
    "compare_stream_to_offline": "padless.planning.buffered",
    "StreamOptions": "padless.planning.buffered",
    "LengthSummary": "padless.planning.lengths",
    "padding_fraction_bucketed": "padless.planning.lengths",
    "padding_fraction_pad_to_longest": "padless.planning.lengths",
    "summarize_lengths": "padless.planning.lengths",
    "synthetic_lengths": "padless.planning.lengths",
    "OVERLONG_POLICIES": "padless.planning.plan",
    "PackPlan": "padless.planning.plan",
    "plan_packs": "padless.planning.plan",
    "PlanStats": "padless.planning.plan",
    "STRATEGIES": "padless.planning.plan",
    "validate_lengths": "padless.planning.plan",
    "schedule_epoch": "padless.planning.schedule",
    # layout of packed rows
    "cu_seqlens_from_lengths": "padless.layout",
    "document_ids_from_lengths": "padless.layout",
    "IGNORE_INDEX": "padless.layout",
    "lengths_from_position_ids": "padless.layout",
    "position_ids_from_lengths": "padless.layout",
    # attention: masks, varlen kernels, the padless attention function, the one exactness rule, trees
    "packed_documents": "padless.attention.backend",
    "enable_per_document_mixers": "padless.attention.mixers",
    "disable_per_document_mixers": "padless.attention.mixers",
    "mixer_layers": "padless.attention.mixers",
    "mixer_refusal": "padless.attention.mixers",
    "MixerInfo": "padless.attention.mixers",
    "padless_attention": "padless.attention.backend",
    "register_padless_attention": "padless.attention.backend",
    "additive_block_causal_mask": "padless.attention.masks",
    "block_causal_mask": "padless.attention.masks",
    "backend_inputs": "padless.attention.select",
    "BACKENDS": "padless.attention.select",
    "check_batch": "padless.attention.accept",
    "check_exact": "padless.attention.select",
    "resolve_backend": "padless.attention.select",
    "additive_tree_mask": "padless.attention.tree",
    "shared_prompt_refusal": "padless.attention.tree",
    "tree_attention": "padless.attention.tree",
    "reference_varlen_attention": "padless.attention.varlen",
    "varlen_attention": "padless.attention.varlen",
    # batching: collators (padding, packing, preference, rollout), samplers, packed rows, streams
    "PackingCollator": "padless.batching.collate",
    "PaddingCollator": "padless.batching.collate",
    "PreferenceCollator": "padless.batching.preference",
    "RolloutCollator": "padless.batching.preference",
    "share_prompt": "padless.batching.preference",
    "check_collator": "padless.batching.rowformat",
    "FeatureSpec": "padless.batching.rowformat",
    "RowFormat": "padless.batching.rowformat",
    "PackedRows": "padless.batching.rows",
    "PackedRowView": "padless.batching.rows",
    "DistributedPackedBatchSampler": "padless.batching.samplers",
    "LengthGroupedBatchSampler": "padless.batching.samplers",
    "world_info": "padless.batching.samplers",
    "PackedIterableDataset": "padless.batching.stream",
    "PackedStream": "padless.batching.stream",
    # objectives: losses, per-sequence log-probs, DPO, GRPO-family losses, packed evaluation
    "dpo_loss": "padless.objectives.dpo",
    "EvalLoss": "padless.objectives.evaluation",
    "grpo_loss": "padless.objectives.grpo",
    "GRPOLossConfig": "padless.objectives.grpo",
    "GRPOLossResult": "padless.objectives.grpo",
    "packed_eval_loss": "padless.objectives.evaluation",
    "sequence_logprobs": "padless.objectives.logprobs",
    "causal_lm_loss": "padless.objectives.loss",
    "model_loss": "padless.objectives.loss",
    "step_num_items": "padless.objectives.loss",
    "trained_tokens": "padless.objectives.loss",
    # isolation: the verifier and the training-time guard
    "IsolationError": "padless.isolation.guard",
    "IsolationGuard": "padless.isolation.guard",
    "TOLERANCES": "padless.isolation.verify",
    "verify_isolation": "padless.isolation.verify",
    "VerifyReport": "padless.isolation.verify",
    # data: tokenizer, corpora, user files
    "CORPORA": "padless.data.corpora",
    "corpus_lengths": "padless.data.load",
    "CorpusReport": "padless.data.load",
    "load_corpus": "padless.data.load",
    "TokenizedCorpus": "padless.data.load",
    "RecordError": "padless.data.records",
    "load_tokenizer": "padless.data.tokenizer",
    # export: packing to Parquet shards
    "pack_to_parquet": "padless.export.parquet",
    # integrations: datasets
    "pack_dataset": "padless.integrations.datasets",
    # models: the factory, torch.compile and FSDP2 sharding
    "compile_layers": "padless.models.compile",
    "build_model": "padless.models.factory",
    "load_tokenizer_for": "padless.models.factory",
    "tokenizer_name_for": "padless.models.factory",
    "full_tensors": "padless.models.fsdp",
    "init_distributed": "padless.models.fsdp",
    "shard_model": "padless.models.fsdp",
    "sync_gradients": "padless.models.fsdp",
    # benchmark results and report
    "write_report": "padless.bench.report",
    "BenchResults": "padless.bench.results",
    "load_results": "padless.bench.results",
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


if TYPE_CHECKING:  # pragma: no cover - the same table for static analysis (tests/test_api.py holds both equal)
    from padless.planning.buffered import compare_stream_to_offline, StreamOptions
    from padless.planning.lengths import LengthSummary, padding_fraction_bucketed, padding_fraction_pad_to_longest, summarize_lengths, synthetic_lengths
    from padless.planning.plan import OVERLONG_POLICIES, PackPlan, plan_packs, PlanStats, STRATEGIES, validate_lengths
    from padless.planning.schedule import schedule_epoch
    from padless.layout import cu_seqlens_from_lengths, document_ids_from_lengths, IGNORE_INDEX, lengths_from_position_ids, position_ids_from_lengths
    from padless.attention.backend import packed_documents, padless_attention, register_padless_attention
    from padless.attention.mixers import disable_per_document_mixers, enable_per_document_mixers, mixer_layers, mixer_refusal, MixerInfo
    from padless.attention.masks import additive_block_causal_mask, block_causal_mask
    from padless.attention.accept import check_batch
    from padless.attention.select import backend_inputs, BACKENDS, check_exact, resolve_backend
    from padless.attention.tree import additive_tree_mask, shared_prompt_refusal, tree_attention
    from padless.attention.varlen import reference_varlen_attention, varlen_attention
    from padless.batching.collate import PackingCollator, PaddingCollator
    from padless.batching.preference import PreferenceCollator, RolloutCollator, share_prompt
    from padless.batching.rowformat import check_collator, FeatureSpec, RowFormat
    from padless.batching.rows import PackedRows, PackedRowView
    from padless.batching.samplers import DistributedPackedBatchSampler, LengthGroupedBatchSampler, world_info
    from padless.batching.stream import PackedIterableDataset, PackedStream
    from padless.objectives.dpo import dpo_loss
    from padless.objectives.evaluation import EvalLoss, packed_eval_loss
    from padless.objectives.grpo import grpo_loss, GRPOLossConfig, GRPOLossResult
    from padless.objectives.logprobs import sequence_logprobs
    from padless.objectives.loss import causal_lm_loss, model_loss, step_num_items, trained_tokens
    from padless.isolation.guard import IsolationError, IsolationGuard
    from padless.isolation.verify import TOLERANCES, verify_isolation, VerifyReport
    from padless.data.corpora import CORPORA
    from padless.data.load import corpus_lengths, CorpusReport, load_corpus, TokenizedCorpus
    from padless.data.records import RecordError
    from padless.data.tokenizer import load_tokenizer
    from padless.export.parquet import pack_to_parquet
    from padless.integrations.datasets import pack_dataset
    from padless.models.compile import compile_layers
    from padless.models.factory import build_model, load_tokenizer_for, tokenizer_name_for
    from padless.models.fsdp import full_tensors, init_distributed, shard_model, sync_gradients
    from padless.bench.report import write_report
    from padless.bench.results import BenchResults, load_results
