"""Isolation: packed logits against each document alone, judged against padding's own noise.

- ``compare``: the one comparison (each document alone vs its place in a batch) and the one
  judgment (``NOISE_FACTOR`` x padding's noise, or the dtype's floor ``TOLERANCES``);
- ``verify``: :func:`padless.verify_isolation`, every backend, plain and shared-prompt rows, logits and
  gradients, any dtype or autocast (``padless verify``);
- ``guard``: :class:`padless.IsolationGuard`, the same check on real batches during training;
- ``audit``: the same check on a batch another library built.
"""
