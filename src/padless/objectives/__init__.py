"""Objectives: what is trained and measured on packed batches: losses, per-sequence log-probs, DPO, packed evaluation."""
