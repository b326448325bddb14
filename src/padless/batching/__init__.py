"""Batching: features -> model-ready batches.

- ``batch``: the batch contract every collator returns and every consumer reads (PackedBatch, Placements).
- ``rowformat``: the row format the packing collators share (RowFormat, its for_model) and FeatureSpec.
- ``collate``: :class:`PaddingCollator` and :class:`PackingCollator`.
- ``groups``: a prompt and its completions laid out in rows (independent or shared prompt), the collator base of pairs and rollouts.
- ``preference``: preference pairs (DPO) packed into rows (PreferenceCollator).
- ``rollouts``: rollout groups (GRPO) packed into rows, with TRL's rollout fields (RolloutCollator).
- ``rollout_inputs``: TRL GRPOTrainer's padded rollout tensors -> RolloutCollator group features.
- ``vision``: images travel with their documents: a vision-language batch's image inputs, packed or padded.
- ``weights``: per-token loss weights carried by the collators.
- ``samplers``: which examples (or packed rows) each micro-batch gets, on one rank or many.
- ``rows``: packed rows as dataset items, read by the pieces they hold.
- ``stream``: streaming packing with a bounded buffer and exact resume.
- ``context_shards``: a packed row split over context-parallel ranks, positions and shifted targets computed before the split.
- ``image_rows``: the image columns of rows packed beforehand (torch-free; pack_dataset, PackedRows, PackedStream, padless pack).
"""
