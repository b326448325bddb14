"""Batching: tokens -> model-ready batches.

- ``batch``: the packed batch contract (PackedBatch, Placements, forward_inputs, batch_to, device_of)
- ``rowformat``: the row format every packing collator shares (RowFormat, FeatureSpec, for_model)
- ``collate``: the padding and packing collators
- ``preference``: preference pairs (DPO) and rollout groups (GRPO), with or without a shared prompt
- ``samplers``: length-grouped and distributed packed batch samplers
- ``rows``: packed rows as dataset items (PackedRowView, PackedRows)
- ``stream``: streaming packing with exact resume
- ``weights``: per-token loss weights carried through padding and packing
"""
