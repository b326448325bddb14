"""Batching: tokens -> model-ready batches. ``collate`` (padding and packing collators), ``samplers``
(length-grouped and distributed packed batch samplers), ``rows`` (packed rows as dataset items),
``stream`` (streaming packing with exact resume)."""
