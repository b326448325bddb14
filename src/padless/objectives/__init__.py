"""Objectives: what is trained and measured on packed batches.

- ``loss``: token / sequence / weighted causal-LM loss across micro-batches and ranks, and ``trained_logits`` (the LM head on trained positions only).
- ``logprobs``: per-sequence log-probabilities read back from packed rows.
- ``dpo``: the DPO loss from the log-probs of packed preference pairs.
- ``rollouts``: per-token log-probs (and TRL's other per-token stats) of rollout completions from packed rows, in TRL's ``(B, T)`` layout.
- ``grpo``: TRL's GRPO-family policy losses (grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo) on the ``(B, T)`` completion layout.
- ``grpo_config``: the settings of the GRPO losses (GRPOLossConfig), read from TRL's GRPOConfig.
- ``evaluation``: per-example evaluation loss computed from packed rows.
- ``context_loss``: the context-parallel loss (normalised over all ranks), its forward and step, gradients summed over the cp group.
"""
