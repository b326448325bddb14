"""Isolation: packed logits against each document run alone, judged against padding's own noise.

- ``compare``: the one comparison (each document alone vs its place in a batch) and the one judgment (padding's noise x factor, or the dtype floor).
- ``verify``: the verifier (``padless verify``): logits and gradients, plain and shared-prompt rows, any dtype or autocast, any causal LM.
- ``guard``: a training-time guard that re-checks a few documents of the step every ``every`` steps.
- ``audit``: whether a batch another library built keeps its documents isolated on the model it feeds.
"""
