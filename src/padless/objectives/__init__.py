"""Objectives: what is trained and measured on packed batches.

- ``loss``: the token / sequence / weighted causal-LM loss, normalised across micro-batches and
  ranks, and :func:`~padless.objectives.loss.trained_logits` (the LM head on trained positions only);
- ``logprobs``: per-sequence log-probs read back from packed rows (shared prompts included);
- ``dpo``: the DPO loss over those log-probs;
- ``evaluation``: evaluation loss per example from packed rows (equal to each example alone).
"""
