"""The benchmark behind ``padless bench`` and ``padless report``, one module per job:

- ``config``: :class:`RunConfig` (every field a flag) and the named presets; ``captions``: the vision-language
  preset's image chats, built offline.
- ``strategies``: the strategies compared (padding, bucketing, packing, flattening) as one table.
- ``steps``: which examples each optimiser step trains on, in either mode (numpy only).
- ``run``: the parent: joins ``torchrun``, measures the peak, runs every strategy, writes the results.
- ``isolate``: each strategy in its own process, with the chosen memory allocator; ``child`` is that
  process's entry point.
- ``train``: one strategy's training loop and what it measures (imported by ``run`` and ``child``).
- ``parallel``: training across ranks: the process group, the model's wrapping (DDP), the ranks'
  micro-batch counts kept in step.
- ``timing``: the step timer and CPU times; ``memory``: peak memory per phase; ``peak``: the
  machine's peak FLOP/s from timed GEMMs; ``flops``: the FLOPs a step needs and executes.
- ``measure``: the per-strategy recorder and the environment snapshot.
- ``results``: the ``results.json`` schema, saving, loading and validation; ``schema``: the generic
  check of decoded JSON against frozen dataclasses; ``figures``: the figures derived from the steps.
- ``report``: the self-contained report.html and the terminal table; ``plots``: the figures it embeds
  (matplotlib), redrawn from results.json alone.
"""
