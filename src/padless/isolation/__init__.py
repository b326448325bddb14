"""Isolation: packed logits against each document run alone.

- ``verify``: the verifier (``padless verify``): isolation and packed-vs-padded gradients, any causal LM.
- ``guard``: a training-time guard that re-checks a few documents of the step every ``every`` steps.
- ``audit``: whether a batch another library built keeps its documents isolated on the model it feeds.
"""
