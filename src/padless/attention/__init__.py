"""Attention over packed rows: ``masks`` (dense reference and 4D masks), ``varlen`` (padless' varlen
kernels), ``backend`` (the ``"padless"`` attention function for transformers) and ``select`` (the one
rule that says whether a model + backend + layout is exact, or refuses it)."""
