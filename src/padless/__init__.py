"""padless: exact, fast sequence packing for fine-tuning language models.

The public face is ``__all__``: the names a user needs to pack, train, check and verify (which of the
ways to get packed rows to pick: docs/packed-rows.md). Everything else lives in its subpackage
(``padless.planning``, ``padless.attention``, ``padless.models.fsdp``...). Names are resolved lazily
from their modules so that ``import padless`` stays cheap (the planners need numpy only; torch loads
with the collators). The other 0.1.0 names (``_MOVED``) still resolve, with a ``DeprecationWarning``
that names their home.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from padless._lazy import lazy_exports

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # planning (numpy only)
    "PackPlan": "padless.planning.plan",
    "plan_packs": "padless.planning.plan",
    # batching: collators, packed rows and their samplers, streams
    "PackingCollator": "padless.batching.collate",
    "PaddingCollator": "padless.batching.collate",
    "PreferenceCollator": "padless.batching.preference",
    "RolloutCollator": "padless.batching.preference",
    "check_collator": "padless.batching.rowformat",
    "PackedRows": "padless.batching.rows",
    "PackedRowView": "padless.batching.rows",
    "DistributedPackedBatchSampler": "padless.batching.samplers",
    "LengthGroupedBatchSampler": "padless.batching.samplers",
    "PackedIterableDataset": "padless.batching.stream",
    "PackedStream": "padless.batching.stream",
    # packing whole datasets: datasets.Dataset, Parquet shards
    "pack_dataset": "padless.integrations.datasets",
    "pack_to_parquet": "padless.export.parquet",
    # data and models
    "load_corpus": "padless.data.load",
    "load_tokenizer": "padless.data.tokenizer",
    "RecordError": "padless.data.records",
    "build_model": "padless.models.factory",
    "compile_layers": "padless.models.compile",
    # attention: the padless backend, the exactness rule, a batch checked against its model
    "register_padless_attention": "padless.attention.backend",
    "check_batch": "padless.attention.accept",
    "check_exact": "padless.attention.select",
    # objectives: losses, per-sequence log-probs, DPO, GRPO, packed evaluation
    "causal_lm_loss": "padless.objectives.loss",
    "model_loss": "padless.objectives.loss",
    "step_num_items": "padless.objectives.loss",
    "sequence_logprobs": "padless.objectives.logprobs",
    "dpo_loss": "padless.objectives.dpo",
    "grpo_loss": "padless.objectives.grpo",
    "packed_eval_loss": "padless.objectives.evaluation",
    # isolation: the verifier and the training-time guard
    "verify_isolation": "padless.isolation.verify",
    "IsolationGuard": "padless.isolation.guard",
    "IsolationError": "padless.isolation.guard",
}

# 0.1.0 name that left the top level -> its home (``padless.X`` still works, with a DeprecationWarning)
_MOVED: dict[str, str] = {
    "compare_stream_to_offline": "padless.planning.buffered",
    "StreamOptions": "padless.planning.buffered",
    "LengthSummary": "padless.planning.lengths",
    "padding_fraction_bucketed": "padless.planning.lengths",
    "padding_fraction_pad_to_longest": "padless.planning.lengths",
    "summarize_lengths": "padless.planning.lengths",
    "synthetic_lengths": "padless.planning.lengths",
    "OVERLONG_POLICIES": "padless.planning.plan",
    "PlanStats": "padless.planning.plan",
    "STRATEGIES": "padless.planning.plan",
    "validate_lengths": "padless.planning.plan",
    "schedule_epoch": "padless.planning.schedule",
    "cu_seqlens_from_lengths": "padless.layout",
    "document_ids_from_lengths": "padless.layout",
    "IGNORE_INDEX": "padless.layout",
    "lengths_from_position_ids": "padless.layout",
    "position_ids_from_lengths": "padless.layout",
    "packed_documents": "padless.attention.backend",
    "padless_attention": "padless.attention.backend",
    "enable_per_document_mixers": "padless.attention.mixers",
    "disable_per_document_mixers": "padless.attention.mixers",
    "mixer_layers": "padless.attention.mixers",
    "mixer_refusal": "padless.attention.mixers",
    "MixerInfo": "padless.attention.mixers",
    "additive_block_causal_mask": "padless.attention.masks",
    "block_causal_mask": "padless.attention.masks",
    "backend_inputs": "padless.attention.select",
    "BACKENDS": "padless.attention.select",
    "resolve_backend": "padless.attention.select",
    "additive_tree_mask": "padless.attention.tree",
    "shared_prompt_refusal": "padless.attention.tree",
    "tree_attention": "padless.attention.tree",
    "reference_varlen_attention": "padless.attention.varlen",
    "varlen_attention": "padless.attention.varlen",
    "share_prompt": "padless.batching.preference",
    "FeatureSpec": "padless.batching.rowformat",
    "RowFormat": "padless.batching.rowformat",
    "world_info": "padless.batching.samplers",
    "EvalLoss": "padless.objectives.evaluation",
    "GRPOLossConfig": "padless.objectives.grpo",
    "GRPOLossResult": "padless.objectives.grpo",
    "trained_tokens": "padless.objectives.loss",
    "TOLERANCES": "padless.isolation.verify",
    "VerifyReport": "padless.isolation.verify",
    "CORPORA": "padless.data.corpora",
    "corpus_lengths": "padless.data.load",
    "CorpusReport": "padless.data.load",
    "TokenizedCorpus": "padless.data.load",
    "load_tokenizer_for": "padless.models.factory",
    "tokenizer_name_for": "padless.models.factory",
    "full_tensors": "padless.models.fsdp",
    "init_distributed": "padless.models.fsdp",
    "shard_model": "padless.models.fsdp",
    "sync_gradients": "padless.models.fsdp",
    "write_report": "padless.bench.report",
    "BenchResults": "padless.bench.results",
    "load_results": "padless.bench.results",
}

__version__: str  # read on first use, from the package metadata (padless._version)
__getattr__, __dir__, __all__ = lazy_exports(__name__, {**_EXPORTS, "__version__": "padless._version"}, moved=_MOVED)

if TYPE_CHECKING:  # pragma: no cover - _EXPORTS for static analysis (tests/test_api.py holds both equal)
    from padless.attention.accept import check_batch
    from padless.attention.backend import register_padless_attention
    from padless.attention.select import check_exact
    from padless.batching.collate import PackingCollator, PaddingCollator
    from padless.batching.preference import PreferenceCollator, RolloutCollator
    from padless.batching.rowformat import check_collator
    from padless.batching.rows import PackedRows, PackedRowView
    from padless.batching.samplers import DistributedPackedBatchSampler, LengthGroupedBatchSampler
    from padless.batching.stream import PackedIterableDataset, PackedStream
    from padless.data.load import load_corpus
    from padless.data.records import RecordError
    from padless.data.tokenizer import load_tokenizer
    from padless.export.parquet import pack_to_parquet
    from padless.integrations.datasets import pack_dataset
    from padless.isolation.guard import IsolationError, IsolationGuard
    from padless.isolation.verify import verify_isolation
    from padless.models.compile import compile_layers
    from padless.models.factory import build_model
    from padless.objectives.dpo import dpo_loss
    from padless.objectives.evaluation import packed_eval_loss
    from padless.objectives.grpo import grpo_loss
    from padless.objectives.logprobs import sequence_logprobs
    from padless.objectives.loss import causal_lm_loss, model_loss, step_num_items
    from padless.planning.plan import PackPlan, plan_packs
