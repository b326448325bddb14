"""Isolation: packed logits against each document alone; the verifier, the training-time guard and the audit of other libraries' batches."""
