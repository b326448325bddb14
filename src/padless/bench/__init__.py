"""The benchmark behind ``padless bench`` and ``padless report``.

``measure`` holds the measuring primitives (step timer, peak memory, environment snapshot),
``results`` the results.json schema and the figures derived from it, ``report`` the plots, the
self-contained report.html and the ``padless report`` command, ``run`` the training loop.
"""
