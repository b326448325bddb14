"""Objectives: what is trained and measured on packed batches.

- ``loss``: token / sequence / weighted causal-LM loss across micro-batches and ranks, and ``trained_logits`` (the LM head on trained positions only).
- ``logprobs``: per-sequence log-probabilities read back from packed rows.
- ``dpo``: the DPO loss from the log-probs of packed preference pairs.
- ``evaluation``: per-example evaluation loss computed from packed rows.
"""
