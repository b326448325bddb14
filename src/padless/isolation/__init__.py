"""Isolation: packed logits against each document run alone, judged against padding's own noise.

- ``compare``: each document alone compared with its place in a batch, and the judgment of the
  difference (padding's noise x factor, or the dtype floor) that every isolation check shares.
- ``verify``: the verifier (``padless verify``): logits and gradients, plain and shared-prompt rows, any dtype or autocast, any causal LM.
- ``runs``: the verifier's runs on one backend: documents alone, padded and packed, judged as a report row.
- ``report``: the verifier's report: the model's summary, what was run, each backend's verdict.
- ``guard``: a training-time guard that re-checks a few documents of the step every ``every`` steps.
- ``audit``: whether a batch another library built keeps its documents isolated on the model it feeds.
"""
