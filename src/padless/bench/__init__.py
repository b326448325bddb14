"""``padless bench``: fine-tune one model with each batching strategy and measure them side by side.

- ``config``: :class:`RunConfig` and its presets.
- ``strategies``: the strategies compared (padding, bucketing, packing, flattening) as one table.
- ``steps``: which examples each optimiser step trains on.
- ``run``: the orchestrator; ``isolate`` and ``child``: each strategy in its own process.
- ``measure``: step timer, peak memory, environment snapshot; ``flops``: FLOPs per step from the config.
- ``results``: the ``results.json`` schema and derived figures; ``schema``: JSON -> frozen dataclasses.
- ``report``: plots, ``report.html`` and the terminal table, drawn from the results file alone.
"""
